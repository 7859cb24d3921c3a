"""The inference path's matmuls, with weights pre-packed for oneDNN on CPU.

On CPU, F.linear goes to the BLAS (MKL in the PyTorch wheels). oneDNN's linear over a weight reordered once
into its blocked layout (the op PyTorch's own CPU compiler uses when it freezes a model) measured 1.7-2x
faster than F.linear for every shape the engine runs, fp32 and bf16, on the 2-core AMD EPYC this project
benchmarks on. Results differ from F.linear's only in summation order (fp32 rounding).

The packed copy is made from the dense weight and must be redone after the weight changes (`repack`): the
engine does so after every in-place weight update. Where oneDNN is missing (or on CUDA) this is F.linear.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F


@functools.cache
def _packing_works(dtype: torch.dtype) -> bool:
    """The oneDNN ops exist in this build and agree with F.linear on a small case."""
    try:
        weight, x = torch.randn(8, 16).to(dtype), torch.randn(3, 16).to(dtype)
        packed = torch.ops.mkldnn._reorder_linear_weight(weight)
        out = torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
        return bool(torch.allclose(out.float(), F.linear(x, weight).float(), atol=1e-2, rtol=1e-2))
    except (AttributeError, RuntimeError, NotImplementedError):
        return False


# Below this many weight elements the oneDNN call's fixed cost (~25 us on the benchmark CPU) outweighs the
# faster kernel: a 128x384 matmul takes 8 us in F.linear at one row and the same as packed at 64 rows.
# Every matrix of SmolLM2-135M (576x576 and up) is above it; every one of the embedded 0.9M model is below.
MIN_PACKED_ELEMENTS = 2**18


def can_pack(weight: torch.Tensor) -> bool:
    return (
        weight.numel() >= MIN_PACKED_ELEMENTS
        and weight.device.type == "cpu"
        and weight.dtype in (torch.float32, torch.bfloat16)
        and torch.backends.mkldnn.is_available()
        and _packing_works(weight.dtype)
    )


class InferenceLinear:
    """y = x @ weight.T + bias for inference, over a packed copy of `weight` where that is supported."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, pack: bool = True) -> None:
        self.weight, self.bias, self.pack = weight, bias, pack
        self.packed: torch.Tensor | None = None
        self.repack()

    def repack(self) -> None:
        """Rebuild the packed copy from the current dense weight (after it was updated in place)."""
        with torch.no_grad():
            if self.pack and can_pack(self.weight):
                self.packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach())
            else:
                self.packed = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is not None and x.dtype == self.weight.dtype:
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)

    def add_to(self, residual: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """residual + x @ weight.T: on CUDA one GEMM whose epilogue adds the residual (addmm), a kernel
        fewer per call than the product and the sum (two per decoder layer); elsewhere the two."""
        if not x.is_cuda or self.bias is not None:
            return residual + self(x)
        flat = torch.addmm(
            residual.reshape(-1, residual.shape[-1]), x.reshape(-1, x.shape[-1]), self.weight.t()
        )
        return flat.view(residual.shape)

"""A Llama/Qwen2-family decoder whose parameter names match Hugging Face checkpoints.

RMSNorm, rotary embeddings (the config's theta, HF's rotate-half layout), grouped-query attention, SwiGLU,
optional QKV bias and optional tied embeddings. Two entry points:

* `forward(input_ids)` — plain causal forward over right-padded rows (training, log-prob recomputation);
* `forward_cached(input_ids, batch)` — the engine's path: each row continues its own sequence where
  `batch` (attention.CachedBatch, built once per forward by the engine's runner) says, reading and writing
  K/V in its blocks of a paged cache or its slot of a slot cache (attention.py). With Q > 1 this is
  prefill, resume or multi-token verification; with Q == 1 it is a decode step; with a MixedBatch, a
  decode step with admissions riding in it (several parts packed into one row of tokens).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from reference_trainer.model.attention import CachedBatch, MixedBatch, write_and_attend
from reference_trainer.model.config import ModelConfig
from reference_trainer.model.packed import InferenceLinear


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_cuda:  # one fused kernel (fp32 inside, the weight applied before the one rounding)
            return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
        # HF's order (normalise in fp32, cast back, then scale); F.rms_norm's fp32 result is bit-identical to
        # x * rsqrt(mean(x^2) + eps) and one fused op instead of six.
        return self.weight * F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps).to(x.dtype)


def rope_inv_freq(config: ModelConfig) -> torch.Tensor:
    """Inverse frequencies, with Llama-3 style scaling when the config asks for it."""
    dim = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    scaling = config.rope_scaling or {}
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind in (None, "default"):
        return inv_freq.float()
    if kind == "linear":
        return (inv_freq / scaling["factor"]).float()
    if kind == "llama3":
        factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
        old_len = scaling["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv_freq
        smooth = (old_len / wavelen - low) / (high - low)
        scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
        mid = (wavelen <= old_len / low) & (wavelen >= old_len / high)
        return torch.where(mid, (1 - smooth) * inv_freq / factor + smooth * inv_freq, scaled).float()
    raise ValueError(f"unsupported rope_scaling type {kind!r} (supported: default, linear, llama3)")


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Apply RoPE in HF's rotate-half layout. x: [B, T, H, D]; cos and `sin`: [B, T, 1, D], where `sin`
    has its first half negated (DecoderLM._rope), so that HF's x * cos + cat(-x2, x1) * sin is
    x * cos + cat(x2, x1) * sin: bit-identical, without the negation's kernel. On CUDA the product and sum
    are one addcmul (one rounding instead of two: three kernels in all)."""
    half = x.shape[-1] // 2
    swapped = torch.cat((x[..., half:], x[..., :half]), dim=-1)
    if x.is_cuda:
        return torch.addcmul(x * cos, swapped, sin)
    return x * cos + swapped * sin


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        bias = config.attention_bias
        self.q_proj = nn.Linear(config.hidden_size, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=False)

        # Inference-only matmuls (fuse_projections): q/k/v fused into one, o_proj; None until then.
        self.qkv: InferenceLinear | None = None
        self.out: InferenceLinear | None = None

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cache: object | None = None,  # attention.PagedKVCache or SlotKVCache
        batch: CachedBatch | MixedBatch | None = None,
        residual: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The attention's output, plus `residual` where given (on the inference path on CUDA, added in the
        output projection's GEMM)."""
        bsz, seq, _ = x.shape
        heads, kv_heads, dim = self.num_heads, self.num_kv_heads, self.head_dim
        if self.qkv is None or torch.is_grad_enabled():
            q = rotate(self.q_proj(x).view(bsz, seq, heads, dim), cos, sin)
            k = rotate(self.k_proj(x).view(bsz, seq, kv_heads, dim), cos, sin)
            v = self.v_proj(x).view(bsz, seq, kv_heads, dim)
        else:  # inference: one matmul for q/k/v and one RoPE for q and k together
            qkv = self.qkv(x).view(bsz, seq, heads + 2 * kv_heads, dim)
            qk = rotate(qkv[:, :, : heads + kv_heads], cos, sin)
            q, k, v = qk[:, :, :heads], qk[:, :, heads:], qkv[:, :, heads + kv_heads :]
        if cache is None or batch is None:
            qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
            out = F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, enable_gqa=kv_heads != heads)
            out = out.transpose(1, 2).reshape(bsz, seq, heads * dim)
        else:
            out = write_and_attend(q, k, v, cache.k[self.layer_idx], cache.v[self.layer_idx], batch)
        if self.out is None or torch.is_grad_enabled():
            return self.o_proj(out) if residual is None else residual + self.o_proj(out)
        return self.out(out) if residual is None else self.out.add_to(residual, out)


class MLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)
        self.gate_up: InferenceLinear | None = None  # inference only (fuse_projections)
        self.down: InferenceLinear | None = None

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """The MLP's output, plus `residual` where given (fused as in Attention.forward)."""
        if self.gate_up is None or self.down is None or torch.is_grad_enabled():
            out = self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
            return out if residual is None else residual + out
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        hidden = F.silu(gate) * up
        return self.down(hidden) if residual is None else self.down.add_to(residual, hidden)


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.self_attn = Attention(config, layer_idx)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x, cos, sin, cache=None, batch=None):  # type: ignore[no-untyped-def]
        x = self.self_attn(self.input_layernorm(x), cos, sin, cache, batch, residual=x)
        return self.mlp(self.post_attention_layernorm(x), residual=x)


class Backbone(nn.Module):
    """HF's `model.` prefix: embeddings, layers and the final norm."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class DecoderLM(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.model = Backbone(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.register_buffer("inv_freq", rope_inv_freq(config), persistent=False)
        self.head: InferenceLinear | None = None  # inference only (fuse_projections)

    def _rope(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin of each position's angles, [B, T, 1, D], computed in fp32 (as transformers does, from
        an fp32 `inv_freq`: see `_apply`) and then cast; sin's first half negated for `rotate`."""
        freqs = positions[..., None].float() * self.inv_freq.float()
        emb = torch.cat((freqs, freqs), dim=-1)[:, :, None]  # [B, T, 1, D]
        sin = emb.sin()
        sin[..., : freqs.shape[-1]].neg_()
        return emb.cos().to(dtype), sin.to(dtype)

    def _apply(self, fn, recurse=True):  # type: ignore[no-untyped-def]
        """`.to(dtype)`, `.half()`, `.cuda()` and the like move `inv_freq` but keep it fp32 and exact: cast
        to bf16 with the weights, RoPE's angle at position 1,000 would be off by over a radian (transformers
        keeps its inv_freq fp32 for this reason)."""
        super()._apply(fn, recurse)
        if self.inv_freq.device.type != "meta" and self.inv_freq.dtype != torch.float32:
            self.inv_freq = rope_inv_freq(self.config).to(self.inv_freq.device)
        return self

    def _hidden(self, input_ids, positions, cache=None, batch=None, select=None):  # type: ignore[no-untyped-def]
        x = self.model.embed_tokens(input_ids)
        cos, sin = self._rope(positions, x.dtype)
        for layer in self.model.layers:
            x = layer(x, cos, sin, cache, batch)
        if select is not None:  # only these positions need logits: flat indices [S] -> [S, 1, H]
            x = x.reshape(-1, x.shape[-1])[select][:, None]
        return self.model.norm(x)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The LM head over final-norm hidden states."""
        return self.lm_head(hidden) if self.head is None or torch.is_grad_enabled() else self.head(hidden)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Causal forward over right-padded rows: [B, T] token ids -> [B, T, V] logits."""
        positions = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
        return self.logits(self._hidden(input_ids, positions))

    def forward_cached(
        self, input_ids: torch.Tensor, batch: CachedBatch | MixedBatch, select: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Continue each row's sequence as `batch` says (attention.CachedBatch: where each row starts, its
        K/V's blocks or slot in the cache, its real tokens, how it attends; a MixedBatch: several such parts
        packed into one row of tokens): [B, Q] ids -> [B, Q, V] logits. `select` (flat indices into the
        B x Q positions) limits the logits to those positions ([S, 1, V]): the ones sampled from."""
        # Sampling works on fp32 logits whatever the model's dtype (one upcast here, a no-op for fp32).
        return self.logits(self.hidden_cached(input_ids, batch, select)).float()

    def hidden_cached(
        self, input_ids: torch.Tensor, batch: CachedBatch | MixedBatch, select: torch.Tensor | None = None
    ) -> torch.Tensor:
        """`forward_cached` up to the final norm: [B, Q, H] hidden states, for `logits` to finish."""
        return self._hidden(input_ids, batch.positions, batch.cache, batch, select)

    @torch.no_grad()
    def fuse_projections(self, pack: bool = True) -> DecoderLM:
        """Set up the inference path's matmuls: q/k/v and gate/up weights become views into one fused
        matrix each, so inference runs one matmul where HF's layout has three (or two), and on CPU every
        matmul runs over a pre-packed copy (packed.py). Parameters keep their names and identity: an in-place
        update of `q_proj.weight` writes straight into the fused matrix; call `repack` after one."""
        for layer in self.model.layers:
            attn, mlp = layer.self_attn, layer.mlp
            projs = (attn.q_proj, attn.k_proj, attn.v_proj)
            attn.qkv = InferenceLinear(
                _fuse([p.weight for p in projs]),
                _fuse([p.bias for p in projs]) if attn.q_proj.bias is not None else None,
                pack,
            )
            attn.out = InferenceLinear(attn.o_proj.weight, None, pack)
            mlp.gate_up = InferenceLinear(_fuse([mlp.gate_proj.weight, mlp.up_proj.weight]), None, pack)
            mlp.down = InferenceLinear(mlp.down_proj.weight, None, pack)
        self.head = InferenceLinear(self.lm_head.weight, None, pack)
        return self

    def inference_linears(self) -> list[InferenceLinear]:
        """The inference path's matmuls in the order a decode step runs them (empty before
        fuse_projections)."""
        per_layer = (
            (layer.self_attn.qkv, layer.self_attn.out, layer.mlp.gate_up, layer.mlp.down)
            for layer in self.model.layers
        )
        return [m for m in (*(m for ms in per_layer for m in ms), self.head) if m is not None]

    def repack(self) -> None:
        """Refresh the packed copies after the weights changed in place (no-op where nothing is packed)."""
        for linear in self.inference_linears():
            linear.repack()


def _fuse(params: list[torch.Tensor]) -> torch.Tensor:
    """Concatenate parameters along dim 0 and re-point each at its slice of the result."""
    fused = torch.cat([p.data for p in params])
    offset = 0
    for p in params:
        p.data = fused[offset : offset + p.shape[0]]
        offset += p.shape[0]
    return fused

"""A Llama/Qwen2-family decoder whose parameter names match Hugging Face checkpoints.

RMSNorm, rotary embeddings (the config's theta, HF's rotate-half layout), grouped-query attention, SwiGLU,
optional QKV bias and optional tied embeddings. Two entry points:

* `forward(input_ids)` — plain causal forward over right-padded rows (training, log-prob recomputation);
* `forward_cached(input_ids, start_pos, cache, slots)` — the engine's path: each row continues its own
  sequence at `start_pos`, reading and writing K/V in the cache slot `slots[b]`. With Q > 1 this is prefill,
  resume or multi-token verification; with Q == 1 it is a decode step.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from reference_trainer.model.config import ModelConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


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
    """Apply RoPE in HF's rotate-half layout. x: [B, H, T, D]; cos/sin: [B, 1, T, D]."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class KVCache:
    """Preallocated K/V for `capacity` slots of `max_len` positions, per layer: [slot, kv_head, pos, dim]."""

    def __init__(
        self, config: ModelConfig, capacity: int, max_len: int, device: torch.device, dtype: torch.dtype
    ):
        shape = (capacity, config.num_key_value_heads, max_len, config.head_dim)
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(config.num_hidden_layers)]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(config.num_hidden_layers)]
        self.capacity = capacity
        self.max_len = max_len


class CachedBatch:
    """Per-forward indexing shared by all layers: where each row writes and what it may attend to."""

    def __init__(self, start_pos: torch.Tensor, num_new: int, slots: torch.Tensor, contiguous: bool) -> None:
        device = start_pos.device
        offsets = torch.arange(num_new, device=device)
        self.positions = start_pos[:, None] + offsets[None, :]  # [B, Q]
        self.key_len = int(self.positions.max().item()) + 1
        self.slots = slots
        # A contiguous slot range is read as a view of the cache; otherwise the rows are gathered.
        self.slot_range = (int(slots[0]), int(slots[-1]) + 1) if contiguous else None
        keys = torch.arange(self.key_len, device=device)
        self.mask = (keys[None, None, :] <= self.positions[:, :, None])[:, None]  # [B, 1, Q, K]
        self.bias = torch.zeros(self.mask.shape, device=device).masked_fill(~self.mask, float("-inf"))


SMALL_Q = 32  # up to this many queries per row (decode, verification), attention is two plain matmuls


def _cached_attention(q, keys, values, batch: CachedBatch, gqa: bool) -> torch.Tensor:  # type: ignore[no-untyped-def]
    bsz, heads, num_q, dim = q.shape
    if num_q > SMALL_Q:  # prefill: SDPA's fused kernel wins
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=batch.mask, enable_gqa=gqa)
    # Few queries per row: two small batched matmuls beat SDPA's masked kernel on CPU. With GQA, the query
    # heads sharing a KV head are folded into the query axis, so each K/V row is read once.
    group = heads // keys.shape[1]
    q = q.reshape(bsz, keys.shape[1], group * num_q, dim)
    bias = batch.bias if group == 1 else batch.bias.repeat(1, 1, group, 1)
    scores = torch.matmul(q, keys.transpose(-1, -2)) * dim**-0.5 + bias.to(q.dtype)
    return torch.matmul(torch.softmax(scores, dim=-1), values).reshape(bsz, heads, num_q, dim)


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

        self.qkv: tuple[torch.Tensor, torch.Tensor | None] | None = None

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self.qkv is None or torch.is_grad_enabled():
            return self.q_proj(x), self.k_proj(x), self.v_proj(x)
        qkv = F.linear(x, *self.qkv)
        nq, nkv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        return qkv[..., :nq], qkv[..., nq : nq + nkv], qkv[..., nq + nkv :]

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cache: KVCache | None = None,
        batch: CachedBatch | None = None,
    ) -> torch.Tensor:
        bsz, seq, _ = x.shape
        q, k, v = self.project(x)
        q = q.reshape(bsz, seq, self.num_heads, self.head_dim).transpose(1, 2)
        k = k.reshape(bsz, seq, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = v.reshape(bsz, seq, self.num_kv_heads, self.head_dim).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        gqa = self.num_kv_heads != self.num_heads
        if cache is None or batch is None:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        else:
            k_cache, v_cache = cache.k[self.layer_idx], cache.v[self.layer_idx]
            rows, pos = batch.slots[:, None], batch.positions
            k_cache[rows, :, pos] = k.transpose(1, 2).to(k_cache.dtype)
            v_cache[rows, :, pos] = v.transpose(1, 2).to(v_cache.dtype)
            if batch.slot_range is not None:
                lo, hi = batch.slot_range
                keys, values = k_cache[lo:hi, :, : batch.key_len], v_cache[lo:hi, :, : batch.key_len]
            else:
                # slice before gathering: copy only the positions attended to, not whole slots
                keys = k_cache[:, :, : batch.key_len].index_select(0, batch.slots)
                values = v_cache[:, :, : batch.key_len].index_select(0, batch.slots)
            out = _cached_attention(q, keys.to(q.dtype), values.to(q.dtype), batch, gqa)
        return self.o_proj(out.transpose(1, 2).reshape(bsz, seq, self.num_heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)
        self.gate_up: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_up is None or torch.is_grad_enabled():
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        gate, up = F.linear(x, self.gate_up).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.self_attn = Attention(config, layer_idx)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x, cos, sin, cache=None, batch=None):  # type: ignore[no-untyped-def]
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, cache, batch)
        return x + self.mlp(self.post_attention_layernorm(x))


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

    def _rope(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions[..., None].float() * self.inv_freq.float()
        emb = torch.cat((freqs, freqs), dim=-1)[:, None]  # [B, 1, T, D]
        return emb.cos().to(dtype), emb.sin().to(dtype)

    def _run(self, input_ids, positions, cache=None, batch=None, select=None):  # type: ignore[no-untyped-def]
        x = self.model.embed_tokens(input_ids)
        cos, sin = self._rope(positions, x.dtype)
        for layer in self.model.layers:
            x = layer(x, cos, sin, cache, batch)
        if select is not None:  # only these positions need logits: [B] -> [B, 1, H]
            x = x[torch.arange(x.shape[0], device=x.device), select][:, None]
        return self.lm_head(self.model.norm(x))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Causal forward over right-padded rows: [B, T] token ids -> [B, T, V] logits."""
        positions = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
        return self._run(input_ids, positions)

    def forward_cached(
        self,
        input_ids: torch.Tensor,
        start_pos: torch.Tensor,
        cache: KVCache,
        slots: torch.Tensor,
        contiguous: bool = False,
        select: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Continue each row's sequence at start_pos[b] in cache slot slots[b]: [B, Q] ids -> [B, Q, V].

        Rows shorter than Q are right-padded; their padded positions write K/V past the sequence's end,
        which nothing reads before it is overwritten. `select[b]` limits the logits to one position per
        row ([B, 1, V]), as prefill needs.
        """
        batch = CachedBatch(start_pos, input_ids.shape[1], slots, contiguous)
        return self._run(input_ids, batch.positions, cache, batch, select)

    @torch.no_grad()
    def fuse_projections(self) -> DecoderLM:
        """Make q/k/v and gate/up weights views into one fused matrix each, so inference runs one matmul
        where HF's layout has three (or two). Parameters keep their names and identity: an in-place update
        of `q_proj.weight` (e.g. Engine.update_weights) writes straight into the fused matrix."""
        for layer in self.model.layers:
            attn, mlp = layer.self_attn, layer.mlp
            projs = (attn.q_proj, attn.k_proj, attn.v_proj)
            attn.qkv = (
                _fuse([p.weight for p in projs]),
                _fuse([p.bias for p in projs]) if attn.q_proj.bias is not None else None,
            )
            mlp.gate_up = _fuse([mlp.gate_proj.weight, mlp.up_proj.weight])
        return self


def _fuse(params: list[torch.Tensor]) -> torch.Tensor:
    """Concatenate parameters along dim 0 and re-point each at its slice of the result."""
    fused = torch.cat([p.data for p in params])
    offset = 0
    for p in params:
        p.data = fused[offset : offset + p.shape[0]]
        offset += p.shape[0]
    return fused

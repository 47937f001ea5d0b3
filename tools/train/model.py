"""PyTorch DeepSeek-V4.1 (docs: /work/shared/docs/v4-architecture.md §2) for training small models.

Stable API (other tools import these; keep the signatures):

    V41Config                      dataclass; the architecture (same fields as make_checkpoint's PresetV41,
                                   minus Engram, plus `max_seq_len` and `dspark_target_layer_ids`).
                                   cfg.validate() applies the engine's V4.1 layout rules.
    Numerics                       dataclass of the simulation switches (bf16 rounding points, FP8
                                   activation fake quant, KV quant, weight fake quant, exact
                                   attention tiles). Numerics.engine() = what `deepinfer` computes;
                                   Numerics.train() = QAT defaults for training.
    Block(cfg, layer_id, *, ratio=None, n_routed_experts=None, n_activated_experts=None)
                                   one V4.1 layer (hc mixes, attention, MoE). ratio=None takes
                                   cfg.compress_ratios[layer_id]; ratio=0 gives a window-only block
                                   (DSpark stages). The MoE sizes default to the config's.
        Block.forward(h, pre, ctx) -> (h, ffn_pre)
                                   h: [B, T, hc, dim] stream (BF16-valued float32), pre: [B, T, hc]
                                   incoming pre-mix (previous FFN's, one-hot copy 0 before layer 0);
                                   returns the new stream and this block's FFN pre-mix (staggered mHC).
    Ctx(cfg, num, positions, window_mask=None)
                                   per-forward context: positions [T] (absolute), the compressed KV of
                                   the kv sources (filled by source layers), RoPE tables, and an optional
                                   window_mask [T, S] (bool, True = visible) overriding the causal
                                   sliding window of window-only blocks; S may exceed T when
                                   `extra_kv` [B, S-T, D] is set on the ctx (prepended keys, e.g. a
                                   DSpark ring; then mask columns 0..S-T-1 are those keys).
    V41Model(cfg)                  embed, layers, norm, head.
        forward(ids [B, T], num=None, return_hidden=False) -> logits [B, T, V] (float32)
                                   with return_hidden: (logits, hidden) where
                                   hidden["taps"] is a list (one per dspark_target_layer_ids entry, in
                                   order) of [B, T, dim] BF16 tensors = mean over hc copies of the
                                   stream before that layer runs (§2.12), hidden["x"] the collapsed
                                   pre-norm final hidden [B, T, dim], hidden["h"] the normed one.

Numerics (eval, Numerics.engine()) follow the engine's CPU forward (src/model/*_v41.cpp, src/cpu/*):
BF16 rounding after every linear / norm / mix, FP8 e4m3 per-32 ue8m0 activation fake quant before
FP8/FP4 GEMMs, window KV FP8 (block 32, after RoPE), compressed KV FP4 e2m1 block 16 with E4M3 scales,
FP32 ratio-2 compressor, FP32 gate and head, BF16 attention probabilities before P.V.
Training simplification: every compressed entry a query can see is attended (index_topk and
candidate_topk_blocks * candidate_block_size >= max_seq_len), so the indexer does not change the
output and is not run here (its weights are exported from their init). See tools/train/README.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, asdict

import torch
import torch.nn as nn
import torch.nn.functional as F

# --------------------------------------------------------------------------------------------------
# Config


@dataclass
class V41Config:
    vocab_size: int = 4096
    dim: int = 256
    compress_ratios: tuple = (0, 0, 2, 2, 2, 2, 1, 1, 1, 1)
    kv_source_layers: tuple = (2, 4, 6)
    index_source_layers: tuple = (2, 4, 6, 8)
    candidate_source_layer: int = 6
    candidate_topk_blocks: int = 32
    candidate_block_size: int = 8
    n_heads: int = 4
    head_dim: int = 128
    q_lora_rank: int = 128
    o_groups: int = 2
    o_lora_rank: int = 64
    moe_inter_dim: int = 256
    n_routed_experts: int = 8
    n_activated_experts: int = 2
    window_size: int = 64
    index_n_heads: int = 4
    index_head_dim: int = 128
    index_topk: int = 256
    gate_temp: float = 1.0
    norm_topk_prob: bool = True
    n_shared_experts: int = 1
    rope_head_dim: int = 64
    route_scale: float = 1.5
    swiglu_limit: float = 10.0
    rope_theta: float = 10000.0
    compress_rope_theta: float = 160000.0
    rope_factor: float = 16.0
    original_seq_len: int = 65536
    beta_fast: int = 32
    beta_slow: int = 1
    hc_mult: int = 4
    hc_sinkhorn_iters: int = 20
    hc_eps: float = 1e-6
    norm_eps: float = 1e-20
    max_seq_len: int = 256          # training context; selection is exact up to this length
    dspark_target_layer_ids: tuple = ()
    engram_pad_id: int = 2

    @property
    def n_layers(self) -> int:
        return len(self.compress_ratios)

    def kv_source_of(self, l: int) -> int:
        c = [s for s in self.kv_source_layers if s <= l]
        return max(c) if c else -1

    def index_source_of(self, l: int) -> int:
        c = [s for s in self.index_source_layers if s <= l]
        return max(c) if c else -1

    def to_dict(self) -> dict:
        d = asdict(self)
        for k, v in d.items():
            if isinstance(v, tuple):
                d[k] = list(v)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "V41Config":
        kw = {}
        for k, f in cls.__dataclass_fields__.items():
            if k in d:
                v = d[k]
                kw[k] = tuple(v) if isinstance(v, list) else v
        return cls(**kw)

    def validate(self) -> None:
        """The engine's V4.1 rules (src/io/model_config.cpp) plus this trainer's exact-selection rule."""
        def need(c, msg):
            if not c:
                raise ValueError(f"V41Config: {msg}")
        R = self.compress_ratios
        for what, v in (("dim", self.dim), ("q_lora_rank", self.q_lora_rank), ("moe_inter_dim", self.moe_inter_dim),
                        ("head_dim", self.head_dim), ("index_head_dim", self.index_head_dim),
                        ("n_heads*head_dim/o_groups", self.n_heads * self.head_dim // self.o_groups),
                        ("o_groups*o_lora_rank", self.o_groups * self.o_lora_rank)):
            need(v > 0 and v % 32 == 0, f"{what}={v} must be a positive multiple of 32")
        need(self.n_heads % self.o_groups == 0, "n_heads must be a multiple of o_groups")
        need(self.head_dim > self.rope_head_dim and self.index_head_dim >= self.rope_head_dim, "head dims")
        need(self.rope_head_dim % 2 == 0, "rope_head_dim must be even")
        need(all(r in (0, 1, 2) for r in R), "V4.1 compress ratios are 0, 1 or 2")
        need(self.n_activated_experts <= self.n_routed_experts, "top-k > experts")
        need(self.n_shared_experts == 1, "exactly one shared expert")
        for s in self.kv_source_layers:
            need(0 <= s < self.n_layers and R[s] > 0, f"kv source {s} must be a compressed layer")
            need(s in self.index_source_layers, f"kv source {s} must also be an index source")
        for s in self.index_source_layers:
            need(0 <= s < self.n_layers and R[s] > 0, f"index source {s} must be a compressed layer")
        for l, r in enumerate(R):
            if r == 0:
                continue
            ks, ix = self.kv_source_of(l), self.index_source_of(l)
            need(ks >= 0 and R[ks] == r, f"layer {l}: needs a kv source <= l of ratio {r}")
            need(ix >= ks, f"layer {l}: index source {ix} before kv source {ks}")
        c = self.candidate_source_layer
        if c >= 0:
            need(c in self.index_source_layers, "candidate source must be an index source")
            need(self.candidate_topk_blocks > 0 and self.candidate_block_size > 0, "candidate block settings")
            need(self.candidate_topk_blocks * self.candidate_block_size >= self.max_seq_len,
                 "candidate_topk_blocks * candidate_block_size must cover max_seq_len (exact selection)")
        need(self.index_topk >= self.max_seq_len, "index_topk must be >= max_seq_len (exact selection)")
        need(self.dim * (self.hc_mult) % 32 == 0, "hc*dim")
        for l in self.dspark_target_layer_ids:
            need(0 <= l < self.n_layers, f"dspark target {l} outside the model")


@dataclass
class Numerics:
    bf16: bool = True          # BF16 rounding points (straight-through in training)
    act_quant: bool = True     # FP8 e4m3 per-32 fake quant of FP8/FP4 GEMM inputs
    kv_quant: bool = True      # window KV FP8, compressed KV FP4 (E4M3 scales)
    weight_quant: bool = True  # fake-quantise weights to their checkpoint format (off for loaded weights)
    exact_attn: bool = False   # emulate the engine exactly where cheap: 64-entry attention tiles (BF16 probs vs
                               # the running max), double-accumulated norm / mHC statistics

    @staticmethod
    def engine(weights_loaded: bool = False) -> "Numerics":
        return Numerics(True, True, True, not weights_loaded, True)

    @staticmethod
    def train(qat: bool = True) -> "Numerics":
        return Numerics(qat, qat, qat, qat, False)


# --------------------------------------------------------------------------------------------------
# Numeric helpers (all straight-through when gradients flow)


def _ste(x: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    if torch.is_grad_enabled() and x.requires_grad:
        return x + (q - x).detach()
    return q


def rnd(x: torch.Tensor, num: Numerics) -> torch.Tensor:
    x = x.float()
    if not num.bf16:
        return x
    return _ste(x, x.detach().to(torch.bfloat16).float())


def ue8m0(t: torch.Tensor) -> torch.Tensor:
    """2^ceil(log2 t) by exponent bits (t > 0, float32), as deepinfer::ue8m0_scale."""
    bits = t.contiguous().view(torch.int32)
    e = ((bits >> 23) & 0xFF) - 127 + ((bits & 0x7FFFFF) != 0).to(torch.int32)
    return ((e + 127) << 23).view(torch.float32)


def round_e2m1(v: torch.Tensor) -> torch.Tensor:
    """RNE onto {0, .5, 1, 1.5, 2, 3, 4, 6} for |v| <= 6 (sign kept)."""
    a = v.abs()
    step = torch.where(a < 2, torch.full_like(a, 0.5), torch.where(a < 4, torch.ones_like(a), torch.full_like(a, 2.0)))
    return torch.copysign(torch.round(a / step) * step, v)


def _fq_fp8_raw(x: torch.Tensor, block: int) -> torch.Tensor:
    shp = x.shape
    xb = x.reshape(*shp[:-1], shp[-1] // block, block)
    amax = xb.abs().amax(-1, keepdim=True).clamp_min(1e-4)
    s = ue8m0(amax * (1.0 / 448.0))
    q = (xb / s).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).float() * s
    return q.reshape(shp)


def fq_fp8(x: torch.Tensor, block: int = 32) -> torch.Tensor:
    x = x.float()
    return _ste(x, _fq_fp8_raw(x.detach(), block))


def fq_fp4_e4m3(x: torch.Tensor, block: int = 16) -> torch.Tensor:
    """Compressed-KV fake quant: e2m1 per `block`, scale e4m3(amax/6), amax >= 6*2^-9."""
    x = x.float()
    xd = x.detach()
    shp = xd.shape
    xb = xd.reshape(*shp[:-1], shp[-1] // block, block)
    amax = xb.abs().amax(-1, keepdim=True).clamp_min(6.0 * 2.0 ** -9)
    s = (amax * (1.0 / 6.0)).to(torch.float8_e4m3fn).float()
    q = round_e2m1((xb / s).clamp(-6.0, 6.0)) * s
    return _ste(x, q.reshape(shp))


def qw_fp8(w: torch.Tensor, block: int = 32) -> torch.Tensor:
    """FP8 e4m3 weight with one ue8m0 scale per block x block tile (as tools/ckpt_format.py)."""
    wd = w.detach().float()
    o, i = wd.shape
    t = wd.reshape(o // block, block, i // block, block)
    amax = t.abs().amax(dim=(1, 3), keepdim=True)
    s = torch.exp2(torch.ceil(torch.log2(amax.double().clamp_min(2.0 ** -100) / 448.0))).float()
    q = (t / s).clamp(-448, 448).to(torch.float8_e4m3fn).float() * s
    return _ste(w.float(), q.reshape(o, i))


def qw_fp4(w: torch.Tensor, group: int = 32) -> torch.Tensor:
    """FP4 e2m1 weight with one ue8m0 scale per row per 32 inputs. w: [..., out, in]."""
    wd = w.detach().float()
    shp = wd.shape
    t = wd.reshape(*shp[:-1], shp[-1] // group, group)
    amax = t.abs().amax(-1, keepdim=True)
    s = torch.exp2(torch.ceil(torch.log2(amax.double().clamp_min(2.0 ** -100) / 6.0))).float()
    q = round_e2m1((t / s).clamp(-6, 6)) * s
    return _ste(w.float(), q.reshape(shp))


def qw_bf16(w: torch.Tensor, num: Numerics) -> torch.Tensor:
    if not num.weight_quant:
        return w.float()
    return _ste(w.float(), w.detach().to(torch.bfloat16).float())


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float, num: Numerics) -> torch.Tensor:
    x = x.float()
    if num.exact_attn:  # the engine: sum of squares in double, 1 / sqrt(float(var) + eps)
        var = x.double().square().mean(-1, keepdim=True).float()
        inv = 1.0 / torch.sqrt(var + eps)
    else:
        inv = torch.rsqrt(x.square().mean(-1, keepdim=True) + eps)
    return rnd(qw_bf16(w, num) * (x * inv), num)


def rope_freqs(rope_dim: int, base: float, factor: float, original_seq_len: int, beta_fast: float,
               beta_slow: float) -> torch.Tensor:
    """float32 [rope_dim/2], bit-identical to ops::rope_freqs (src/cpu/norm_rope.cpp)."""
    import numpy as np
    half = rope_dim // 2
    expo = (np.arange(half, dtype=np.float32) * 2) / np.float32(rope_dim)
    p = np.power(np.float64(np.float32(base)), expo.astype(np.float64)).astype(np.float32)
    f = (np.float32(1.0) / p).astype(np.float32)
    if original_seq_len > 0:
        def corr(rot):
            return rope_dim * math.log(original_seq_len / (rot * 2 * math.pi)) / (2 * math.log(base))
        low = max(math.floor(corr(beta_fast)), 0.0)
        high = min(math.ceil(corr(beta_slow)), float(rope_dim - 1))
        if low == high:
            high += 0.001
        lo, span, fac = np.float32(low), np.float32(high - low), np.float32(factor)
        ramp = np.clip((np.arange(half, dtype=np.float32) - lo) / span, np.float32(0), np.float32(1)).astype(np.float32)
        smooth = (np.float32(1) - ramp).astype(np.float32)
        a = (f / fac * (np.float32(1) - smooth)).astype(np.float32)
        b = (f * smooth).astype(np.float32)
        f = (a + b).astype(np.float32)
    return torch.from_numpy(f)


def rope_cos_sin(freqs: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [len(positions), half] float32; angle in float32, cos/sin in float64 (as the engine)."""
    ang = positions.to(torch.float32)[:, None] * freqs.to(positions.device)[None, :]
    a = ang.double()
    return torch.cos(a).float(), torch.sin(a).float()


def apply_rope(x: torch.Tensor, cs: tuple, rope_dim: int, num: Numerics, inverse: bool = False) -> torch.Tensor:
    """x [..., T, (heads,) width]: rotates the last rope_dim dims of the last axis (interleaved pairs).
    cs = (cos, sin) [T, half]; x's time axis is -2 (no heads) or -3 (with heads: pass x [.., T, H, W])."""
    cos, sin = cs
    if inverse:
        sin = -sin
    width = x.shape[-1]
    head = x[..., : width - rope_dim]
    tail = x[..., width - rope_dim:].float()
    x0, x1 = tail[..., 0::2], tail[..., 1::2]
    # broadcast cos/sin [T, half] to x's layout
    if x.dim() == 4:
        c, s = cos[:, None, :], sin[:, None, :]
    else:
        c, s = cos, sin
    y0 = x0 * c - x1 * s
    y1 = x0 * s + x1 * c
    y = torch.stack((y0, y1), dim=-1).flatten(-2)
    y = rnd(y, num)
    return torch.cat((head.float(), y), dim=-1)


# --------------------------------------------------------------------------------------------------
# Hyper-connections


def hc_mixes(h: torch.Tensor, fn: torch.Tensor, scale: torch.Tensor, base: torch.Tensor, cfg: V41Config,
             exact: bool = False):
    """h [B, T, hc, dim] -> pre [B,T,hc], post [B,T,hc], comb [B,T,hc(j),hc(k)] (FP32, Sinkhorn).
    exact: the engine's double accumulation of the statistics and the projection."""
    hc = cfg.hc_mult
    with torch.autocast(h.device.type, enabled=False):
        flat = h.float().flatten(-2)
        if exact:
            fd = flat.double()
            r = 1.0 / torch.sqrt(fd.square().mean(-1, keepdim=True).float() + cfg.norm_eps)
            mix = F.linear(fd, fn.double()).float() * r
        else:
            r = torch.rsqrt(flat.square().mean(-1, keepdim=True) + cfg.norm_eps)
            mix = F.linear(flat, fn.float()) * r
        pre = torch.sigmoid(mix[..., :hc] * scale[0] + base[:hc]) + cfg.hc_eps
        post = 2.0 * torch.sigmoid(mix[..., hc:2 * hc] * scale[1] + base[hc:2 * hc])
        c = (mix[..., 2 * hc:] * scale[2] + base[2 * hc:]).unflatten(-1, (hc, hc))
        c = torch.softmax(c, dim=-1) + cfg.hc_eps
        c = c / (c.sum(-2, keepdim=True) + cfg.hc_eps)
        for _ in range(cfg.hc_sinkhorn_iters - 1):
            c = c / (c.sum(-1, keepdim=True) + cfg.hc_eps)
            c = c / (c.sum(-2, keepdim=True) + cfg.hc_eps)
    return pre, post, c


def hc_collapse(h: torch.Tensor, pre: torch.Tensor, num: Numerics) -> torch.Tensor:
    return rnd((pre.unsqueeze(-1) * h.float()).sum(-2), num)


def hc_expand(y: torch.Tensor, h: torch.Tensor, post: torch.Tensor, comb: torch.Tensor, num: Numerics) -> torch.Tensor:
    mixed = torch.einsum("btjk,btjd->btkd", comb, h.float())
    return rnd(post.unsqueeze(-1) * y.float().unsqueeze(-2) + mixed, num)


# --------------------------------------------------------------------------------------------------
# Linears


def lin_fp8(x: torch.Tensor, w: torch.Tensor, num: Numerics) -> torch.Tensor:
    """FP8 weight GEMM: FP8 act fake quant (per 32), dequantised weight, BF16 out."""
    if num.act_quant:
        x = fq_fp8(x, 32)
    wq = qw_fp8(w) if num.weight_quant else w
    return rnd(F.linear(x, wq), num)


def lin_bf16(x: torch.Tensor, w: torch.Tensor, num: Numerics) -> torch.Tensor:
    """BF16-weight GEMM with BF16 output (no act quant)."""
    return rnd(F.linear(x.float(), qw_bf16(w, num)), num)


def lin_f32(x: torch.Tensor, w: torch.Tensor, num: Numerics) -> torch.Tensor:
    """BF16 checkpoint weight used in FP32 with an FP32 output (gate, head, ratio-2 compressor)."""
    return F.linear(x.float(), qw_bf16(w, num)).float()


def _init_linear(out_dim: int, in_dim: int, std: float | None = None) -> nn.Parameter:
    std = 1.0 / math.sqrt(in_dim) if std is None else std
    return nn.Parameter(torch.randn(out_dim, in_dim) * std)


# --------------------------------------------------------------------------------------------------
# Context shared by the layers of one forward


class Ctx:
    def __init__(self, cfg: V41Config, num: Numerics, positions: torch.Tensor, window_mask: torch.Tensor | None = None,
                 extra_kv: torch.Tensor | None = None):
        self.cfg, self.num, self.positions = cfg, num, positions
        self.window_mask = window_mask
        self.extra_kv = extra_kv
        self.compressed: dict[int, torch.Tensor] = {}  # kv source layer -> [B, n, D] entries
        self._rope: dict[tuple, tuple] = {}

    def rope(self, compressed: bool, positions: torch.Tensor | None = None, tag=None) -> tuple:
        """(cos, sin) for `positions` (default: the forward's), cached under (compressed, tag)."""
        key = (compressed, tag)
        if positions is None or key not in self._rope:
            pos = self.positions if positions is None else positions
            if key not in self._rope:
                c = self.cfg
                f = (rope_freqs(c.rope_head_dim, c.compress_rope_theta, c.rope_factor, c.original_seq_len, c.beta_fast,
                                c.beta_slow) if compressed else
                     rope_freqs(c.rope_head_dim, c.rope_theta, 1.0, 0, c.beta_fast, c.beta_slow))
                self._rope[key] = rope_cos_sin(f.to(pos.device), pos)
        return self._rope[key]


# --------------------------------------------------------------------------------------------------
# Attention


class Compressor(nn.Module):
    def __init__(self, cfg: V41Config, ratio: int):
        super().__init__()
        self.ratio = ratio
        D = cfg.head_dim
        self.wkv = _init_linear(D, cfg.dim)
        if ratio == 2:
            self.wgate = _init_linear(D, cfg.dim, 0.1 / math.sqrt(cfg.dim))
        self.norm = nn.Parameter(torch.ones(D))


class Indexer(nn.Module):
    """Weights only (the format needs them); with exact selection the indexer does not affect outputs."""
    def __init__(self, cfg: V41Config, owns_keys: bool):
        super().__init__()
        self.wq_b = _init_linear(cfg.index_n_heads * cfg.index_head_dim, cfg.q_lora_rank)
        self.weights_proj = _init_linear(cfg.index_n_heads, cfg.dim)
        if owns_keys:
            self.wk = _init_linear(cfg.index_head_dim, cfg.head_dim)
            self.k_norm = nn.Parameter(torch.ones(cfg.index_head_dim))


class Attention(nn.Module):
    def __init__(self, cfg: V41Config, layer_id: int, ratio: int):
        super().__init__()
        self.cfg, self.layer_id, self.ratio = cfg, layer_id, ratio
        d, H, D = cfg.dim, cfg.n_heads, cfg.head_dim
        n_layers = max(cfg.n_layers, 1)
        self.wq_a = _init_linear(cfg.q_lora_rank, d)
        self.q_norm = nn.Parameter(torch.ones(cfg.q_lora_rank))
        self.wq_b = _init_linear(H * D, cfg.q_lora_rank)
        self.wkv = _init_linear(D, d)
        self.kv_norm = nn.Parameter(torch.ones(D))
        self.wo_a = _init_linear(cfg.o_groups * cfg.o_lora_rank, H * D // cfg.o_groups)
        self.wo_b = _init_linear(d, cfg.o_groups * cfg.o_lora_rank,
                                 1.0 / math.sqrt(cfg.o_groups * cfg.o_lora_rank) / math.sqrt(2 * n_layers))
        self.attn_sink = nn.Parameter(torch.zeros(H))
        self.kv_source = ratio > 0 and layer_id in cfg.kv_source_layers
        self.index_source = ratio > 0 and layer_id in cfg.index_source_layers
        if self.kv_source:
            self.compressor = Compressor(cfg, ratio)
        if self.index_source:
            self.indexer = Indexer(cfg, self.kv_source)

    def _compress(self, x: torch.Tensor, ctx: Ctx) -> torch.Tensor:
        cfg, num, c = self.cfg, ctx.num, self.compressor
        B, T, _ = x.shape
        r = self.ratio
        if r == 1:
            lat = rms_norm(lin_bf16(x, c.wkv, num), c.norm, cfg.norm_eps, num)
        else:
            n = T // 2
            kv = lin_f32(x[:, : 2 * n], c.wkv, num).unflatten(1, (n, 2))
            sc = lin_f32(x[:, : 2 * n], c.wgate, num).unflatten(1, (n, 2))
            p = torch.softmax(sc, dim=2)
            pooled = kv[:, :, 0] * p[:, :, 0] + kv[:, :, 1] * p[:, :, 1]
            lat = rms_norm(rnd(pooled, num), c.norm, cfg.norm_eps, num)
        n = lat.shape[1]
        gpos = ctx.positions[0] + torch.arange(n, device=x.device) * r   # entry j stands at its group's first token
        lat = apply_rope(lat, ctx.rope(True, gpos, tag=("g", r, n)), cfg.rope_head_dim, num)
        if num.kv_quant:
            lat = fq_fp4_e4m3(lat, 16)
        return lat

    def forward(self, x: torch.Tensor, ctx: Ctx) -> torch.Tensor:
        cfg, num = self.cfg, ctx.num
        B, T, _ = x.shape
        H, D, rd, W = cfg.n_heads, cfg.head_dim, cfg.rope_head_dim, cfg.window_size
        cs = ctx.rope(self.ratio > 0)
        qr = rms_norm(lin_fp8(x, self.wq_a, num), self.q_norm, cfg.norm_eps, num)
        q = lin_fp8(qr, self.wq_b, num).unflatten(-1, (H, D))
        q = apply_rope(q, cs, rd, num)
        kv = rms_norm(lin_fp8(x, self.wkv, num), self.kv_norm, cfg.norm_eps, num)
        kv = apply_rope(kv, cs, rd, num)
        if num.kv_quant:
            kv = fq_fp8(kv, 32)

        pos = ctx.positions
        keys = [kv]
        if ctx.extra_kv is not None and self.ratio == 0:
            keys = [ctx.extra_kv.float(), kv]
        if ctx.window_mask is not None and self.ratio == 0:
            wmask = ctx.window_mask
        else:
            dlt = pos[:, None] - pos[None, :]
            wmask = (dlt >= 0) & (dlt < W)
        masks = [wmask]
        n_comp = 0
        if self.ratio > 0:
            if self.kv_source:
                ctx.compressed[self.layer_id] = self._compress(x, ctx)
            comp = ctx.compressed[cfg.kv_source_of(self.layer_id)]
            n_comp = comp.shape[1]
            keys.append(comp)
            vis = (pos[:, None] + 1) // self.ratio
            masks.append(torch.arange(n_comp, device=x.device)[None, :] < vis)
        K = torch.cat(keys, dim=1)             # [B, S, D]
        mask = torch.cat(masks, dim=1)         # [T, S]
        scale = 1.0 / math.sqrt(D)
        s = torch.einsum("bthd,bsd->bhts", q.float(), K.float()) * scale
        s = s.masked_fill(~mask, float("-inf"))
        sink = self.attn_sink.float().view(1, H, 1, 1)
        m = s.amax(-1, keepdim=True).detach()
        m = torch.maximum(m, torch.full_like(m, -1e30))
        if num.exact_attn and self.ratio >= 0 and ctx.window_mask is None:
            p_num, denom = self._tiles(s, m, mask, pos, n_comp, sink, num)
        else:
            e = torch.exp(s - m)
            denom = e.sum(-1, keepdim=True) + torch.exp(sink - m)
            p_num = rnd(e, num)
        if num.exact_attn:  # the engine accumulates P.V in double
            o = torch.einsum("bhts,bsd->bthd", p_num.double(), K.double()).float() / denom.permute(0, 2, 1, 3)
        else:
            o = torch.einsum("bhts,bsd->bthd", p_num, K.float()) / denom.permute(0, 2, 1, 3)
        o = rnd(o, num)
        o = apply_rope(o, cs, rd, num, inverse=True)         # [B, T, H, D]
        G, R = cfg.o_groups, cfg.o_lora_rank
        og = o.reshape(B, T, G, H * D // G)
        wa = (qw_fp8(self.wo_a) if num.weight_quant else self.wo_a.float()).view(G, R, H * D // G)
        z = rnd(torch.einsum("btgi,gri->btgr", og, wa), num).reshape(B, T, G * R)
        return lin_fp8(z, self.wo_b, num)

    def _tiles(self, s, m_final, mask, pos, n_comp, sink, num):
        """The engine's online softmax over its index list: window cols (positions oldest first, then
        -1) then compressed picks (ascending, then -1), tiles of 64; each probability is rounded to
        BF16 relative to the running max of the tiles so far."""
        cfg = self.cfg
        T = pos.shape[0]
        W = cfg.window_size
        wcols = min(T, W)
        S = s.shape[-1]
        lo = (pos - W + 1).clamp_min(0)                           # [T]
        col = torch.empty(T, S, dtype=torch.long, device=s.device)
        col[:, :T] = pos[None, :] - lo[:, None]                    # window key p -> list idx p - lo(t)
        if n_comp:
            col[:, T:] = wcols + torch.arange(n_comp, device=s.device)[None, :]
        tile = torch.where(mask, col // 64, torch.zeros_like(col))
        ntiles = int((wcols + n_comp + 63) // 64)
        tmax = torch.full((*s.shape[:-1], ntiles), float("-inf"), device=s.device)
        tmax = tmax.scatter_reduce(-1, tile.expand_as(s), s, reduce="amax", include_self=True)
        mrun = torch.cummax(tmax, dim=-1).values
        mj = mrun.gather(-1, tile.expand_as(s))
        e_run = torch.where(mask, torch.exp(s - mj), torch.zeros_like(s))
        p = rnd(e_run, num) * torch.exp(mj - m_final)
        p = torch.where(mask, p, torch.zeros_like(p))
        denom = torch.where(mask, torch.exp(s - m_final), torch.zeros_like(s)).sum(-1, keepdim=True) + torch.exp(sink - m_final)
        return p, denom


# --------------------------------------------------------------------------------------------------
# MoE


class Gate(nn.Module):
    def __init__(self, cfg: V41Config, n_experts: int):
        super().__init__()
        self.weight = _init_linear(n_experts, cfg.dim)
        self.register_buffer("bias", torch.zeros(n_experts))      # aux-loss-free balancing (no grad)
        self.register_buffer("bias_vl", torch.zeros(n_experts))   # image tokens only: unused here


class SharedExpert(nn.Module):
    def __init__(self, cfg: V41Config):
        super().__init__()
        d, I = cfg.dim, cfg.moe_inter_dim
        self.w1 = _init_linear(I, d)
        self.w2 = _init_linear(d, I, 1.0 / math.sqrt(I) / math.sqrt(2 * max(cfg.n_layers, 1)))
        self.w3 = _init_linear(I, d)


class MoE(nn.Module):
    def __init__(self, cfg: V41Config, n_experts: int, topk: int):
        super().__init__()
        self.cfg, self.E, self.K = cfg, n_experts, topk
        d, I = cfg.dim, cfg.moe_inter_dim
        self.gate = Gate(cfg, n_experts)
        self.w1 = nn.Parameter(torch.randn(n_experts, I, d) / math.sqrt(d))
        self.w2 = nn.Parameter(torch.randn(n_experts, d, I) / math.sqrt(I) / math.sqrt(2 * max(cfg.n_layers, 1)))
        self.w3 = nn.Parameter(torch.randn(n_experts, I, d) / math.sqrt(d))
        self.shared_experts = SharedExpert(cfg)
        self.last_counts: torch.Tensor | None = None   # tokens per expert of the last forward

    def _swiglu(self, g, u, w, num):
        L = self.cfg.swiglu_limit
        if L > 0:
            u = u.clamp(-L, L)
            g = g.clamp_max(L)
        v = F.silu(g) * u
        if w is not None:
            v = w.unsqueeze(-1) * v
        return rnd(v, num)

    def forward(self, x: torch.Tensor, num: Numerics) -> torch.Tensor:
        cfg = self.cfg
        shp = x.shape
        x = x.reshape(-1, shp[-1])
        logits = lin_f32(x, self.gate.weight, num)
        if cfg.gate_temp != 1.0:
            logits = logits / cfg.gate_temp
        s = torch.sqrt(F.softplus(logits.float()))
        idx = torch.topk(s.detach() + self.gate.bias, self.K, dim=-1).indices
        w = s.gather(-1, idx)
        if cfg.norm_topk_prob and self.K > 1:
            w = w / (w.sum(-1, keepdim=True) + 1e-20)
        w = w * cfg.route_scale
        self.last_counts = torch.bincount(idx.flatten(), minlength=self.E).detach()
        acc = torch.zeros(x.shape[0], shp[-1], device=x.device, dtype=torch.float32)
        w1 = qw_fp4(self.w1) if num.weight_quant else self.w1
        w2 = qw_fp4(self.w2) if num.weight_quant else self.w2
        w3 = qw_fp4(self.w3) if num.weight_quant else self.w3
        xq = fq_fp8(x, 32) if num.act_quant else x.float()
        for e in range(self.E):
            hit = idx == e                                 # [N, K]
            rows = hit.any(-1).nonzero(as_tuple=True)[0]
            if rows.numel() == 0:
                continue
            we = (w * hit).sum(-1).index_select(0, rows)
            xe = xq.index_select(0, rows)
            g = rnd(F.linear(xe, w1[e]), num)
            u = rnd(F.linear(xe, w3[e]), num)
            h = self._swiglu(g, u, we, num)
            if num.act_quant:
                h = fq_fp8(h, 32)
            y = rnd(F.linear(h, w2[e]), num)
            acc = acc.index_add(0, rows, y.float())
        se = self.shared_experts
        g = lin_fp8(x, se.w1, num)
        u = lin_fp8(x, se.w3, num)
        ys = lin_fp8(self._swiglu(g, u, None, num), se.w2, num)
        return rnd(acc + ys, num).reshape(shp)


# --------------------------------------------------------------------------------------------------
# Block and model


class Block(nn.Module):
    """One V4.1 layer: staggered mHC around attention and MoE (§2.3). See the module docstring."""

    def __init__(self, cfg: V41Config, layer_id: int, *, ratio: int | None = None, n_routed_experts: int | None = None,
                 n_activated_experts: int | None = None):
        super().__init__()
        self.cfg, self.layer_id = cfg, layer_id
        self.ratio = cfg.compress_ratios[layer_id] if ratio is None else ratio
        hc, d = cfg.hc_mult, cfg.dim
        mix = (2 + hc) * hc
        for sname in ("attn", "ffn"):
            self.register_parameter(f"hc_{sname}_fn", nn.Parameter(torch.randn(mix, hc * d) * (0.02 / math.sqrt(hc * d))))
            base = torch.zeros(mix)
            base[2 * hc:] = torch.eye(hc).flatten() * 4.0 - 2.0   # comb starts near the identity
            self.register_parameter(f"hc_{sname}_base", nn.Parameter(base))
            self.register_parameter(f"hc_{sname}_scale", nn.Parameter(torch.ones(3)))
        self.attn_norm = nn.Parameter(torch.ones(d))
        self.ffn_norm = nn.Parameter(torch.ones(d))
        self.attn = Attention(cfg, layer_id, self.ratio)
        self.ffn = MoE(cfg, n_routed_experts or cfg.n_routed_experts, n_activated_experts or cfg.n_activated_experts)

    def forward(self, h: torch.Tensor, pre: torch.Tensor, ctx: Ctx) -> tuple[torch.Tensor, torch.Tensor]:
        cfg, num = self.cfg, ctx.num
        a_pre, a_post, a_comb = hc_mixes(h, self.hc_attn_fn, self.hc_attn_scale, self.hc_attn_base, cfg, num.exact_attn)
        x = rms_norm(hc_collapse(h, pre, num), self.attn_norm, cfg.norm_eps, num)
        y = self.attn(x, ctx)
        h = hc_expand(y, h, a_post, a_comb, num)
        f_pre, f_post, f_comb = hc_mixes(h, self.hc_ffn_fn, self.hc_ffn_scale, self.hc_ffn_base, cfg, num.exact_attn)
        x = rms_norm(hc_collapse(h, a_pre, num), self.ffn_norm, cfg.norm_eps, num)
        y = self.ffn(x, num)
        h = hc_expand(y, h, f_post, f_comb, num)
        return h, f_pre


class V41Model(nn.Module):
    def __init__(self, cfg: V41Config):
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.dim)
        nn.init.normal_(self.embed.weight, std=1.0)
        self.layers = nn.ModuleList(Block(cfg, l) for l in range(cfg.n_layers))
        self.norm = nn.Parameter(torch.ones(cfg.dim))
        self.head = _init_linear(cfg.vocab_size, cfg.dim)
        self.num = Numerics.engine()

    def forward(self, ids: torch.Tensor, num: Numerics | None = None, return_hidden: bool = False):
        cfg = self.cfg
        num = self.num if num is None else num
        B, T = ids.shape
        hc = cfg.hc_mult
        pos = torch.arange(T, device=ids.device)
        ctx = Ctx(cfg, num, pos)
        e = F.embedding(ids, qw_bf16(self.embed.weight, num))
        h = e.unsqueeze(-2).expand(B, T, hc, cfg.dim).float()
        pre = torch.zeros(B, T, hc, device=ids.device)
        pre[..., 0] = 1.0
        taps = []
        for l, blk in enumerate(self.layers):
            if l in cfg.dspark_target_layer_ids:
                taps.append((l, h.to(torch.bfloat16).mean(-2)))
            h, pre = blk(h, pre, ctx)
        x = hc_collapse(h, pre, num)
        hn = rms_norm(x, self.norm, cfg.norm_eps, num)
        logits = lin_f32(hn, self.head, num)
        if not return_hidden:
            return logits
        order = {l: i for i, l in enumerate(cfg.dspark_target_layer_ids)}
        taps = [t for _, t in sorted(taps, key=lambda p: order[p[0]])]
        return logits, {"taps": taps, "x": x, "h": hn}

    @torch.no_grad()
    def update_gate_bias(self, rate: float) -> None:
        """Aux-loss-free balancing (DeepSeek-V3): bias_e += rate * sign(mean load - load_e)."""
        for blk in self.layers:
            c = blk.ffn.last_counts
            if c is None:
                continue
            c = c.float()
            blk.ffn.gate.bias += rate * torch.sign(c.mean() - c)


@torch.no_grad()
def perplexity(model: V41Model, ids, window: int, num: Numerics | None = None, batch: int = 16,
               device: str | torch.device = "cpu") -> tuple[float, int]:
    """(mean NLL, scored tokens) of a token list, windowed exactly as `deepinfer perplexity
    --max-tokens-per-window window`: independent windows [s, s+window) with stride = window, each
    scoring its tokens s+1 .. end-1 (the first token of every window is context only)."""
    ids = list(ids)
    spans = [(s, min(s + window, len(ids))) for s in range(0, len(ids) - 1, window)]
    spans = [(s, e) for s, e in spans if e - s >= 2]
    nll, scored = 0.0, 0
    groups: dict[int, list] = {}
    for s, e in spans:
        groups.setdefault(e - s, []).append(s)
    for n, starts in groups.items():
        for i in range(0, len(starts), batch):
            chunk = starts[i:i + batch]
            x = torch.tensor([ids[s:s + n] for s in chunk], dtype=torch.long, device=device)
            logits = model(x, num=num).double()
            lp = torch.log_softmax(logits[:, :-1], dim=-1)
            tgt = x[:, 1:]
            nll -= lp.gather(-1, tgt.unsqueeze(-1)).sum().item()
            scored += tgt.numel()
    return nll / scored, scored

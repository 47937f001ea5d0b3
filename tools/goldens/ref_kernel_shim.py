"""Plain-PyTorch stand-in for the DeepSeek-V4 reference ``inference/kernel.py``.

The DeepSeek-V4 reference model (``inference/model.py``, obtained separately into
``.ref/v4/``; see tools/goldens/README.md) imports six TileLang kernels from a module
named ``kernel``.  TileLang does not run on CPU, so the golden scripts put this file
next to a copy of the reference model under the module name ``kernel``.

Everything here is our own code, written from the kernel semantics described in
docs/v4-architecture.md §2.1, §2.3, §2.4 and §3 (and checked by reading the TileLang
kernels).  The functions keep the reference signatures:

* ``act_quant``      block FP8 e4m3 quantisation, ue8m0 (power-of-two) or plain scales.
* ``fp4_act_quant``  block FP4 e2m1 quantisation with ue8m0 scales.
* ``fp8_gemm``       FP8 x FP8 GEMM with block scales, FP32 accumulation, default-dtype out.
* ``fp4_gemm``       FP8 activation x packed FP4 weight GEMM, FP32 accumulation.
* ``sparse_attn``    index-gather attention with online softmax in tiles of 64 and a sink.
* ``hc_split_sinkhorn``  mHC coefficient split + Sinkhorn normalisation (FP32).

plus ``hadamard_transform`` (Sylvester-ordered Walsh-Hadamard times ``scale``, the
``fast_hadamard_transform`` API), which ``install_fast_hadamard_module()`` registers as
the module ``fast_hadamard_transform``.

The GEMMs dequantise both operands to FP32 and run one FP32 matmul; the kernels add
per-K-block FP32 partial sums instead.  Both are the same sum of exact products (the
scales are powers of two), only the FP32 summation order differs.
"""

from __future__ import annotations

import sys
import types
from typing import Optional

import torch

FP8_MAX = 448.0
FP4_MAX = 6.0
SPARSE_ATTN_TILE = 64  # original V4 kernel tile (a GB10 adaptation uses 16)

# e2m1 code -> value; code bit 3 is the sign (code 8 is -0).
_E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


# --------------------------------------------------------------------------- helpers

def _fp32_const(v: float, device) -> torch.Tensor:
    """A Python float rounded to FP32, as the TileLang kernels see their constants."""
    return torch.tensor(v, dtype=torch.float32, device=device)


def _pow2_ceil_bits(v: torch.Tensor) -> torch.Tensor:
    """2^ceil(log2(v)) for positive FP32 v by IEEE bit manipulation (kernel fast_log2_ceil /
    fast_pow2): exponent field - 127, plus one if the mantissa is non-zero."""
    assert v.dtype == torch.float32
    bits = v.contiguous().view(torch.int32)
    exp = (bits >> 23) & 0xFF
    man = bits & ((1 << 23) - 1)
    e = exp - 127 + (man != 0).to(torch.int32)
    return ((e + 127) << 23).to(torch.int32).view(torch.float32)


def _scale_to_fp32(s: torch.Tensor) -> torch.Tensor:
    return s.to(torch.float32)


def e2m1_round(v: torch.Tensor) -> torch.Tensor:
    """Round FP32 values (already clamped to [-6, 6]) to the e2m1 grid
    {0, .5, 1, 1.5, 2, 3, 4, 6} with ties to even (even = code with LSB 0: 0, 1, 2, 4).
    Ties: .25 -> 0, .75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4."""
    a = v.abs()
    q = torch.full_like(a, 6.0)
    q = torch.where(a <= 5.0, torch.full_like(a, 4.0), q)
    q = torch.where(a < 3.5, torch.full_like(a, 3.0), q)
    q = torch.where(a <= 2.5, torch.full_like(a, 2.0), q)
    q = torch.where(a < 1.75, torch.full_like(a, 1.5), q)
    q = torch.where(a <= 1.25, torch.full_like(a, 1.0), q)
    q = torch.where(a < 0.75, torch.full_like(a, 0.5), q)
    q = torch.where(a <= 0.25, torch.zeros_like(a), q)
    return torch.copysign(q, v)


def _e2m1_encode(q: torch.Tensor) -> torch.Tensor:
    """Exact e2m1 grid values -> 4-bit codes (uint8)."""
    mag = q.abs()
    code = torch.zeros_like(mag, dtype=torch.uint8)
    for c, val in enumerate(_E2M1_VALUES[:8]):
        code = torch.where(mag == val, torch.full_like(code, c), code)
    return code | (torch.signbit(q).to(torch.uint8) << 3)


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """[..., K/2] float4_e2m1fn_x2 / int8 / uint8 -> [..., K] FP32; low nibble = even K index."""
    b = packed.contiguous().view(torch.uint8)
    lut = torch.tensor(_E2M1_VALUES, dtype=torch.float32, device=b.device)
    lo = lut[(b & 0x0F).long()]
    hi = lut[(b >> 4).long()]
    return torch.stack([lo, hi], dim=-1).flatten(-2)


def _cached_weight(b: torch.Tensor, b_s: torch.Tensor, make) -> torch.Tensor:
    """Dequantised weight, cached on the weight tensor itself (invalidated if the weight or
    its scale is modified in place)."""
    key = (b._version, b_s._version, id(b_s), b.data_ptr())
    hit = getattr(b, "_goldens_dequant", None)
    if hit is not None and hit[0] == key:
        return hit[1]
    w = make()
    try:
        b._goldens_dequant = (key, w)
    except (AttributeError, RuntimeError):
        pass
    return w


def _expand_blocks(s: torch.Tensor, rows: int, cols: int, br: int, bc: int) -> torch.Tensor:
    """Per-tile scales [ceil(rows/br), ceil(cols/bc)] -> elementwise [rows, cols]."""
    s = _scale_to_fp32(s)
    return s.repeat_interleave(br, dim=0)[:rows].repeat_interleave(bc, dim=1)[:, :cols]


# --------------------------------------------------------------------------- quantisers

def act_quant(x: torch.Tensor, block_size: int = 128, scale_fmt: Optional[str] = None,
              scale_dtype: torch.dtype = torch.float32, inplace: bool = False):
    """Block-wise FP8 e4m3 quantisation along the last dim.

    amax = max(|x_blk|, 1e-4); s = amax * fp32(1/448), rounded up to a power of two by the
    exponent-bit trick when ``scale_fmt`` is set; q = e4m3_rne(clamp(x / s, +-448)).
    inplace: writes bf16(q * s) back into ``x`` (which may be a strided view) and returns it.
    Otherwise returns (q as float8_e4m3fn, s as ``scale_dtype``) with s shaped [..., N/block].
    """
    n = x.size(-1)
    assert n % block_size == 0
    xf = x.contiguous().float().unflatten(-1, (n // block_size, block_size))
    amax = xf.abs().amax(dim=-1).clamp_min(1e-4)
    s = amax * _fp32_const(1.0 / FP8_MAX, x.device)
    if scale_fmt is not None:
        s = _pow2_ceil_bits(s)
    y = (xf / s.unsqueeze(-1)).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    if inplace:
        deq = (y.float() * s.unsqueeze(-1)).flatten(-2).to(x.dtype)
        x.copy_(deq)
        return x
    return y.flatten(-2), s.to(scale_dtype)


def fp4_act_quant(x: torch.Tensor, block_size: int = 32, inplace: bool = False):
    """Block-wise FP4 e2m1 quantisation along the last dim with ue8m0 scales.

    amax = max(|x_blk|, 6 * 2^-126); s = pow2ceil(amax * fp32(1/6)); q = e2m1_rne(clamp(x/s, +-6)).
    inplace: writes bf16(q * s) back into ``x``. Otherwise returns (packed float4_e2m1fn_x2
    [..., N/2], low nibble = even index; scales float8_e8m0fnu [..., N/block]).
    """
    n = x.size(-1)
    assert n % block_size == 0
    xf = x.contiguous().float().unflatten(-1, (n // block_size, block_size))
    amax = xf.abs().amax(dim=-1).clamp_min(6 * 2.0 ** -126)
    s = _pow2_ceil_bits(amax * _fp32_const(1.0 / FP4_MAX, x.device))
    q = e2m1_round((xf / s.unsqueeze(-1)).clamp(-FP4_MAX, FP4_MAX))
    if inplace:
        deq = (q * s.unsqueeze(-1)).flatten(-2).to(x.dtype)
        x.copy_(deq)
        return x
    codes = _e2m1_encode(q.flatten(-2))
    packed = (codes[..., 0::2] | (codes[..., 1::2] << 4)).view(torch.float4_e2m1fn_x2)
    return packed, s.to(torch.float8_e8m0fnu)


# --------------------------------------------------------------------------- GEMMs

def fp8_gemm(a: torch.Tensor, a_s: torch.Tensor, b: torch.Tensor, b_s: torch.Tensor,
             scale_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """C[M,N] = A[M,K] @ B[N,K]^T; A per-row-per-128-K scales, B 128x128 tile scales.
    Dequantise both to FP32, one FP32 matmul, output in torch's default dtype."""
    k = a.size(-1)
    n = b.size(0)
    a2 = a.reshape(-1, k).float()
    as2 = _scale_to_fp32(a_s).reshape(a2.size(0), -1)
    a_deq = a2 * as2.repeat_interleave(128, dim=1)[:, :k]
    b_deq = _cached_weight(b, b_s, lambda: b.float() * _expand_blocks(b_s, n, k, 128, 128))
    c = a_deq @ b_deq.t()
    return c.to(torch.get_default_dtype()).reshape(*a.shape[:-1], n)


def fp4_gemm(a: torch.Tensor, a_s: torch.Tensor, b: torch.Tensor, b_s: torch.Tensor,
             scale_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """C[M,N] = A_fp8[M,K] @ B_fp4[N,K]^T; A per-128-K scales, B per-32-K e8m0 scales,
    B packed [N, K/2] (low nibble = even K). FP32 math, output in the default dtype."""
    k = a.size(-1)
    n = b.size(0)
    a2 = a.reshape(-1, k).float()
    as2 = _scale_to_fp32(a_s).reshape(a2.size(0), -1)
    a_deq = a2 * as2.repeat_interleave(128, dim=1)[:, :k]
    b_deq = _cached_weight(b, b_s, lambda: unpack_fp4(b)[:, :k]
                           * _scale_to_fp32(b_s).repeat_interleave(32, dim=1)[:, :k])
    c = a_deq @ b_deq.t()
    return c.to(torch.get_default_dtype()).reshape(*a.shape[:-1], n)


# --------------------------------------------------------------------------- attention

def sparse_attn(q: torch.Tensor, kv: torch.Tensor, attn_sink: torch.Tensor,
                topk_idxs: torch.Tensor, softmax_scale: float) -> torch.Tensor:
    """Index-gather attention, one shared K=V row per index (docs §2.4).

    q [b,m,h,d] bf16, kv [b,n,d] bf16, attn_sink [h] fp32, topk_idxs [b,m,topk] int (-1 =
    empty). Per query and head: online softmax over the index list in tiles of 64; the score
    is (q.k) * scale in FP32; index -1 -> score -inf and a zero KV row; running max starts at
    -inf; per tile m_new = max(m, tile max), P = exp(s - m_new) (FP32) joins the denominator,
    P is cast to BF16 before P.V (FP32 accumulation), earlier tiles are rescaled by
    exp(m_old - m_new); after the last tile the denominator gets exp(sink_h - m).
    Output BF16.
    """
    b, m, h, d = q.shape
    topk = topk_idxs.size(-1)
    tile = SPARSE_ATTN_TILE
    qf = q.float()                                     # [b,m,h,d]
    kvf = kv.float()                                   # [b,n,d]
    idx_all = topk_idxs.long()
    m_run = torch.full((b, m, h), float("-inf"), dtype=torch.float32, device=q.device)
    l_run = torch.zeros((b, m, h), dtype=torch.float32, device=q.device)
    acc = torch.zeros((b, m, h, d), dtype=torch.float32, device=q.device)
    batch_ix = torch.arange(b, device=q.device).view(b, 1, 1)
    scale = _fp32_const(softmax_scale, q.device)
    for t0 in range(0, topk, tile):
        idx = idx_all[..., t0:t0 + tile]               # [b,m,T]
        valid = idx != -1
        rows = kvf[batch_ix, idx.clamp_min(0)]         # [b,m,T,d]
        rows = torch.where(valid.unsqueeze(-1), rows, torch.zeros_like(rows))
        s = torch.einsum("bmhd,bmtd->bmht", qf, rows) * scale
        s = torch.where(valid.unsqueeze(2), s, torch.full_like(s, float("-inf")))
        m_prev = m_run
        m_run = torch.maximum(m_prev, s.amax(dim=-1))
        corr = torch.exp(m_prev - m_run)
        p = torch.exp(s - m_run.unsqueeze(-1))
        l_run = l_run * corr + p.sum(dim=-1)
        pv = torch.einsum("bmht,bmtd->bmhd", p.to(torch.bfloat16).float(), rows)
        acc = acc * corr.unsqueeze(-1) + pv
    l_run = l_run + torch.exp(attn_sink.float().view(1, 1, h) - m_run)
    return (acc / l_run.unsqueeze(-1)).to(torch.bfloat16)


# --------------------------------------------------------------------------- mHC

def hc_split_sinkhorn(mixes: torch.Tensor, hc_scale: torch.Tensor, hc_base: torch.Tensor,
                      hc_mult: int = 4, sinkhorn_iters: int = 20, eps: float = 1e-6):
    """mixes [b,s,(2+hc)*hc] FP32 -> pre [b,s,hc], post [b,s,hc], comb [b,s,hc,hc] (docs §2.3).

    pre = sigmoid(m*scale0 + base) + eps; post = 2*sigmoid(m*scale1 + base);
    comb = row softmax (max-subtracted) + eps, column-normalise, then (iters-1) x
    (row-normalise, column-normalise), each with +eps in the denominator. All FP32.
    """
    hc = hc_mult
    mixes = mixes.float()
    sc = hc_scale.float()
    base = hc_base.float()
    eps_t = _fp32_const(eps, mixes.device)
    pre = torch.sigmoid(mixes[..., :hc] * sc[0] + base[:hc]) + eps_t
    post = 2 * torch.sigmoid(mixes[..., hc:2 * hc] * sc[1] + base[hc:2 * hc])
    comb = mixes[..., 2 * hc:] * sc[2] + base[2 * hc:]
    comb = comb.unflatten(-1, (hc, hc))
    comb = torch.exp(comb - comb.amax(dim=-1, keepdim=True))
    comb = comb / comb.sum(dim=-1, keepdim=True) + eps_t
    comb = comb / (comb.sum(dim=-2, keepdim=True) + eps_t)
    for _ in range(sinkhorn_iters - 1):
        comb = comb / (comb.sum(dim=-1, keepdim=True) + eps_t)
        comb = comb / (comb.sum(dim=-2, keepdim=True) + eps_t)
    return pre, post, comb


# --------------------------------------------------------------------------- Hadamard

def hadamard_transform(x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """``fast_hadamard_transform.hadamard_transform`` semantics: y = scale * H x along the
    last dim, H the Sylvester-ordered +-1 Walsh-Hadamard matrix (dim a power of two);
    FP32 butterflies, output in x's dtype. With scale = dim^-0.5 it is orthonormal."""
    d = x.size(-1)
    assert d & (d - 1) == 0, "hadamard_transform needs a power-of-two last dim"
    shape = x.shape
    y = x.float().reshape(-1, d)
    hlen = 1
    while hlen < d:
        y = y.view(-1, d // (2 * hlen), 2, hlen)
        a, b = y[:, :, 0, :], y[:, :, 1, :]
        y = torch.stack([a + b, a - b], dim=2)
        hlen *= 2
    y = y.reshape(shape) * _fp32_const(scale, x.device)
    return y.to(x.dtype)


def install_fast_hadamard_module() -> None:
    """Register ``hadamard_transform`` as the module ``fast_hadamard_transform``."""
    mod = types.ModuleType("fast_hadamard_transform")
    mod.hadamard_transform = hadamard_transform
    mod.__doc__ = "deepinfer tools/goldens stand-in (plain PyTorch)"
    sys.modules["fast_hadamard_transform"] = mod


__all__ = [
    "act_quant", "fp4_act_quant", "fp8_gemm", "fp4_gemm", "sparse_attn",
    "hc_split_sinkhorn", "hadamard_transform", "install_fast_hadamard_module",
    "e2m1_round", "unpack_fp4",
]

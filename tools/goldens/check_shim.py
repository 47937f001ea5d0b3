#!/usr/bin/env python3
"""Self-checks of ref_kernel_shim.py (run: python tools/goldens/check_shim.py [--device cuda]).

* e2m1 rounding: every finite BF16 value in [-6, 6] against brute-force nearest-with-ties-to-even.
* act_quant / fp4_act_quant: in-place result == dequantised (q, s) of the out-of-place call;
  strided views keep their untouched columns; scales are powers of two >= amax / qmax.
* fp8_gemm / fp4_gemm against an explicit dequantise-and-matmul in float64.
* sparse_attn against a one-shot softmax with the sink (BF16-level agreement; exact P rounding
  differs), including -1 entries, a fully empty tile and more than one tile.
* hadamard_transform against the explicit Sylvester matrix.
* hc_split_sinkhorn: rows and columns of comb sum to ~1.
Exits non-zero on failure.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ref_kernel_shim as K  # noqa: E402


def check(name, ok, detail=""):
    print(f"{'ok  ' if ok else 'FAIL'} {name} {detail}")
    return bool(ok)


def close_bf16(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Elementwise: within one BF16 rounding (2^-8 relative) plus FP32-summation slack."""
    tol = want.abs() * 2.0 ** -8 + want.abs().max() * 1e-6
    return bool(((got.double() - want).abs() <= tol).all())


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    dev = torch.device(ap.parse_args(argv).device)
    g = torch.Generator(device="cpu").manual_seed(0)
    results = []

    # e2m1 RNE, exhaustive over BF16
    vals = torch.arange(0, 65536, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).float()
    vals = vals[torch.isfinite(vals)].clamp(-6, 6)
    grid = torch.tensor([0, .5, 1, 1.5, 2, 3, 4, 6])
    dist = (vals.abs()[:, None] - grid[None]).abs()
    best = dist == dist.min(1, keepdim=True).values
    even = torch.arange(8) % 2 == 0
    idx = torch.where(best.sum(1) > 1, (best & even).float().argmax(1), best.float().argmax(1))
    want = torch.copysign(grid[idx], vals)
    results.append(check("e2m1 RNE exhaustive", torch.equal(K.e2m1_round(vals.to(dev)).cpu(), want)))

    # act_quant
    x = (torch.randn(3, 5, 256, generator=g) * torch.logspace(-6, 2, 256)).bfloat16().to(dev)
    q, s = K.act_quant(x, 128, "ue8m0", torch.float8_e8m0fnu)
    xr = x.clone()
    K.act_quant(xr, 128, "ue8m0", torch.float8_e8m0fnu, True)
    deq = (q.float() * s.float().repeat_interleave(128, -1)).bfloat16()
    sf = s.float()
    amax = x.float().unflatten(-1, (2, 128)).abs().amax(-1).clamp_min(1e-4)
    pow2 = torch.equal(torch.frexp(sf).mantissa, torch.full_like(sf, 0.5))
    results.append(check("act_quant inplace == dequant(q, s)", torch.equal(xr, deq)))
    results.append(check("act_quant scale pow2 >= amax/448", pow2 and bool((sf * 448 >= amax * (1 - 1e-7)).all())))
    kv = torch.randn(2, 7, 576, generator=g).bfloat16().to(dev)
    kv2 = kv.clone()
    K.act_quant(kv2[..., :-64], 64, "ue8m0", torch.float8_e8m0fnu, True)
    results.append(check("act_quant strided view", torch.equal(kv2[..., -64:], kv[..., -64:])
                         and not torch.equal(kv2[..., :-64], kv[..., :-64])))
    qq = torch.randn(4, 3, 128, generator=g).bfloat16().to(dev)
    q2 = qq.clone()
    K.fp4_act_quant(q2, 32, True)
    p, ps = K.fp4_act_quant(qq, 32)
    deq4 = (K.unpack_fp4(p) * ps.float().repeat_interleave(32, -1)).bfloat16()
    results.append(check("fp4_act_quant inplace == unpack(packed, s)", torch.equal(deq4, q2)))

    # GEMMs
    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        w = torch.randn(256, 384, generator=g)
        ws = torch.tensor([[2.0 ** -3, 2.0 ** -5, 2.0 ** -4], [2.0 ** -6, 2.0 ** -2, 2.0 ** -1]])
        wfull = ws.repeat_interleave(128, 0).repeat_interleave(128, 1)
        wq = (w / wfull).clamp(-448, 448).to(torch.float8_e4m3fn)
        xa = torch.randn(10, 384, generator=g).bfloat16().to(dev)
        aq, asc = K.act_quant(xa, 128, "ue8m0", torch.float8_e8m0fnu)
        c = K.fp8_gemm(aq, asc, wq.to(dev), ws.to(torch.float8_e8m0fnu).to(dev), torch.float8_e8m0fnu)
        ref = ((aq.double() * asc.double().repeat_interleave(128, -1)) @ (wq.double() * wfull.double()).t().to(dev))
        results.append(check("fp8_gemm", c.dtype == torch.bfloat16 and close_bf16(c, ref),
                             f"max|d| {(c.double() - ref).abs().max().item():.3g}"))
        w4 = torch.randn(64, 256, generator=g)
        s4 = K._pow2_ceil_bits((w4.view(64, 8, 32).abs().amax(-1) / 6).float())
        q4 = K.e2m1_round((w4.view(64, 8, 32) / s4.unsqueeze(-1)).clamp(-6, 6)).view(64, 256)
        codes = K._e2m1_encode(q4)
        packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).view(torch.float4_e2m1fn_x2)
        xb = torch.randn(5, 256, generator=g).bfloat16().to(dev)
        bq, bs = K.act_quant(xb, 128, "ue8m0", torch.float8_e8m0fnu)
        c4 = K.fp4_gemm(bq, bs, packed.to(dev), s4.to(torch.float8_e8m0fnu).to(dev), torch.float8_e8m0fnu)
        w4deq = (q4 * s4.repeat_interleave(32, 1)).double().to(dev)
        ref4 = (bq.double() * bs.double().repeat_interleave(128, -1)) @ w4deq.t()
        results.append(check("fp4_gemm", c4.dtype == torch.bfloat16 and close_bf16(c4, ref4),
                             f"max|d| {(c4.double() - ref4).abs().max().item():.3g}"))
    finally:
        torch.set_default_dtype(prev)

    # sparse attention
    b, m, h, d, n, topk = 1, 9, 3, 64, 200, 150
    q = torch.randn(b, m, h, d, generator=g).bfloat16().to(dev)
    kvv = torch.randn(b, n, d, generator=g).bfloat16().to(dev)
    sink = torch.randn(h, generator=g).to(dev)
    ix = torch.randint(0, n, (b, m, topk), generator=g)
    ix[:, :, 100:] = -1
    ix[:, 3, 5:70] = -1
    ix = ix.to(dev)
    o = K.sparse_attn(q, kvv, sink, ix.int(), d ** -0.5)
    rows = kvv.double()[0][ix[0].clamp_min(0)].unsqueeze(0)
    sc = torch.einsum("bmhd,bmtd->bmht", q.double(), rows) * d ** -0.5
    sc = torch.where((ix != -1).unsqueeze(2), sc, torch.full_like(sc, float("-inf")))
    pr = torch.cat([sc, sink.double().view(1, 1, h, 1).expand(b, m, h, 1)], -1).softmax(-1)[..., :-1]
    refo = torch.einsum("bmht,bmtd->bmhd", pr, rows)
    err = (o.double() - refo).abs().max().item()
    results.append(check("sparse_attn vs one-shot softmax", err < 1e-2, f"max|d| {err:.3g}"))

    # Hadamard
    xh = torch.randn(5, 128, generator=g).to(dev)
    H = torch.ones(1, 1)
    while H.shape[0] < 128:
        H = torch.cat([torch.cat([H, H], 1), torch.cat([H, -H], 1)], 0)
    err = (K.hadamard_transform(xh, 128 ** -0.5) - xh @ H.t().to(dev) * 128 ** -0.5).abs().max().item()
    results.append(check("hadamard_transform", err < 1e-5, f"max|d| {err:.3g}"))

    # Sinkhorn
    mix = torch.randn(2, 3, 24, generator=g).to(dev)
    pre, post, comb = K.hc_split_sinkhorn(mix, torch.rand(3, generator=g).to(dev), torch.randn(24, generator=g).to(dev))
    ok = (comb.sum(-1) - 1).abs().max().item() < 1e-3 and (comb.sum(-2) - 1).abs().max().item() < 1e-3
    results.append(check("hc_split_sinkhorn doubly stochastic", ok and pre.shape == (2, 3, 4) and post.shape == (2, 3, 4)))

    print(f"{sum(results)}/{len(results)} checks passed")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())

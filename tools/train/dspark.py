"""DSpark draft module (V4.1 design, docs/v4-architecture.md §2.12) for training on a frozen backbone.

What is here
------------
* `DSparkConfig`: the DSpark keys of the V4.1 config (§1.2); every other shape is the backbone's
  `model.V41Config` (tools/train/model.py).
* `DSparkDraft`: three `model.Block` stages built with ratio 0 (window-only, their own MoE with
  dspark_n_routed_experts / dspark_num_experts_per_tok, shared expert, staggered mHC), plus stage 0's
  `main_proj` [dim, n_taps*dim] / `main_norm` and the last stage's `norm`, Markov head
  (`markov_head.embed` / `.head` [V, r]) and `confidence_head.proj` [1, dim + r]. The LM embedding and
  head are the backbone's, frozen, held as non-persistent buffers (never exported, never trained).
  Draft attention = the Block's own attention with `Ctx.extra_kv` = the stage's main_kv
  (kv_norm(wkv(main_x)), RoPE at the backbone positions, FP8 fake quant) and `Ctx.window_mask` = the
  ring of anchor p (positions max(0, p-W+1) .. p) + the anchor's own gamma rows (bidirectional).
* `DSparkDraft.forward_train`: many anchors per sequence in parallel (one masked attention).
* `dspark_loss`: L = 0.1 CE + 0.9 TV + 1.0 Conf, row k weighted by exp(-(k-1)/gamma) (deepinfer.md §2.1),
  self-distilled from the backbone (target distribution = the backbone's softmax at p+1 .. p+gamma).
* `DSparkDraft.draft_block`: inference, Markov head applied sequentially with argmax (T = 0).
* `measure_acceptance`: greedy speculative decoding simulated with the PyTorch backbone.
* `export_dspark` / `load_dspark`: the `mtp.*` tensors (a separate safetensors file + index) and the
  dspark config keys, added to a checkpoint directory written by tools/train/export.py.

Index conventions (§2.12): the anchor is backbone position p, whose taps `main_hidden[p]` are known and
whose next token t_{p+1} was just produced by the backbone. Draft row i (0-based, i < gamma) sits at
position p+1+i, its input id is t_{p+1} for i = 0 and the noise id otherwise, and it predicts the
token at position p+2+i. So row i is compared with the backbone's distribution at position p+1+i.
The Markov head of row i takes ids[i]: t_{p+1} for i = 0, then the previous draft token d_i (at
training time, teacher forcing: the text token at p+1+i).

Numerics: the draft reuses model.py's Numerics: training under Numerics.train() (QAT, straight-through),
inference under Numerics.engine() (weights fake-quantised to their checkpoint formats, which is what
export_dspark writes, so a reloaded draft computes the same drafts).
"""

from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import asdict, dataclass, field
from typing import Callable, Sequence

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
TOOLS_DIR = os.path.dirname(HERE)
for _p in (HERE, TOOLS_DIR):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from model import (Block, Ctx, Numerics, V41Config, apply_rope, fq_fp8, hc_collapse, lin_f32,  # noqa: E402
                   lin_fp8, qw_bf16, rms_norm)

# ---------------------------------------------------------------------------------------------
# Config


@dataclass
class DSparkConfig:
    """The DSpark keys of the V4.1 config (§1.2); every other shape is the backbone's V41Config."""
    target_layer_ids: tuple = ()     # dspark_target_layer_ids (default: the backbone's last 3 layers)
    block_size: int = 5              # dspark_block_size (gamma)
    noise_token_id: int = 0          # dspark_noise_token_id
    markov_rank: int = 32            # dspark_markov_rank
    n_routed_experts: int = 0        # dspark_n_routed_experts (0: the backbone's)
    n_activated_experts: int = 0     # dspark_num_experts_per_tok (0: the backbone's)
    n_stages: int = 3                # num_nextn_predict_layers

    @property
    def n_taps(self) -> int:
        return len(self.target_layer_ids)

    def resolved(self, bcfg: V41Config) -> "DSparkConfig":
        d = asdict(self)
        if not d["target_layer_ids"]:
            d["target_layer_ids"] = tuple(bcfg.dspark_target_layer_ids) or tuple(
                range(max(0, bcfg.n_layers - 3), bcfg.n_layers))
        d["target_layer_ids"] = tuple(d["target_layer_ids"])
        d["n_routed_experts"] = d["n_routed_experts"] or bcfg.n_routed_experts
        d["n_activated_experts"] = d["n_activated_experts"] or bcfg.n_activated_experts
        return DSparkConfig(**d)

    def to_json(self) -> dict:
        d = asdict(self)
        d["target_layer_ids"] = list(self.target_layer_ids)
        return d

    @classmethod
    def from_json(cls, d: dict) -> "DSparkConfig":
        d = dict(d)
        d["target_layer_ids"] = tuple(d["target_layer_ids"])
        return cls(**d)


# ---------------------------------------------------------------------------------------------
# The draft model: three model.Block stages with ratio 0 (window-only, own MoE), attention widened to
# the ring of backbone main_kv (Ctx.extra_kv) with a custom visibility mask (Ctx.window_mask).


class DSparkDraft(nn.Module):
    def __init__(self, bcfg: V41Config, dcfg: DSparkConfig, embed_weight: torch.Tensor, head_weight: torch.Tensor):
        super().__init__()
        dcfg = dcfg.resolved(bcfg)
        assert dcfg.n_stages >= 1 and dcfg.block_size >= 1 and dcfg.n_taps >= 1
        assert 0 <= dcfg.noise_token_id < bcfg.vocab_size
        assert tuple(embed_weight.shape) == (bcfg.vocab_size, bcfg.dim) == tuple(head_weight.shape)
        self.bcfg, self.cfg = bcfg, dcfg
        d, r = bcfg.dim, dcfg.markov_rank
        self.stages = nn.ModuleList(
            Block(bcfg, bcfg.n_layers + s, ratio=0, n_routed_experts=dcfg.n_routed_experts,
                  n_activated_experts=dcfg.n_activated_experts) for s in range(dcfg.n_stages))
        # stage 0
        self.main_proj = nn.Parameter(torch.randn(d, dcfg.n_taps * d) / math.sqrt(dcfg.n_taps * d))
        self.main_norm = nn.Parameter(torch.ones(d))
        # last stage
        self.norm = nn.Parameter(torch.ones(d))
        self.markov_embed = nn.Parameter(torch.randn(bcfg.vocab_size, r))
        self.markov_head = nn.Parameter(torch.zeros(bcfg.vocab_size, r))   # bias starts at 0
        self.conf_proj = nn.Parameter(torch.zeros(1, d + r))               # sigma(c) starts at 0.5
        # the backbone's embedding and LM head (BF16 in the checkpoint): frozen, not part of the draft's state
        self.register_buffer("embed_weight", embed_weight.detach().to(torch.bfloat16).float(), persistent=False)
        self.register_buffer("head_weight", head_weight.detach().to(torch.bfloat16).float(), persistent=False)
        self.num = Numerics.engine()

    def _num(self, num):
        return self.num if num is None else num

    # -- shared pieces -------------------------------------------------------------------------

    def trunk(self, taps, first_ids, anchor_pos, num=None):
        """taps [B, S, n_taps*dim], first_ids [B, A] (t_{p+1}), anchor_pos [B, A] (p) -> pre-norm collapsed
        hidden x [B, A, G, dim] and base logits [B, A, G, V] (FP32).

        If every row has the same anchors, the rows stay a batch and the mask is [A*G, S + A*G];
        otherwise the rows are packed into one (keys of all rows, a row-aware mask)."""
        num = self._num(num)
        c, bc = self.cfg, self.bcfg
        G, W, dev = c.block_size, bc.window_size, taps.device
        B, S = taps.shape[:2]
        A = first_ids.size(1)
        main_x = rms_norm(lin_fp8(taps.float(), self.main_proj, num), self.main_norm, bc.norm_eps, num)
        ids = torch.full((B, A, G), c.noise_token_id, dtype=torch.long, device=dev)
        ids[..., 0] = first_ids
        x = qw_bf16(self.embed_weight, num)[ids]                              # [B, A, G, dim]
        shared = bool((anchor_pos == anchor_pos[:1]).all())
        if shared:
            apos = anchor_pos[0]
            key_row = torch.zeros(S, dtype=torch.long, device=dev)
            key_pos = torch.arange(S, device=dev)
            arow = torch.zeros(A, dtype=torch.long, device=dev)
            x = x.reshape(B, A * G, -1)
        else:
            apos = anchor_pos.reshape(-1)
            key_row = torch.arange(B, device=dev).repeat_interleave(S)
            key_pos = torch.arange(S, device=dev).repeat(B)
            arow = torch.arange(B, device=dev).repeat_interleave(A)
            x = x.reshape(1, B * A * G, -1)
            main_x = main_x.reshape(1, B * S, -1)
        qpos = (apos[:, None] + 1 + torch.arange(G, device=dev)).reshape(-1)     # draft row positions
        qrow, qp = arow.repeat_interleave(G), apos.repeat_interleave(G)
        ring = (qrow[:, None] == key_row[None]) & (key_pos[None] <= qp[:, None]) & (key_pos[None] > qp[:, None] - W)
        blk = torch.arange(qpos.numel(), device=dev) // G
        mask = torch.cat([ring, blk[:, None] == blk[None]], dim=1)             # [T, S_keys + T]
        kctx = Ctx(bc, num, key_pos)
        ctx = Ctx(bc, num, qpos, window_mask=mask)
        h = x.unsqueeze(-2).expand(*x.shape[:-1], bc.hc_mult, bc.dim).float()
        pre = torch.zeros(*x.shape[:-1], bc.hc_mult, device=dev)
        pre[..., 0] = 1.0
        for st in self.stages:
            a = st.attn
            kv = rms_norm(lin_fp8(main_x, a.wkv, num), a.kv_norm, bc.norm_eps, num)
            kv = apply_rope(kv, kctx.rope(False), bc.rope_head_dim, num)
            if num.kv_quant:
                kv = fq_fp8(kv, 32)
            ctx.extra_kv = kv                                                    # the ring: main_kv
            h, pre = st(h, pre, ctx)
        xo = hc_collapse(h, pre, num)
        logits = lin_f32(rms_norm(xo, self.norm, bc.norm_eps, num), self.head_weight, num)
        return xo.reshape(B, A, G, -1), logits.reshape(B, A, G, -1)

    def markov(self, ids, num=None):
        """ids [...] -> (logit bias [..., V] FP32, BF16-valued embed [..., r])."""
        num = self._num(num)
        e = qw_bf16(self.markov_embed, num)[ids]
        return lin_f32(e, self.markov_head, num), e

    def confidence(self, xo, markov_embed, num=None):
        return lin_f32(torch.cat([xo.float(), markov_embed.float()], dim=-1), self.conf_proj, self._num(num)).squeeze(-1)

    # -- training --------------------------------------------------------------------------------

    def forward_train(self, taps, tokens, anchor_pos, num=None):
        """Teacher-forced: tokens [B, S] is the text, anchor_pos [B, A] (or [A], shared) with
        p + gamma <= S - 1. Returns draft logits [B, A, G, V] (base + Markov bias) and confidence
        logits [B, A, G]."""
        G = self.cfg.block_size
        if anchor_pos.dim() == 1:
            anchor_pos = anchor_pos.unsqueeze(0).expand(tokens.size(0), -1)
        rows = anchor_pos.unsqueeze(-1) + 1 + torch.arange(G, device=tokens.device)  # p+1 .. p+G
        ids = torch.gather(tokens, 1, rows.flatten(1)).view_as(rows)  # ids[i] = text token at p+1+i
        xo, logits = self.trunk(taps, ids[..., 0], anchor_pos, num)
        bias, e = self.markov(ids, num)
        return logits + bias, self.confidence(xo, e, num)

    # -- inference (T = 0) -----------------------------------------------------------------------

    @torch.no_grad()
    def draft_block(self, taps, anchor_pos, first_ids, num=None):
        """One draft block per row: taps [B, S, n_taps*dim], anchor_pos [B] (p), first_ids [B] (t_{p+1}).
        Returns draft ids [B, G] (d_1..d_G), confidence logits [B, G], draft logits [B, G, V]."""
        G = self.cfg.block_size
        xo, logits = self.trunk(taps, first_ids[:, None], anchor_pos[:, None], num)
        xo, logits = xo[:, 0], logits[:, 0].clone()
        out = torch.empty(first_ids.size(0), G + 1, dtype=torch.long, device=first_ids.device)
        out[:, 0] = first_ids
        embeds = []
        for i in range(G):
            bias, e = self.markov(out[:, i], num)
            logits[:, i] += bias
            embeds.append(e)
            out[:, i + 1] = logits[:, i].argmax(-1)
        conf = self.confidence(xo, torch.stack(embeds, dim=1), num)
        return out[:, 1:], conf, logits

    @torch.no_grad()
    def update_moe_bias(self, rate: float = 1e-3):
        """Aux-loss-free balancing of the stages' MoE (as V41Model.update_gate_bias)."""
        for st in self.stages:
            cnt = st.ffn.last_counts
            if cnt is not None:
                cnt = cnt.float()
                st.ffn.gate.bias += rate * torch.sign(cnt.mean() - cnt)

    @torch.no_grad()
    def init_from_backbone(self, backbone: nn.Module) -> list[str]:
        """Copies the backbone's last layers' hc/norm/attention/shared-expert weights (and the first
        n_routed_experts experts + gate rows) into the stages, where shapes agree. Returns copied names."""
        copied = []
        L = len(backbone.layers)
        for s, st in enumerate(self.stages):
            src = backbone.layers[max(0, L - len(self.stages) + s)]
            sd = src.state_dict()
            for name, t in st.state_dict().items():
                if name not in sd:
                    continue
                v = sd[name]
                if name.startswith("ffn.") and v.dim() >= 1 and name.split(".")[-1] in ("w1", "w2", "w3", "weight", "bias", "bias_vl") \
                        and not name.startswith("ffn.shared_experts") and v.shape[0] >= t.shape[0] and v.shape[1:] == t.shape[1:]:
                    v = v[: t.shape[0]]
                if v.shape == t.shape:
                    t.copy_(v)
                    copied.append(f"stages.{s}.{name}")
        return copied


# ---------------------------------------------------------------------------------------------
# Loss


def position_weights(G: int, device=None) -> torch.Tensor:
    k = torch.arange(G, device=device, dtype=torch.float32)  # k-1 = 0..G-1
    return torch.exp(-k / G)


def dspark_loss(draft_logits, conf_logits, target_logits, valid=None, w_ce=0.1, w_tv=0.9, w_conf=1.0):
    """draft_logits, target_logits [..., G, V]; conf_logits [..., G]; valid [...] bool (anchors).
    CE against the backbone's argmax, TV against its softmax, Conf = BCE(sigmoid(c), 1 - TV) with the
    soft label detached. Row k weighted by exp(-(k-1)/G), normalised by the weight sum; mean over
    anchors. Returns (loss, metrics dict of floats)."""
    G = draft_logits.size(-2)
    wk = position_weights(G, draft_logits.device)
    logp = draft_logits.float().log_softmax(-1)
    tgt = target_logits.float().softmax(-1)
    ce = -logp.gather(-1, tgt.argmax(-1, keepdim=True)).squeeze(-1)  # [..., G]
    tv = 0.5 * (logp.exp() - tgt).abs().sum(-1)                       # [..., G]
    cstar = (1.0 - tv).detach().clamp(0.0, 1.0)
    conf = F.binary_cross_entropy_with_logits(conf_logits.float(), cstar, reduction="none")
    per = (w_ce * ce + w_tv * tv + w_conf * conf) * wk
    per = per.sum(-1) / wk.sum()
    if valid is None:
        valid = torch.ones(per.shape, dtype=torch.bool, device=per.device)
    n = valid.sum().clamp(min=1)
    loss = (per * valid).sum() / n

    def m(t):
        return float(((t * wk).sum(-1) / wk.sum() * valid).sum() / n)

    with torch.no_grad():
        acc = (draft_logits.argmax(-1) == target_logits.argmax(-1)).float()
        metrics = {"loss": float(loss), "ce": m(ce), "tv": m(tv), "conf": m(conf),
                   "top1_row1": float((acc[..., 0] * valid).sum() / n)}
    return loss, metrics


# ---------------------------------------------------------------------------------------------
# Backbone interface: ids [B, S] -> (logits [B, S, V] FP32, taps [B, S, n_taps*dim] BF16), causal.


def backbone_fn(model: nn.Module, target_layer_ids: Sequence[int], num: Numerics | None = None) -> Callable:
    """Wraps a model.V41Model (frozen; its own numerics unless `num`): sets its dspark_target_layer_ids
    and returns f(ids) -> (logits, taps) with taps = concat of the per-target-layer means over hc."""
    model.cfg.dspark_target_layer_ids = tuple(target_layer_ids)

    @torch.no_grad()
    def f(ids):
        logits, hid = model(ids, num=num, return_hidden=True)
        return logits.float(), torch.cat(hid["taps"], dim=-1)
    return f


# ---------------------------------------------------------------------------------------------
# Acceptance measurement (greedy speculative decoding, simulated with the PyTorch backbone)


@dataclass
class AcceptanceResult:
    steps: int
    tau_excl_bonus: float      # mean accepted draft tokens per verify step
    tau_incl_bonus: float      # mean tokens emitted per verify step (accepted + the bonus token)
    per_position_accept: list  # P(draft token k accepted), k = 1..G (prefix acceptance)
    ece_cumprod: float         # ECE of the cumulative product of sigmoid(c) vs prefix survival
    mean_cumprod: list         # mean predicted prefix survival per k
    histogram: list            # count of steps with a accepted drafts, a = 0..G
    generated_tokens: int
    trace: list = field(default_factory=list)  # per step (row, p, t_{p+1}, drafts, accepted), if kept

    def to_json(self) -> dict:
        d = asdict(self)
        d.pop("trace")
        return d


def ece(pred: np.ndarray, outcome: np.ndarray, n_bins: int = 10) -> float:
    pred, outcome = np.asarray(pred, np.float64), np.asarray(outcome, np.float64)
    if pred.size == 0:
        return float("nan")
    b = np.minimum((pred * n_bins).astype(np.int64), n_bins - 1)
    tot = 0.0
    for i in range(n_bins):
        m = b == i
        if m.any():
            tot += m.sum() * abs(pred[m].mean() - outcome[m].mean())
    return float(tot / pred.size)


@torch.no_grad()
def measure_acceptance(backbone: Callable, draft: DSparkDraft, prompts: torch.Tensor, max_new: int,
                       keep_trace: bool = False) -> AcceptanceResult:
    """Greedy (T = 0) speculative decoding of `max_new` tokens after each prompt row [P, L].

    Step: the backbone's forward over the accepted sequence gives taps at every position and the bonus
    token t_{p+1} = argmax at the last accepted position p; the draft proposes d_1..d_G from (taps, p,
    t_{p+1}); one backbone forward over sequence + [t_{p+1}, d_1..d_G] verifies: d_k is accepted while
    d_k == argmax of the backbone at position p+k (all earlier ones accepted). The sequence grows by
    t_{p+1}, d_1..d_a; that same forward gives the next step's taps and bonus (causality), so each step
    costs one backbone forward. Rows are right-padded; emitted tokens are exactly the backbone's greedy
    continuation (lossless), so `a` is the number of drafts matching the greedy continuation."""
    draft.eval()
    G = draft.cfg.block_size
    P, L = prompts.shape
    dev = prompts.device
    # A row that finishes keeps its length (up to L + max_new - 1 + 1 + G) and still writes one block of
    # G drafts past it each remaining step, so the buffer needs 2G beyond L + max_new.
    cap = L + max_new + 2 * G + 2
    seq = torch.zeros(P, cap, dtype=torch.long, device=dev)
    seq[:, :L] = prompts
    length = torch.full((P,), L, dtype=torch.long, device=dev)  # accepted tokens per row
    done = torch.zeros(P, dtype=torch.bool, device=dev)
    acc_counts, cum_preds, outcomes, trace = [], [], [], []
    logits, taps = backbone(seq[:, :L])
    ar = torch.arange(P, device=dev)
    steps = 0
    while not bool(done.all()):
        p = length - 1
        bonus = logits[ar, p].argmax(-1)
        drafts, conf, _ = draft.draft_block(taps, p, bonus)
        seq[ar, p + 1] = bonus
        cols = (p + 2).unsqueeze(1) + torch.arange(G, device=dev)
        seq.scatter_(1, cols, drafts)
        width = int((length.max() + 1 + G).item())
        logits, taps = backbone(seq[:, :width])
        # the backbone's greedy token at positions p+1 .. p+G (predicting p+2 .. p+G+1)
        vpos = (p + 1).unsqueeze(1) + torch.arange(G, device=dev)
        greedy = logits.gather(1, vpos.unsqueeze(-1).expand(-1, -1, logits.size(-1))).argmax(-1)
        match = (greedy == drafts).long().cumprod(dim=1)
        a = match.sum(1)
        cp = torch.sigmoid(conf.float()).cumprod(dim=1)
        active = ~done
        for r in torch.nonzero(active).flatten().tolist():
            acc_counts.append(int(a[r]))
            cum_preds.append(cp[r].cpu().numpy())
            outcomes.append(match[r].cpu().numpy())
            if keep_trace:
                trace.append((r, int(p[r]), int(bonus[r]), drafts[r].tolist(), int(a[r])))
        length = torch.where(active, length + 1 + a, length)
        # rejected drafts stay in seq beyond `length`: harmless (causal), overwritten next step
        done = done | (length - L >= max_new)
        steps += 1
    acc = np.array(acc_counts, dtype=np.float64)
    cum = np.stack(cum_preds) if cum_preds else np.zeros((0, G))
    out = np.stack(outcomes).astype(np.float64) if outcomes else np.zeros((0, G))
    hist = np.bincount(acc.astype(np.int64), minlength=G + 1).tolist()
    return AcceptanceResult(
        steps=len(acc_counts), tau_excl_bonus=float(acc.mean()) if acc.size else float("nan"),
        tau_incl_bonus=float(acc.mean() + 1) if acc.size else float("nan"),
        per_position_accept=out.mean(0).tolist() if out.size else [],
        ece_cumprod=ece(cum.flatten(), out.flatten()), mean_cumprod=cum.mean(0).tolist() if cum.size else [],
        histogram=hist, generated_tokens=int((length - L).sum()), trace=trace)


# ---------------------------------------------------------------------------------------------
# Export

DSPARK_FILE = "model-dspark.safetensors"
INDEX_FILE = "model.safetensors.index.json"
FP8_BLOCK = 32


def _ckpt_format():
    import ckpt_format  # tools/ckpt_format.py (on sys.path above)
    return ckpt_format


def checkpoint_tensors(draft: DSparkDraft) -> list[tuple[str, str, torch.Tensor]]:
    """[(checkpoint name, kind, float32 tensor)] for every mtp.* tensor; kind in bf16|f32|fp8|fp4 (the
    V4.1 formats of §1.3). Stage s of the draft is `mtp.{s}`; the Block mapping is export.py's."""
    out = []

    def add(name, kind, t):
        out.append((name, kind, t.detach().float().cpu()))

    n = len(draft.stages)
    for s, blk in enumerate(draft.stages):
        p = f"mtp.{s}."
        for sub in ("attn", "ffn"):
            for t in ("fn", "base", "scale"):
                add(f"{p}hc_{sub}_{t}", "f32", getattr(blk, f"hc_{sub}_{t}"))
        add(p + "attn_norm.weight", "bf16", blk.attn_norm)
        add(p + "ffn_norm.weight", "bf16", blk.ffn_norm)
        a, A = p + "attn.", blk.attn
        add(a + "wq_a.weight", "fp8", A.wq_a)
        add(a + "q_norm.weight", "bf16", A.q_norm)
        add(a + "wq_b.weight", "fp8", A.wq_b)
        add(a + "wkv.weight", "fp8", A.wkv)
        add(a + "kv_norm.weight", "bf16", A.kv_norm)
        add(a + "wo_a.weight", "fp8", A.wo_a)
        add(a + "wo_b.weight", "fp8", A.wo_b)
        add(a + "attn_sink", "f32", A.attn_sink)
        f, Fm = p + "ffn.", blk.ffn
        add(f + "gate.weight", "bf16", Fm.gate.weight)
        add(f + "gate.bias", "f32", Fm.gate.bias)
        add(f + "gate.bias_vl", "f32", Fm.gate.bias)  # drafts are text: bias_vl = bias
        for e in range(Fm.E):
            for w in ("w1", "w2", "w3"):
                add(f"{f}experts.{e}.{w}.weight", "fp4", getattr(Fm, w)[e])
        for w in ("w1", "w2", "w3"):
            add(f"{f}shared_experts.{w}.weight", "fp8", getattr(Fm.shared_experts, w))
        if s == 0:
            add(p + "main_proj.weight", "fp8", draft.main_proj)
            add(p + "main_norm.weight", "bf16", draft.main_norm)
        if s == n - 1:
            add(p + "norm.weight", "bf16", draft.norm)
            add(p + "markov_head.embed.weight", "bf16", draft.markov_embed)
            add(p + "markov_head.head.weight", "bf16", draft.markov_head)
            add(p + "confidence_head.proj.weight", "bf16", draft.conf_proj)
    return out


def stored_entries(draft: DSparkDraft) -> dict[str, tuple[str, list, bytes]]:
    """-> {stored name: (dtype, shape, bytes)}: FP8 e4m3 + 32x32 E8M0 tiles, FP4 experts (I8 + per-32
    E8M0), BF16, F32 (tools/ckpt_format.py, as export.py writes the backbone)."""
    cf = _ckpt_format()
    st = {}
    for name, kind, t in checkpoint_tensors(draft):
        w = t.numpy().astype(np.float32)
        base = name[:-len(".weight")] if name.endswith(".weight") else name
        if kind == "f32":
            st[name] = ("F32", list(w.shape), w.astype("<f4").tobytes())
        elif kind == "bf16":
            st[name] = ("BF16", list(w.shape), cf.f32_to_bf16_bits(w).tobytes())
        elif kind == "fp8":
            codes, scales = cf.quantize_fp8_block(w, FP8_BLOCK)
            st[name] = ("F8_E4M3", list(codes.shape), codes.tobytes())
            st[base + ".scale"] = ("F8_E8M0", list(scales.shape), scales.tobytes())
        else:
            packed, scales = cf.quantize_fp4_rows(w, 32)
            st[name] = ("I8", list(packed.shape), np.ascontiguousarray(packed).tobytes())
            st[base + ".scale"] = ("F8_E8M0", list(scales.shape), scales.tobytes())
    return st


def dspark_config_keys(cfg: DSparkConfig, hf: bool = True) -> dict:
    d = {"dspark_block_size": cfg.block_size, "dspark_noise_token_id": cfg.noise_token_id,
         "dspark_target_layer_ids": list(cfg.target_layer_ids), "dspark_markov_rank": cfg.markov_rank,
         "dspark_n_routed_experts": cfg.n_routed_experts}
    d["dspark_num_experts_per_tok" if hf else "dspark_n_activated_experts"] = cfg.n_activated_experts
    return d


def export_dspark(draft: DSparkDraft, ckpt_dir: str, extend_compress_ratios: bool = True) -> dict:
    """Adds the DSpark stages to a V4.1 checkpoint directory written by tools/train/export.py:
    * `model-dspark.safetensors`: every `mtp.{s}.*` tensor (names and dtypes of §1.3, shapes scaled),
    * `model.safetensors.index.json`: lists it (created from the existing weight files when absent;
      the engine reads the index when there is one, else model.safetensors only),
    * config.json text_config: the dspark_* keys, num_nextn_predict_layers = n_stages and
      compress_ratios + [0] * n_stages (as the real V4.1 config: one entry per layer including the
      DSpark stages); inference/config.json likewise (n_mtp_layers, dspark_n_activated_experts).
    Idempotent (a second export replaces the first). Returns a summary."""
    cf = _ckpt_format()
    cfg = draft.cfg
    st = stored_entries(draft)
    entries = {n: (dt, shape) for n, (dt, shape, _) in st.items()}
    cf.write_safetensors(os.path.join(ckpt_dir, DSPARK_FILE), entries, lambda n: iter([st[n][2]]), {"format": "pt"})

    ipath = os.path.join(ckpt_dir, INDEX_FILE)
    if os.path.exists(ipath):
        with open(ipath) as f:
            index = json.load(f)
    else:
        index = {"metadata": {}, "weight_map": {}}
        for fn in sorted(os.listdir(ckpt_dir)):
            if fn.endswith(".safetensors") and fn not in (DSPARK_FILE, "engram_hash.safetensors"):
                header, _ = cf.read_safetensors_header(os.path.join(ckpt_dir, fn))
                for n in header:
                    if n != "__metadata__":
                        index["weight_map"][n] = fn
    wm = {n: fl for n, fl in index["weight_map"].items() if fl != DSPARK_FILE and not n.startswith("mtp.")}
    wm.update({n: DSPARK_FILE for n in entries})
    index["weight_map"] = dict(sorted(wm.items()))
    total = sum(cf.tensor_nbytes(*e) for e in entries.values())
    with open(ipath, "w") as f:
        json.dump(index, f, indent=2)
        f.write("\n")

    def patch(path, text_key, hf, n_layers_key, mtp_key):
        if not os.path.exists(path):
            return
        with open(path, encoding="utf-8") as f:
            j = json.load(f)
        d = j.get(text_key, j) if text_key else j
        d.update(dspark_config_keys(cfg, hf=hf))
        n_layers = d.get(n_layers_key)
        if extend_compress_ratios and "compress_ratios" in d and n_layers is not None:
            d["compress_ratios"] = list(d["compress_ratios"])[:n_layers] + [0] * cfg.n_stages
        d[mtp_key] = cfg.n_stages
        with open(path, "w", encoding="utf-8") as f:
            json.dump(j, f, indent=2, ensure_ascii=False)
            f.write("\n")

    patch(os.path.join(ckpt_dir, "config.json"), "text_config", True, "num_hidden_layers", "num_nextn_predict_layers")
    patch(os.path.join(ckpt_dir, "inference", "config.json"), None, False, "n_layers", "n_mtp_layers")
    return {"file": DSPARK_FILE, "tensors": len(entries), "bytes": total}


def expected_names(bcfg: V41Config, cfg: DSparkConfig) -> dict[str, tuple[str, tuple]]:
    """Stored name -> (dtype, shape) of the V4.1 DSpark census (§1.3), for the backbone's shapes."""
    d, hc, B = bcfg.dim, bcfg.hc_mult, FP8_BLOCK
    mix = (2 + hc) * hc
    I = bcfg.moe_inter_dim
    out = {}

    def fp8(name, o, i):
        out[name] = ("F8_E4M3", (o, i))
        out[name[:-len(".weight")] + ".scale"] = ("F8_E8M0", (-(-o // B), -(-i // B)))

    def fp4(name, o, i):
        out[name] = ("I8", (o, i // 2))
        out[name[:-len(".weight")] + ".scale"] = ("F8_E8M0", (o, i // 32))

    for s in range(cfg.n_stages):
        p = f"mtp.{s}."
        for t in ("attn", "ffn"):
            out[f"{p}hc_{t}_fn"] = ("F32", (mix, hc * d))
            out[f"{p}hc_{t}_base"] = ("F32", (mix,))
            out[f"{p}hc_{t}_scale"] = ("F32", (3,))
        out[p + "attn_norm.weight"] = ("BF16", (d,))
        out[p + "ffn_norm.weight"] = ("BF16", (d,))
        fp8(p + "attn.wq_a.weight", bcfg.q_lora_rank, d)
        out[p + "attn.q_norm.weight"] = ("BF16", (bcfg.q_lora_rank,))
        fp8(p + "attn.wq_b.weight", bcfg.n_heads * bcfg.head_dim, bcfg.q_lora_rank)
        fp8(p + "attn.wkv.weight", bcfg.head_dim, d)
        out[p + "attn.kv_norm.weight"] = ("BF16", (bcfg.head_dim,))
        fp8(p + "attn.wo_a.weight", bcfg.o_groups * bcfg.o_lora_rank, bcfg.n_heads * bcfg.head_dim // bcfg.o_groups)
        fp8(p + "attn.wo_b.weight", d, bcfg.o_groups * bcfg.o_lora_rank)
        out[p + "attn.attn_sink"] = ("F32", (bcfg.n_heads,))
        out[p + "ffn.gate.weight"] = ("BF16", (cfg.n_routed_experts, d))
        out[p + "ffn.gate.bias"] = ("F32", (cfg.n_routed_experts,))
        out[p + "ffn.gate.bias_vl"] = ("F32", (cfg.n_routed_experts,))
        for e in range(cfg.n_routed_experts):
            fp4(f"{p}ffn.experts.{e}.w1.weight", I, d)
            fp4(f"{p}ffn.experts.{e}.w2.weight", d, I)
            fp4(f"{p}ffn.experts.{e}.w3.weight", I, d)
        fp8(p + "ffn.shared_experts.w1.weight", I, d)
        fp8(p + "ffn.shared_experts.w2.weight", d, I)
        fp8(p + "ffn.shared_experts.w3.weight", I, d)
        if s == 0:
            fp8(p + "main_proj.weight", d, cfg.n_taps * d)
            out[p + "main_norm.weight"] = ("BF16", (d,))
        if s == cfg.n_stages - 1:
            out[p + "norm.weight"] = ("BF16", (d,))
            out[p + "markov_head.embed.weight"] = ("BF16", (bcfg.vocab_size, cfg.markov_rank))
            out[p + "markov_head.head.weight"] = ("BF16", (bcfg.vocab_size, cfg.markov_rank))
            out[p + "confidence_head.proj.weight"] = ("BF16", (1, d + cfg.markov_rank))
    return out


def load_dspark(ckpt_dir: str, draft: DSparkDraft) -> None:
    """Loads model-dspark.safetensors (dequantised) into `draft` (the inverse of export_dspark)."""
    cf = _ckpt_format()
    path = os.path.join(ckpt_dir, DSPARK_FILE)
    header, off = cf.read_safetensors_header(path)
    raw = np.fromfile(path, dtype=np.uint8)

    def arr(n):
        h = header[n]
        a, b = h["data_offsets"]
        return raw[off + a:off + b], h["dtype"], h["shape"]

    targets = {name: t for name, _, t in checkpoint_tensors(draft)}
    # map names back to live tensors
    live = {}
    for s, blk in enumerate(draft.stages):
        p = f"mtp.{s}."
        for sub in ("attn", "ffn"):
            for t in ("fn", "base", "scale"):
                live[f"{p}hc_{sub}_{t}"] = getattr(blk, f"hc_{sub}_{t}")
        live[p + "attn_norm.weight"], live[p + "ffn_norm.weight"] = blk.attn_norm, blk.ffn_norm
        A = blk.attn
        for k in ("wq_a", "q_norm", "wq_b", "wkv", "kv_norm", "wo_a", "wo_b"):
            live[f"{p}attn.{k}.weight"] = getattr(A, k)
        live[p + "attn.attn_sink"] = A.attn_sink
        Fm = blk.ffn
        live[p + "ffn.gate.weight"], live[p + "ffn.gate.bias"] = Fm.gate.weight, Fm.gate.bias
        for e in range(Fm.E):
            for w in ("w1", "w2", "w3"):
                live[f"{p}ffn.experts.{e}.{w}.weight"] = getattr(Fm, w)[e]
        for w in ("w1", "w2", "w3"):
            live[f"{p}ffn.shared_experts.{w}.weight"] = getattr(Fm.shared_experts, w)
    last = f"mtp.{len(draft.stages) - 1}."
    live.update({"mtp.0.main_proj.weight": draft.main_proj, "mtp.0.main_norm.weight": draft.main_norm,
                 last + "norm.weight": draft.norm, last + "markov_head.embed.weight": draft.markov_embed,
                 last + "markov_head.head.weight": draft.markov_head,
                 last + "confidence_head.proj.weight": draft.conf_proj})
    with torch.no_grad():
        for name in targets:
            if name not in live:
                continue
            buf, dt, shape = arr(name)
            if dt == "F32":
                v = buf.view("<f4").reshape(shape)
            elif dt == "BF16":
                v = cf.bf16_bits_to_f32(buf.view("<u2")).reshape(shape)
            else:
                sb, _, ss = arr(name[:-len(".weight")] + ".scale")
                sb = sb.reshape(ss)
                v = (cf.dequantize_fp8_block(buf.reshape(shape), sb, FP8_BLOCK) if dt == "F8_E4M3"
                     else cf.dequantize_fp4_rows(buf.view(np.int8).reshape(shape), sb, 32))
            t = live[name]
            t.copy_(torch.from_numpy(np.ascontiguousarray(v, dtype=np.float32)).to(t.device, t.dtype))

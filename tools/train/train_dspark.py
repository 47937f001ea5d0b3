#!/usr/bin/env python3
"""Trains the DSpark draft (tools/train/dspark.py, docs v4-architecture §2.12) on a frozen V4.1 backbone,
measures its greedy acceptance on held-out text and (optionally) exports the mtp.* stages.

    python3 tools/train/train_dspark.py --backbone CKPT_DIR --corpus build/train/corpus --out OUT \\
        --device cuda --minutes 20 --seed 0 [--export]
    python3 tools/train/train_dspark.py --smoke --out /tmp/dspark-smoke          # CPU, tiny random backbone

--backbone: a checkpoint directory written by tools/train/export.py (loaded with export.load: the
exported, dequantised weights under the engine's numerics), or a torch file {"config": V41Config dict,
"model": state_dict} (train.py's own checkpoints). --corpus DIR holds train.txt / heldout.txt (corpus.py)
or train.npy / heldout.npy token arrays; --heldout overrides the held-out file. Text is tokenized with
the backbone directory's tokenizer.json (or --tokenizer).

Training: each step takes --batch random windows of --seq-len tokens, runs the backbone once (no grad)
for its taps and logits, picks --anchors anchor positions p (shared by the batch rows, p <= S-1-gamma)
and trains all anchors' draft blocks at once: L = 0.1 CE + 0.9 TV + 1.0 Conf, row k weighted by
exp(-(k-1)/gamma), targets = the backbone's softmax / argmax at p+1 .. p+gamma (self-distillation).
The draft runs under model.Numerics.train() (QAT: BF16 rounding, FP8 activations and KV, FP8/FP4 weight
fake quant, straight-through), the backbone and the evaluation under the backbone's engine numerics.

Evaluation: greedy speculative decoding (dspark.measure_acceptance) of --eval-new tokens after each of
--eval-prompts held-out prompts of --eval-prompt-len tokens (deterministic windows from the seed).

Outputs in --out: losses.csv (step, seconds, lr, loss, ce, tv, conf, top1_row1), results.json
(configs, training summary, acceptance before and after training), dspark.pt (draft state + configs);
with --export: ckpt/ = a copy of the backbone checkpoint with the DSpark stages added (export_dspark).
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import os
import shutil
import sys
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import dspark as D  # noqa: E402
from model import Numerics, V41Config, V41Model  # noqa: E402

NOISE_TOKEN_TEXT = "<｜System｜>"  # the real V4.1 dspark_noise_token_id (128799) is this token


# ---------------------------------------------------------------------------------------------
# Backbone and data


def smoke_config() -> V41Config:
    return V41Config(vocab_size=320, dim=64, compress_ratios=(0, 0, 2, 1), kv_source_layers=(2, 3),
                     index_source_layers=(2, 3), candidate_source_layer=-1, candidate_topk_blocks=0,
                     candidate_block_size=0, n_heads=2, head_dim=96, q_lora_rank=32, o_groups=2, o_lora_rank=32,
                     moe_inter_dim=32, n_routed_experts=4, n_activated_experts=2, window_size=16, index_n_heads=2,
                     index_head_dim=64, index_topk=128, max_seq_len=128)


def load_backbone(spec: str, device: str, seed: int) -> tuple[V41Model, str | None]:
    """-> (frozen V41Model in eval mode, checkpoint dir or None)."""
    if spec in ("smoke", "random"):  # random: model.py's default V41Config (timing runs)
        torch.manual_seed(seed)
        model = V41Model(smoke_config() if spec == "smoke" else V41Config())
        ckdir = None
    elif os.path.isdir(spec):
        import export as E
        model = E.load(spec)
        ckdir = spec
    else:
        blob = torch.load(spec, map_location="cpu", weights_only=False)
        cfg = blob["config"]
        cfg = V41Config.from_dict(cfg) if isinstance(cfg, dict) else cfg
        model = V41Model(cfg)
        sd = blob.get("model") or blob.get("state_dict") or blob.get("model_state")
        model.load_state_dict(sd)
        ckdir = None
    for p in model.parameters():
        p.requires_grad_(False)
    return model.to(device).eval(), ckdir


def tokenizer_path(args, ckdir: str | None) -> str | None:
    for c in (args.tokenizer, ckdir and os.path.join(ckdir, "tokenizer.json")):
        if c and os.path.exists(c):
            return c
    return None


def noise_token_id(args, tok_path: str | None, vocab: int) -> int:
    if args.noise_token_id is not None:
        return args.noise_token_id
    if tok_path:
        with open(tok_path, encoding="utf-8") as f:
            tj = json.load(f)
        for t in tj.get("added_tokens", []):
            if t.get("content") == NOISE_TOKEN_TEXT and t["id"] < vocab:
                return int(t["id"])
    return vocab - 1


def load_tokens(path: str, tok_path: str | None, cache_dir: str) -> np.ndarray:
    """int32 token stream of a .npy array or a text file (documents split on blank-line triples,
    EOS-joined, as train.txt is written by corpus.py)."""
    if path.endswith(".npy"):
        return np.load(path).astype(np.int32).reshape(-1)
    if tok_path is None:
        raise SystemExit(f"{path}: text needs a tokenizer (--tokenizer or tokenizer.json in the backbone dir)")
    st = os.stat(path)
    cache = os.path.join(cache_dir, f"tokens-{os.path.basename(path)}-{st.st_size}.npy")
    if os.path.exists(cache):
        return np.load(cache)
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(tok_path)
    with open(path, encoding="utf-8") as f:
        docs = [d for d in f.read().split("\n\n\n") if d.strip()]
    ids = []
    for i in range(0, len(docs), 512):
        for enc in tok.encode_batch(docs[i:i + 512], add_special_tokens=False):
            ids.extend(enc.ids)
            ids.append(1)  # EOS between documents
    arr = np.asarray(ids, dtype=np.int32)
    np.save(cache, arr)
    return arr


def corpus_files(args) -> tuple[str, str]:
    c = args.corpus
    def pick(stem):
        for ext in (".npy", ".txt"):
            p = os.path.join(c, stem + ext)
            if os.path.exists(p):
                return p
        return None
    train = pick("train") if os.path.isdir(c) else c
    held = args.heldout or (pick("heldout") if os.path.isdir(c) else None)
    if train is None or held is None:
        raise SystemExit(f"--corpus {c}: need train.(npy|txt) and heldout.(npy|txt) (or --heldout)")
    return train, held


def synthetic_tokens(n: int, vocab: int, seed: int) -> np.ndarray:
    """Smoke data: a random sparse order-1 Markov chain (some structure for the backbone to continue)."""
    rng = np.random.default_rng(seed)
    nxt = rng.integers(0, vocab, size=(vocab, 3))
    out = np.empty(n, dtype=np.int32)
    out[0] = 0
    for i in range(1, n):
        out[i] = nxt[out[i - 1], rng.integers(0, 3)]
    return out


# ---------------------------------------------------------------------------------------------
# Training


def sample_batch(tokens: np.ndarray, batch: int, seq_len: int, rng: np.random.Generator) -> torch.Tensor:
    starts = rng.integers(0, len(tokens) - seq_len, size=batch)
    return torch.from_numpy(np.stack([tokens[s:s + seq_len] for s in starts]).astype(np.int64))


def sample_anchors(seq_len: int, n: int, G: int, rng: np.random.Generator) -> torch.Tensor:
    hi = seq_len - G  # p in [0, S-1-G]
    n = min(n, hi)
    return torch.from_numpy(np.sort(rng.choice(hi, size=n, replace=False)).astype(np.int64))


def heldout_prompts(tokens: np.ndarray, n: int, plen: int, seed: int) -> torch.Tensor:
    rng = np.random.default_rng(seed + 7919)
    starts = rng.integers(0, len(tokens) - plen, size=n)
    return torch.from_numpy(np.stack([tokens[s:s + plen] for s in starts]).astype(np.int64))


def train(args) -> dict:
    os.makedirs(args.out, exist_ok=True)
    torch.manual_seed(args.seed)
    dev = torch.device(args.device)
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    t0 = time.time()
    backbone, ckdir = load_backbone("smoke" if args.smoke else args.backbone, args.device, args.seed)
    bcfg = backbone.cfg
    tok_path = tokenizer_path(args, ckdir)
    if args.smoke or args.backbone == "random":
        toks = synthetic_tokens(40_000, bcfg.vocab_size, args.seed)
        train_toks, held_toks = toks[:36_000], toks[36_000:]
    else:
        tr, he = corpus_files(args)
        train_toks = load_tokens(tr, tok_path, args.out)
        held_toks = load_tokens(he, tok_path, args.out)
    seq_len = min(args.seq_len, bcfg.max_seq_len)
    target = tuple(int(x) for x in args.target_layers.split(",")) if args.target_layers else ()
    dcfg = D.DSparkConfig(target_layer_ids=target, block_size=args.block_size,
                          noise_token_id=noise_token_id(args, tok_path, bcfg.vocab_size),
                          markov_rank=args.markov_rank, n_routed_experts=args.dspark_experts,
                          n_activated_experts=args.dspark_topk, n_stages=3)
    torch.manual_seed(args.seed)
    draft = D.DSparkDraft(bcfg, dcfg, backbone.embed.weight, backbone.head).to(dev)
    dcfg = draft.cfg
    if args.init_from_backbone:
        draft.init_from_backbone(backbone)
    bb = D.backbone_fn(backbone, dcfg.target_layer_ids)
    G = dcfg.block_size
    print(f"[dspark] backbone {bcfg.n_layers} layers dim {bcfg.dim} vocab {bcfg.vocab_size}; draft {dcfg}; "
          f"{sum(p.numel() for p in draft.parameters())} params; train {len(train_toks)} tok, heldout {len(held_toks)} tok",
          flush=True)

    prompts = heldout_prompts(held_toks, args.eval_prompts, min(args.eval_prompt_len, bcfg.max_seq_len - args.eval_new - 2 * G - 2),
                              args.seed).to(dev)
    results = {"backbone": args.backbone if not args.smoke else "smoke (random V41Model)", "device": str(dev),
               "seed": args.seed, "backbone_config": bcfg.to_dict(), "dspark_config": dcfg.to_json(),
               "train": {}, "acceptance_note": "tau_excl_bonus = mean accepted draft tokens per verify step; "
               "tau_incl_bonus = tau_excl_bonus + 1 (tokens emitted per backbone forward); greedy (T=0)"}
    if args.eval_init:
        torch.manual_seed(args.seed)
        r0 = D.measure_acceptance(bb, draft, prompts, args.eval_new)
        results["acceptance_init"] = r0.to_json()
        print(f"[dspark] init acceptance: tau(excl bonus) {r0.tau_excl_bonus:.3f}", flush=True)

    opt = torch.optim.AdamW([p for p in draft.parameters() if p.requires_grad], lr=args.lr, betas=(0.9, 0.95),
                            weight_decay=0.0)
    rng = np.random.default_rng(args.seed)
    num = Numerics.train(qat=not args.no_qat)
    csv_f = open(os.path.join(args.out, "losses.csv"), "w", newline="")
    w = csv.writer(csv_f)
    w.writerow(["step", "seconds", "lr", "loss", "ce", "tv", "conf", "top1_row1"])
    budget = args.minutes * 60.0
    t_train = time.time()
    step, hist = 0, []
    draft.train()
    while True:
        el = time.time() - t_train
        if (args.steps and step >= args.steps) or (not args.steps and el >= budget):
            break
        frac = min(1.0, el / budget) if not args.steps else step / args.steps
        lr = args.lr * min(1.0, (step + 1) / args.warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = lr
        ids = sample_batch(train_toks, args.batch, seq_len, rng).to(dev)
        logits, taps = bb(ids)
        anchors = sample_anchors(seq_len, args.anchors, G, rng).to(dev)
        dl, cl = draft.forward_train(taps, ids, anchors, num=num)
        rows = anchors[:, None] + 1 + torch.arange(G, device=dev)
        loss, met = D.dspark_loss(dl, cl, logits[:, rows])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        opt.step()
        draft.update_moe_bias(args.bias_rate)
        step += 1
        hist.append(met)
        if step % args.log_every == 0 or step == 1:
            w.writerow([step, f"{time.time() - t_train:.1f}", f"{lr:.3e}"] +
                       [f"{met[k]:.5f}" for k in ("loss", "ce", "tv", "conf", "top1_row1")])
            csv_f.flush()
            print(f"[dspark] step {step} {time.time() - t_train:.0f}s loss {met['loss']:.4f} ce {met['ce']:.3f} "
                  f"tv {met['tv']:.3f} conf {met['conf']:.3f} top1(row1) {met['top1_row1']:.3f}", flush=True)
    csv_f.close()
    train_s = time.time() - t_train
    last = hist[-min(len(hist), 20):] if hist else []
    results["train"] = {"steps": step, "seconds": round(train_s, 1), "batch": args.batch, "seq_len": seq_len,
                        "anchors": args.anchors, "lr": args.lr, "qat": not args.no_qat,
                        "first": hist[0] if hist else None,
                        "last20_mean": {k: float(np.mean([m[k] for m in last])) for k in last[0]} if last else None}

    torch.save({"bcfg": bcfg.to_dict(), "dcfg": dcfg.to_json(), "state": draft.state_dict()},
               os.path.join(args.out, "dspark.pt"))
    if args.export:
        dst = os.path.join(args.out, "ckpt")
        if ckdir is None:
            import export as E
            if os.path.exists(dst):
                shutil.rmtree(dst)
            E.export(backbone.cpu(), dst)
            backbone.to(dev)
        else:
            if os.path.exists(dst):
                shutil.rmtree(dst)
            shutil.copytree(ckdir, dst)
        results["export"] = D.export_dspark(draft.cpu(), dst)
        results["export"]["dir"] = dst
        print(f"[dspark] exported {results['export']}", flush=True)
        draft.to(dev)
    draft.eval()
    torch.manual_seed(args.seed)
    t_eval = time.time()
    r = D.measure_acceptance(bb, draft, prompts, args.eval_new)
    results["acceptance"] = r.to_json()
    results["acceptance"]["prompts"] = int(prompts.shape[0])
    results["acceptance"]["prompt_len"] = int(prompts.shape[1])
    results["acceptance"]["new_tokens_per_prompt"] = args.eval_new
    results["acceptance"]["seconds"] = round(time.time() - t_eval, 1)
    print(f"[dspark] acceptance: tau(excl bonus) {r.tau_excl_bonus:.3f}, tau(incl bonus) {r.tau_incl_bonus:.3f}, "
          f"per-position {np.round(r.per_position_accept, 3).tolist()}, ECE(cumprod) {r.ece_cumprod:.3f}, "
          f"{r.steps} verify steps", flush=True)

    results["total_seconds"] = round(time.time() - t0, 1)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(results, f, indent=2)
        f.write("\n")
    return results


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backbone", help="checkpoint dir (export.py) or torch file {config, model}")
    ap.add_argument("--corpus", help="dir with train/heldout .txt or .npy (or a train file)")
    ap.add_argument("--heldout", help="held-out text / .npy (default: CORPUS/heldout.*)")
    ap.add_argument("--tokenizer", help="tokenizer.json (default: the backbone dir's)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--minutes", type=float, default=10.0, help="training time budget")
    ap.add_argument("--steps", type=int, default=0, help="fixed step count instead of --minutes")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--anchors", type=int, default=64, help="anchor positions per sequence per step")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--bias-rate", type=float, default=1e-3, help="MoE balancing bias step")
    ap.add_argument("--block-size", type=int, default=5)
    ap.add_argument("--markov-rank", type=int, default=32)
    ap.add_argument("--dspark-experts", type=int, default=0, help="routed experts per stage (0: backbone's)")
    ap.add_argument("--dspark-topk", type=int, default=0, help="experts per token (0: backbone's)")
    ap.add_argument("--target-layers", default="", help="comma list (default: backbone config or last 3 layers)")
    ap.add_argument("--noise-token-id", type=int, default=None, help=f"default: {NOISE_TOKEN_TEXT} or vocab-1")
    ap.add_argument("--init-from-backbone", action="store_true", help="init stages from the last backbone layers")
    ap.add_argument("--no-qat", action="store_true", help="train without the QAT numerics")
    ap.add_argument("--eval-prompts", type=int, default=32)
    ap.add_argument("--eval-prompt-len", type=int, default=96)
    ap.add_argument("--eval-new", type=int, default=64)
    ap.add_argument("--eval-init", action="store_true", help="also measure the untrained draft")
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--export", action="store_true", help="write OUT/ckpt = backbone checkpoint + mtp.* stages")
    ap.add_argument("--smoke", action="store_true", help="tiny random backbone, synthetic tokens, CPU-sized")
    args = ap.parse_args(argv)
    if args.smoke:
        d = dict(batch=4, seq_len=64, anchors=16, eval_prompts=4, eval_prompt_len=32, eval_new=24, log_every=5,
                 warmup=5, lr=3e-3)
        for k, v in d.items():
            if getattr(args, k) == ap.get_default(k):
                setattr(args, k, v)
        if args.minutes == ap.get_default("minutes") and not args.steps:
            args.minutes = 0.5
    elif not args.backbone or (not args.corpus and args.backbone != "random"):
        ap.error("--backbone and --corpus are required (or --smoke)")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(max(1, min(torch.get_num_threads(), 2)) if args.device == "cpu" else torch.get_num_threads())
    train(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())

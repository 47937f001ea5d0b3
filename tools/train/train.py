#!/usr/bin/env python3
"""Train a small DeepSeek-V4.1-family model on a text corpus, export it for `deepinfer`, evaluate it.

    python3 tools/train/train.py --preset h200 --device cuda --minutes 8 --out build/train/run1
    python3 tools/train/train.py --preset smoke --device cpu --steps 30 --out /tmp/smoke   # CPU smoke test

Steps: tokenize corpus/train.txt and corpus/heldout.txt with tokenizer/tokenizer.json; train on random
windows of --ctx tokens (order seeded by --seed) with AdamW, warmup + cosine LR, straight-through QAT
(weights fake-quantised to FP8/FP4, FP8 activations, KV quant, BF16 roundings; --no-qat turns it off),
aux-loss-free expert balancing (gate bias), BF16 autocast on CUDA; log loss to OUT/loss.csv and plot
OUT/loss.png; export OUT/model (the V4.1 checkpoint, tokenizer copied); load it back and evaluate the
held-out perplexity with the engine's numerics (Numerics.engine) on OUT/heldout_eval.txt, windowed as
`deepinfer perplexity --max-tokens-per-window CTX`; with --deepinfer BIN (default build/src/deepinfer if
present) also run the engine on the same file and print both. Writes OUT/summary.json.

Determinism: with --steps (and no --minutes) a run is a function of --seed (torch deterministic
algorithms, seeded init and data order). --minutes stops by wall clock and, without --steps, schedules
the LR by elapsed time, so the stopping step depends on the machine.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import numpy as np  # noqa: E402
import torch  # noqa: E402

import export as X  # noqa: E402
import model as M  # noqa: E402


def preset(name: str, vocab: int, ctx: int) -> M.V41Config:
    if name == "smoke":  # CPU: a few steps in seconds; every V4.1 role present
        return M.V41Config(vocab_size=vocab, dim=128, compress_ratios=(0, 2, 2, 2, 1, 1, 1),
                           kv_source_layers=(1, 3, 4), index_source_layers=(1, 3, 4, 6), candidate_source_layer=4,
                           candidate_topk_blocks=ctx // 8, candidate_block_size=8, n_heads=2, head_dim=128,
                           q_lora_rank=64, o_groups=2, o_lora_rank=32, moe_inter_dim=64, n_routed_experts=4,
                           n_activated_experts=2, window_size=16, index_n_heads=2, index_head_dim=64, index_topk=ctx,
                           max_seq_len=ctx, dspark_target_layer_ids=(4, 5, 6))
    if name == "h200":  # the GPU run: ~22 MB on disk (see README)
        return M.V41Config(vocab_size=vocab, dim=256, compress_ratios=(0, 0, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1),
                           kv_source_layers=(2, 5, 7), index_source_layers=(2, 5, 7, 9, 11), candidate_source_layer=7,
                           candidate_topk_blocks=ctx // 8, candidate_block_size=8, n_heads=4, head_dim=128,
                           q_lora_rank=128, o_groups=2, o_lora_rank=128, moe_inter_dim=256, n_routed_experts=8,
                           n_activated_experts=2, window_size=64, index_n_heads=4, index_head_dim=64, index_topk=ctx,
                           max_seq_len=ctx, dspark_target_layer_ids=(9, 10, 11))
    raise SystemExit(f"unknown preset {name}")


def tokenize_file(tok, path: str, max_chars: int | None = None) -> list[int]:
    with open(path, encoding="utf-8") as f:
        text = f.read() if max_chars is None else f.read(max_chars)
    if max_chars is None:
        # big files: encode paragraph blocks in parallel (a split between blocks only at "\n\n\n"
        # document boundaries, where the pre-tokenizer splits anyway)
        docs = text.split("\n\n\n")
        enc = tok.encode_batch([d + "\n\n\n" if i + 1 < len(docs) else d for i, d in enumerate(docs)],
                               add_special_tokens=False)
        return [i for e in enc for i in e.ids]
    return tok.encode(text, add_special_tokens=False).ids


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="h200", choices=["h200", "smoke"])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=0, help="optimizer steps (0: until --minutes)")
    ap.add_argument("--minutes", type=float, default=0.0, help="wall-clock budget for the training loop")
    ap.add_argument("--corpus", default=os.path.join(REPO, "build/train/corpus"))
    ap.add_argument("--tokenizer", default=os.path.join(REPO, "build/train/tokenizer"))
    ap.add_argument("--out", required=True)
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--min-lr-frac", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--wd", type=float, default=0.1)
    ap.add_argument("--bias-rate", type=float, default=1e-3, help="gate-bias balancing step")
    ap.add_argument("--no-qat", action="store_true", help="train without fake quantisation / BF16 roundings")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model (untested on GPU)")
    ap.add_argument("--train-chars", type=int, default=0, help="use only the first N characters of train.txt")
    ap.add_argument("--eval-chars", type=int, default=0, help="held-out characters to evaluate (0: all)")
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--deepinfer", default=os.path.join(REPO, "build/src/deepinfer"))
    args = ap.parse_args(argv)
    if not args.steps and not args.minutes:
        ap.error("give --steps and/or --minutes")

    t_start = time.time()
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    torch.use_deterministic_algorithms(True, warn_only=True)
    dev = torch.device(args.device)
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    os.makedirs(args.out, exist_ok=True)

    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(args.tokenizer, "tokenizer.json"))
    vocab = tok.get_vocab_size()
    train_ids = tokenize_file(tok, os.path.join(args.corpus, "train.txt"), args.train_chars or None)
    # The held-out file the engine will score: the whole held-out text or its first --eval-chars
    # characters, cut at a paragraph boundary.
    with open(os.path.join(args.corpus, "heldout.txt"), encoding="utf-8") as f:
        held_text = f.read()
    if args.eval_chars and len(held_text) > args.eval_chars:
        cut = held_text.rfind("\n\n", 0, args.eval_chars)
        held_text = held_text[: cut if cut > 0 else args.eval_chars]
    held_path = os.path.join(args.out, "heldout_eval.txt")
    with open(held_path, "w", encoding="utf-8") as f:
        f.write(held_text)
    held_ids = tok.encode(held_text, add_special_tokens=False).ids
    data = torch.tensor(train_ids, dtype=torch.long)
    print(f"tokens: train {len(train_ids)}, held-out {len(held_ids)}, vocab {vocab} "
          f"({time.time() - t_start:.1f}s)", flush=True)

    cfg = preset(args.preset, vocab, args.ctx)
    model = M.V41Model(cfg).to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    n_expert = sum(p.numel() for blk in model.layers for p in (blk.ffn.w1, blk.ffn.w2, blk.ffn.w3))
    active = n_params - n_expert * (1 - cfg.n_activated_experts / cfg.n_routed_experts)
    print(f"model: {n_params / 1e6:.2f}M parameters ({n_expert / 1e6:.2f}M routed-expert, "
          f"{active / 1e6:.2f}M active per token)", flush=True)
    num = M.Numerics.train(qat=not args.no_qat)
    fwd = torch.compile(model) if args.compile else model

    decay, no_decay = [], []
    for n, p in model.named_parameters():
        (decay if p.dim() >= 2 and "hc_" not in n else no_decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.wd}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=dev.type == "cuda")
    gen = torch.Generator().manual_seed(args.seed + 1)
    budget = args.minutes * 60.0 if args.minutes else None

    def lr_at(step: int, elapsed: float) -> float:
        if step < args.warmup:
            return args.lr * (step + 1) / args.warmup
        frac = 0.0
        if args.steps:
            frac = max(frac, (step - args.warmup) / max(1, args.steps - args.warmup))
        if budget and not args.steps:
            frac = max(frac, elapsed / budget)
        frac = min(frac, 1.0)
        return args.lr * (args.min_lr_frac + (1 - args.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * frac)))

    log = open(os.path.join(args.out, "loss.csv"), "w", newline="")
    w = csv.writer(log)
    w.writerow(["step", "tokens", "loss", "lr", "elapsed_s", "tokens_per_s"])
    model.train()
    t0 = time.time()
    step, tokens, ema = 0, 0, None
    n_windows = len(data) - args.ctx - 1
    while True:
        elapsed = time.time() - t0
        if (args.steps and step >= args.steps) or (budget and elapsed >= budget):
            break
        lr = lr_at(step, elapsed)
        for g in opt.param_groups:
            g["lr"] = lr
        starts = torch.randint(0, n_windows, (args.batch,), generator=gen)
        idx = starts[:, None] + torch.arange(args.ctx + 1)[None, :]
        batch = data[idx].to(dev, non_blocking=True)
        x, y = batch[:, :-1], batch[:, 1:]
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
            logits = fwd(x, num=num)
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, vocab), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        model.update_gate_bias(args.bias_rate)
        step += 1
        tokens += x.numel()
        if step % args.log_every == 0 or step == 1 or (args.steps and step == args.steps):
            lv = loss.item()
            ema = lv if ema is None else 0.9 * ema + 0.1 * lv
            el = time.time() - t0
            w.writerow([step, tokens, f"{lv:.5f}", f"{lr:.6g}", f"{el:.2f}", f"{tokens / el:.0f}"])
            log.flush()
            print(f"step {step} loss {lv:.4f} (ema {ema:.4f}) lr {lr:.2e} {tokens / el:.0f} tok/s {el:.0f}s", flush=True)
    log.close()
    train_s = time.time() - t0
    print(f"trained {step} steps, {tokens} tokens in {train_s:.1f}s", flush=True)

    # Plot.
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        rows = list(csv.DictReader(open(os.path.join(args.out, "loss.csv"))))
        fig, ax = plt.subplots(figsize=(7, 4))
        ax.plot([int(r["tokens"]) for r in rows], [float(r["loss"]) for r in rows])
        ax.set_xlabel("training tokens")
        ax.set_ylabel("cross-entropy (nats)")
        ax.set_title(f"V4.1 {args.preset}: {n_params / 1e6:.1f}M params, seed {args.seed}")
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(os.path.join(args.out, "loss.png"), dpi=120)
    except ImportError:
        print("matplotlib is not installed: no loss.png (pip install matplotlib)", flush=True)

    # Export, load back the exported values, evaluate with the engine's numerics.
    model_dir = os.path.join(args.out, "model")
    info = X.export(model.cpu(), model_dir, args.tokenizer)
    size = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(model_dir) for f in fs)
    print(f"exported {info['tensors']} tensors to {model_dir}: model.safetensors {info['file_bytes'] / 1e6:.2f} MB, "
          f"directory {size / 1e6:.2f} MB", flush=True)
    loaded = X.load(model_dir, device=str(dev))
    t1 = time.time()
    nll, scored = M.perplexity(loaded, held_ids, args.ctx, device=dev, batch=8)
    ppl = math.exp(nll)
    print(f"held-out (PyTorch, engine numerics): {scored} tokens, NLL {nll:.5f}, perplexity {ppl:.4f} "
          f"({time.time() - t1:.1f}s)", flush=True)
    summary = {"preset": args.preset, "seed": args.seed, "steps": step, "tokens": tokens, "train_seconds": train_s,
               "params": n_params, "active_params": active, "safetensors_bytes": info["file_bytes"],
               "dir_bytes": size, "heldout_tokens_scored": scored, "heldout_nll": nll, "heldout_ppl_pytorch": ppl,
               "config": cfg.to_dict(), "qat": not args.no_qat}
    cmd = [args.deepinfer, "perplexity", "--model", model_dir, "--text-file", held_path,
           "--max-tokens-per-window", str(args.ctx)]
    if os.path.exists(args.deepinfer):
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode == 0:
            eng = float(r.stdout.split("perplexity:")[1].split()[0])
            summary["heldout_ppl_deepinfer"] = eng
            print(f"held-out (deepinfer perplexity): {eng:.4f}; PyTorch {ppl:.4f}; "
                  f"3 significant digits {'agree' if f'{eng:.3g}' == f'{ppl:.3g}' else 'DIFFER'}", flush=True)
        else:
            print(f"deepinfer perplexity failed: {r.stderr.strip()}", flush=True)
    else:
        print("compare with: " + " ".join(cmd), flush=True)
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    print(f"total {time.time() - t_start:.1f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

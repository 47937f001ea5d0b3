#!/usr/bin/env python3
"""Held-out perplexity of an exported checkpoint in PyTorch (tools/train/model.py, the engine's numerics),
windowed exactly as `deepinfer perplexity --max-tokens-per-window WINDOW`.

    python3 tools/train/eval_perplexity.py --model models/mini-v41 --text tests/data/train/heldout.txt \
        --window 256 --json tests/data/train/mini_v41_perplexity.json

The JSON (model, text, window, tokens, NLL, perplexity, the text's sha256) is the golden that
tests/python/test_default_model.py holds `deepinfer perplexity` to. With --prompt (repeatable) it also
records PyTorch's greedy continuation of each prompt (--max-new tokens) and, teacher-forced over it,
the top token and its margin at each position, which the test holds `deepinfer logits` to.
"""
import argparse
import hashlib
import json
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

import export as X  # noqa: E402
import model as M  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--text", required=True)
    ap.add_argument("--window", type=int, default=256)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--json", help="write the result here")
    ap.add_argument("--prompt", action="append", default=[], help="a prompt to continue greedily (repeatable)")
    ap.add_argument("--max-new", type=int, default=32)
    args = ap.parse_args()
    torch.manual_seed(0)
    raw = open(args.text, "rb").read()
    tok = Tokenizer.from_file(os.path.join(args.model, "tokenizer.json"))
    ids = tok.encode(raw.decode("utf-8"), add_special_tokens=False).ids
    model = X.load(args.model, device=args.device)
    with torch.no_grad():
        nll, scored = M.perplexity(model, ids, args.window, device=args.device, batch=8)
    res = {"model": args.model, "text": args.text, "text_sha256": hashlib.sha256(raw).hexdigest(),
           "window": args.window, "tokens": len(ids), "scored": scored, "nll": nll, "perplexity": math.exp(nll)}
    greedy = []
    for text in args.prompt:
        seq = tok.encode(text, add_special_tokens=False).ids
        out = []
        with torch.no_grad():
            for _ in range(args.max_new):
                logits = model(torch.tensor([seq + out], dtype=torch.long, device=args.device))
                out.append(int(logits[0, -1].argmax()))
            # Teacher-forced over prompt + continuation: PyTorch's top token and its lead over the runner-up
            # at every position that predicts a continuation token (near-ties are where a rounding flip
            # may legitimately change the engine's argmax).
            logits = model(torch.tensor([seq + out], dtype=torch.long, device=args.device))[0, len(seq) - 1:-1]
            top2 = logits.double().topk(2, dim=-1)
        greedy.append({"prompt": text, "prompt_ids": seq, "greedy_ids": out, "text": tok.decode(out),
                       "argmax": top2.indices[:, 0].tolist(),
                       "margin": [round(float(m), 5) for m in (top2.values[:, 0] - top2.values[:, 1])]})
    if greedy:
        res["greedy"] = greedy
    print(json.dumps(res, indent=2, ensure_ascii=False))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2, ensure_ascii=False)
            f.write("\n")


if __name__ == "__main__":
    main()

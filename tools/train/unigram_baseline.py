#!/usr/bin/env python3
"""Unigram baseline perplexity: the held-out text scored by token frequencies of the training split.

    python3 tools/train/unigram_baseline.py --model models/mini-v41 --corpus build/train/corpus

Both splits are tokenised with the model's tokenizer.json (HF `tokenizers`, which our C++ tokenizer
matches id for id); p(t) = (count(t) + 1) / (N + V) (add-one over the model's vocabulary), and the
perplexity is exp(mean -log p) over every held-out token, the figure `deepinfer perplexity` is set against.
"""
import argparse
import math
import os

import numpy as np
from tokenizers import Tokenizer


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="models/mini-v41")
    ap.add_argument("--corpus", default="build/train/corpus")
    ap.add_argument("--heldout", help="held-out text (default: CORPUS/heldout.txt)")
    args = ap.parse_args()
    tok = Tokenizer.from_file(os.path.join(args.model, "tokenizer.json"))
    vocab = tok.get_vocab_size(with_added_tokens=True)
    with open(os.path.join(args.corpus, "train.txt"), encoding="utf-8") as f:
        train = f.read()
    with open(args.heldout or os.path.join(args.corpus, "heldout.txt"), encoding="utf-8") as f:
        held = f.read()
    # Encode paragraph by paragraph (one 19 MB string is slow in `tokenizers`); the blank-line separators
    # themselves are left out of the counts, a negligible share of the tokens.
    counts = np.zeros(vocab, dtype=np.int64)
    for enc in tok.encode_batch(train.split("\n\n"), add_special_tokens=False):
        np.add.at(counts, np.asarray(enc.ids, dtype=np.int64), 1)
    held_ids = np.asarray(tok.encode(held, add_special_tokens=False).ids, dtype=np.int64)
    logp = np.log((counts + 1.0) / (counts.sum() + vocab))
    nll = float(-logp[held_ids].mean())
    print(f"train tokens {int(counts.sum())}, vocab {vocab}, held-out tokens {held_ids.size}")
    print(f"unigram held-out NLL {nll:.5f}, perplexity {math.exp(nll):.2f}")


if __name__ == "__main__":
    main()

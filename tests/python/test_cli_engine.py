"""The engine-backed subcommands: `deepinfer bench`, `deepinfer perplexity`, `deepinfer chat`, for both
model families (V4 tiny, V4.1 tiny), and the V4.1 bounded-replay variables (DEEPINFER_YOCO_PREFILL_*)
through them."""
import math
import re
import shutil

import numpy as np
import pytest

FAMILIES = ["v4", "v41"]

TEXT = ("The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with a "
        "single step. To be, or not to be, that is the question.\n")


def _fails(run_cli, args, *needles, input=None):
    r = run_cli(args, check=False, input=input)
    assert r.returncode != 0, f"expected failure, got rc 0: {r.stdout}"
    assert r.returncode < 128, f"crashed with signal {r.returncode - 128}: {r.stderr}"
    assert r.stderr.startswith("error:") or "error" in r.stderr, r.stderr
    for n in needles:
        assert n in r.stderr, f"{n!r} not in error: {r.stderr}"
    return r


def _table(stdout):
    rows = {}
    for line in stdout.splitlines():
        m = re.match(r"^(.*?)\s{2,}(\S+)$", line.strip())
        if m:
            rows[m.group(1).strip()] = m.group(2)
    return rows


# --- bench ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("concurrency", [None, 2])
def test_bench_table(make_checkpoint, run_cli, concurrency, family):
    model = make_checkpoint("tiny", seed=0, family=family)
    args = ["bench", "--model", model, "--input-len", "12", "--output-len", "5", "--num-prompts", "4",
            "--max-model-len", "256"]
    if concurrency:
        args += ["--concurrency", str(concurrency)]
    r = run_cli(args, timeout=120)
    t = _table(r.stdout)
    for key in ["requests", "total time (s)", "input tok/s", "output tok/s", "TTFT p50 (ms)", "TTFT p99 (ms)",
                "TPOT p50 (ms)", "TPOT p99 (ms)", "steps", "model share of step time (%)"]:
        assert key in t, f"{key!r} missing from\n{r.stdout}"
    assert int(t["requests"]) == 4
    assert int(t["input tokens"]) == 48 and int(t["output tokens"]) == 20  # ignore_eos: exactly output-len each
    total = float(t["total time (s)"])
    assert total > 0
    # The total is printed with 3 decimals: the rates must fit any time that rounds to it (+1% for
    # the rates' own rounding).
    lo, hi = max(total - 5e-4, 1e-9), total + 5e-4
    for key, n in (("output tok/s", 20), ("input tok/s", 48)):
        assert n / hi * 0.99 <= float(t[key]) <= n / lo * 1.01, f"{key} {t[key]} vs {n} tokens in {total} s"
    ttft50, ttft99 = float(t["TTFT p50 (ms)"]), float(t["TTFT p99 (ms)"])
    tpot50, tpot99 = float(t["TPOT p50 (ms)"]), float(t["TPOT p99 (ms)"])
    assert 0 < ttft50 <= ttft99 <= total * 1e3 + 1
    assert 0 < tpot50 <= tpot99 <= total * 1e3 + 1
    steps = int(t["steps"])
    # At least prefill + 4 decode steps per request wave; at most one step per token of work.
    assert 5 <= steps <= 4 * (1 + 5) + 1
    if concurrency:
        assert steps >= 2 * 5  # two waves of two
    share = float(t["model share of step time (%)"])
    assert 0 < share <= 100


def test_bench_bad_input(make_checkpoint, run_cli):
    model = make_checkpoint("tiny", seed=0)
    _fails(run_cli, ["bench", "--model", model, "--input-len", "300", "--output-len", "5", "--max-model-len", "256"],
           "max_model_len")


# --- perplexity -----------------------------------------------------------------------------------

def _ppl(run_cli, model, text_file, *extra):
    r = run_cli(["perplexity", "--model", model, "--text-file", text_file, "--show-token-ids", *extra], timeout=120)
    m = re.search(r"token ids: ([0-9,]+)", r.stderr)
    assert m, r.stderr
    ids = [int(x) for x in m.group(1).split(",")]
    vals = dict(re.findall(r"^(tokens|scored tokens|mean NLL|perplexity): (\S+)$", r.stdout, re.M))
    return ids, vals


def _numpy_nll(run_cli, model, windows, tmp_path):
    """windows: list of (token list, first target index within the window). Sum of NLL, count."""
    out = tmp_path / "logits.bin"
    run_cli(["logits", "--model", model, "--input-ids", ";".join(",".join(map(str, w)) for w, _ in windows),
             "--out", out], timeout=120)
    flat = np.fromfile(out, dtype=np.float32).astype(np.float64)
    n_tok = sum(len(w) for w, _ in windows)
    logits = flat.reshape(n_tok, -1)
    nll, count, row = 0.0, 0, 0
    for w, first in windows:
        lg = logits[row:row + len(w)]
        row += len(w)
        mx = lg.max(axis=1, keepdims=True)
        logp = lg - mx - np.log(np.exp(lg - mx).sum(axis=1, keepdims=True))
        for t in range(first, len(w)):
            nll -= logp[t - 1, w[t]]
            count += 1
    return nll, count


@pytest.mark.parametrize("family", FAMILIES)
def test_perplexity_matches_numpy(make_checkpoint, run_cli, tmp_path, family):
    model = make_checkpoint("tiny", seed=0, family=family)
    f = tmp_path / "text.txt"
    f.write_text(TEXT)
    ids, vals = _ppl(run_cli, model, f)
    assert int(vals["tokens"]) == len(ids) and len(ids) > 10
    assert int(vals["scored tokens"]) == len(ids) - 1
    nll, count = _numpy_nll(run_cli, model, [(ids, 1)], tmp_path)
    mean = nll / count
    assert float(vals["mean NLL"]) == pytest.approx(mean, rel=1e-4)
    assert float(vals["perplexity"]) == pytest.approx(math.exp(mean), rel=1e-4)


@pytest.mark.parametrize("family", FAMILIES)
def test_perplexity_windows_stride(make_checkpoint, run_cli, tmp_path, family):
    model = make_checkpoint("tiny", seed=0, family=family)
    f = tmp_path / "text.txt"
    f.write_text(TEXT)
    W, S = 16, 8
    ids, vals = _ppl(run_cli, model, f, "--max-tokens-per-window", W, "--stride", S)
    n = len(ids)
    windows, prev_end, s = [], 0, 0
    while s < n - 1 and prev_end < n:
        e = min(s + W, n)
        first = max(s + 1, prev_end)
        if first < e:
            windows.append((ids[s:e], first - s))
        prev_end = e
        s += S
    assert len(windows) > 2
    nll, count = _numpy_nll(run_cli, model, windows, tmp_path)
    assert int(vals["scored tokens"]) == count == n - 1
    assert float(vals["mean NLL"]) == pytest.approx(nll / count, rel=1e-4)
    assert float(vals["perplexity"]) == pytest.approx(math.exp(nll / count), rel=1e-4)


def test_perplexity_bad_input(make_checkpoint, run_cli, tmp_path):
    model = make_checkpoint("tiny", seed=0)
    _fails(run_cli, ["perplexity", "--model", model, "--text-file", tmp_path / "missing.txt"], "missing.txt")
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    _fails(run_cli, ["perplexity", "--model", model, "--text-file", empty], "empty")
    one = tmp_path / "one.txt"
    one.write_text("a")
    _fails(run_cli, ["perplexity", "--model", model, "--text-file", one], "at least 2")
    f = tmp_path / "text.txt"
    f.write_text(TEXT)
    _fails(run_cli, ["perplexity", "--model", model, "--text-file", f, "--max-tokens-per-window", "8",
                     "--stride", "9"], "--stride")
    no_tok = tmp_path / "no-tok"
    shutil.copytree(model, no_tok)
    (no_tok / "tokenizer.json").unlink()
    _fails(run_cli, ["perplexity", "--model", no_tok, "--text-file", f], "tokenizer.json")


# --- chat -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("family", FAMILIES)
def test_chat_piped(make_checkpoint, run_cli, family):
    model = make_checkpoint("tiny", seed=0, family=family)
    r = run_cli(["chat", "--model", model, "--max-tokens", "6", "--seed", "1", "--max-model-len", "512"],
                input="Hello there\nHow are you?\n", timeout=120)
    assert r.returncode == 0
    # One reply per user line: each ends with a newline.
    assert r.stdout.count("\n") >= 2, repr(r.stdout)
    # Deterministic for a fixed seed.
    r2 = run_cli(["chat", "--model", model, "--max-tokens", "6", "--seed", "1", "--max-model-len", "512"],
                 input="Hello there\nHow are you?\n", timeout=120)
    assert r2.stdout == r.stdout


@pytest.mark.parametrize("family", FAMILIES)
def test_chat_thinking_and_exit(make_checkpoint, run_cli, family):
    model = make_checkpoint("tiny", seed=0, family=family)
    r = run_cli(["chat", "--model", model, "--thinking", "--reasoning-effort", "high", "--max-tokens", "6",
                 "--temperature", "0", "--max-model-len", "512"],
                input="first question\n/exit\nnever read\n", timeout=120)
    assert r.returncode == 0
    # Thinking mode without "</think>" in 6 random tokens: the reply is (almost surely) reasoning, on stderr.
    assert "[thinking] " in r.stderr or r.stdout.strip(), (r.stdout, r.stderr)
    # Only the first line was answered: a single newline-terminated reply.
    assert r.stdout.count("\n") >= 1
    # EOF at once: no reply, exit 0.
    r = run_cli(["chat", "--model", model, "--max-model-len", "512"], input="", timeout=60)
    assert r.returncode == 0 and r.stdout == ""


def test_chat_bad_input(make_checkpoint, run_cli, tmp_path):
    model = make_checkpoint("tiny", seed=0)
    no_tok = tmp_path / "no-tok"
    shutil.copytree(model, no_tok)
    (no_tok / "tokenizer.json").unlink()
    _fails(run_cli, ["chat", "--model", no_tok], "tokenizer.json", input="hi\n")
    _fails(run_cli, ["chat", "--model", model, "--reasoning-effort", "bogus", "--max-model-len", "512"],
           input="hi\n")


# --- V4.1 bounded replay variables ----------------------------------------------------------------

@pytest.mark.parametrize("var,value", [("DEEPINFER_YOCO_PREFILL_TRUNCATION_MODE", "bogus"),
                                       ("DEEPINFER_YOCO_PREFILL_KEEP_TOKENS", "0"),
                                       ("DEEPINFER_YOCO_PREFILL_KEEP_TOKENS", "abc")])
def test_bounded_replay_bad_values(make_checkpoint, run_cli, var, value):
    """A bad DEEPINFER_YOCO_PREFILL_* value is an error naming the variable and the value, before any
    work (bench and chat), not a crash."""
    model = make_checkpoint("tiny", seed=0, family="v41")
    env = {var: value, "DEEPINFER_YOCO_PREFILL_TRUNCATION_MODE": "compact"} if "KEEP" in var else {var: value}
    for args, stdin in ((["bench", "--model", model, "--input-len", "4", "--output-len", "2", "--num-prompts", "1",
                          "--max-model-len", "64"], None),
                        (["chat", "--model", model, "--max-tokens", "2", "--max-model-len", "64"], "hi\n")):
        r = run_cli(args, check=False, input=stdin, env=env)
        assert r.returncode != 0, f"{args[0]}: expected failure, got rc 0: {r.stdout}"
        assert r.returncode < 128 and r.returncode > 0, f"{args[0]}: crashed ({r.returncode}): {r.stderr}"
        assert var in r.stderr and f"'{value}'" in r.stderr, f"{args[0]}: {r.stderr}"
        assert "Traceback" not in r.stderr


def test_bounded_replay_off_and_compact_bench(make_checkpoint, run_cli):
    """`bench` on V4.1 runs in both modes, with prompts longer than KEEP in compact mode."""
    model = make_checkpoint("tiny", seed=0, family="v41")
    for env in ({"DEEPINFER_YOCO_PREFILL_TRUNCATION_MODE": "off"},
                {"DEEPINFER_YOCO_PREFILL_TRUNCATION_MODE": "compact", "DEEPINFER_YOCO_PREFILL_KEEP_TOKENS": "12"}):
        r = run_cli(["bench", "--model", model, "--input-len", "40", "--output-len", "3", "--num-prompts", "3",
                     "--max-model-len", "256"], env=env, timeout=120)
        t = _table(r.stdout)
        assert int(t["requests"]) == 3 and int(t["output tokens"]) == 9, (env, r.stdout)

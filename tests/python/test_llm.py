"""The Python offline API: deepinfer.LLM over the engine (continuous batching, seeded sampling), for
both model families (V4 tiny and V4.1 tiny), plus V4.1's SWA bounded replay
(DEEPINFER_YOCO_PREFILL_TRUNCATION_MODE / DEEPINFER_YOCO_PREFILL_KEEP_TOKENS)."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import deepinfer

FAMILIES = ["v4", "v41"]
MODE_VAR, KEEP_VAR = "DEEPINFER_YOCO_PREFILL_TRUNCATION_MODE", "DEEPINFER_YOCO_PREFILL_KEEP_TOKENS"


@pytest.fixture(scope="module", params=FAMILIES)
def model_dir(request, make_checkpoint):
    return make_checkpoint("tiny", seed=0, family=request.param)


@pytest.fixture(scope="module")
def llm(model_dir):
    return deepinfer.LLM(model=str(model_dir), kv_cache_memory=1 << 28, max_model_len=4096)


def _tokens(outs):
    return [[list(c.token_ids) for c in o.outputs] for o in outs]


def _teacher_forced_argmax(run_cli, model, prompt, generated, tmp_path):
    """argmax of `deepinfer logits` over prompt + generated[:-1] at the positions that produced
    each generated token (teacher forcing: the logits of one prefill, no sampling)."""
    ids = list(prompt) + list(generated[:-1])
    out = tmp_path / "tf.bin"
    run_cli(["logits", "--model", model, "--input-ids", ",".join(map(str, ids)), "--out", out])
    logits = np.fromfile(out, dtype=np.float32).reshape(len(ids), -1)
    return logits[len(prompt) - 1:].argmax(-1).tolist()


def test_seeded_results_do_not_depend_on_the_batch(llm):
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, 1024, int(rng.integers(1, 60))).tolist() for _ in range(16)]
    params = [deepinfer.SamplingParams(temperature=float(rng.uniform(0.3, 1.5)), top_p=float(rng.uniform(0.5, 1.0)),
                                       top_k=int(rng.integers(0, 50)), max_tokens=int(rng.integers(1, 20)),
                                       seed=int(rng.integers(0, 2**31)), ignore_eos=True) for _ in prompts]
    together = _tokens(llm.generate(prompts, params))
    alone = [_tokens(llm.generate([p], [sp]))[0] for p, sp in zip(prompts, params)]
    order = rng.permutation(len(prompts))
    shuffled = _tokens(llm.generate([prompts[i] for i in order], [params[i] for i in order]))
    assert together == alone
    assert [shuffled[list(order).index(i)] for i in range(len(prompts))] == together
    for toks, sp in zip(together, params):
        assert len(toks[0]) == sp.max_tokens


def test_greedy_matches_the_cli(llm, run_cli, model_dir, tmp_path):
    """Greedy through the engine == `deepinfer generate` == the argmax chain of `deepinfer logits`
    (teacher-forced on the generated tokens), for a short prompt and one past the V4.1 window."""
    for prompt in ([0, 17, 42, 7, 99], np.random.default_rng(4).integers(3, 1024, 37).tolist()):
        out = llm.generate(prompt, deepinfer.SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))[0]
        engine = list(out.outputs[0].token_ids)
        cli = run_cli(["generate", "--model", model_dir, "--prompt-ids", ",".join(map(str, prompt)),
                       "--max-tokens", "12", "--ignore-eos"])
        assert engine == [int(t) for t in cli.stdout.strip().split(",")]
        assert engine == _teacher_forced_argmax(run_cli, model_dir, prompt, engine, tmp_path)


def test_n_text_logprobs_and_finish_reasons(llm):
    out = llm.generate("Hello world", deepinfer.SamplingParams(n=3, max_tokens=5, seed=7, logprobs=2,
                                                               ignore_eos=True))[0]
    assert len(out.outputs) == 3 and out.finished
    for c in out.outputs:
        assert len(c.token_ids) == 5 and c.finish_reason == "length"
        assert len(c.logprobs) == 5 and all(len(lp.top) == 2 for lp in c.logprobs)
        assert c.cumulative_logprob == pytest.approx(sum(lp.logprob for lp in c.logprobs), rel=1e-5)
        assert c.text == llm.tokenizer.decode(list(c.token_ids), skip_special_tokens=True)


def test_bad_input_is_a_clear_error(llm, model_dir):
    with pytest.raises(ValueError, match="temperature"):
        deepinfer.SamplingParams(temperature=-1)
    with pytest.raises(ValueError, match="top_p"):
        deepinfer.SamplingParams(top_p=0)
    with pytest.raises(TypeError, match="unknown engine argument"):
        deepinfer.LLM(model=str(model_dir), max_num_seq=3)
    bad = llm.generate([[5, 2000]], deepinfer.SamplingParams(max_tokens=2))  # 2000 >= vocab 1024
    assert bad[0].error or bad[0].outputs[0].finish_reason == "abort"
    ok = llm.generate([[5, 6]], deepinfer.SamplingParams(max_tokens=2, ignore_eos=True))  # engine still usable
    assert len(ok[0].outputs[0].token_ids) == 2


def test_chat_parses_reasoning_and_content(llm):
    choices = llm.chat([{"role": "user", "content": "hi"}], deepinfer.SamplingParams(max_tokens=8, seed=3),
                       thinking=True)
    c = choices[0]
    assert c.reasoning_content + c.content != "" or c.tool_calls or c.text == ""
    assert c.finish_reason in ("stop", "length")


def test_prompt_logprobs_match_the_logits(llm, run_cli, model_dir, tmp_path):
    """prompt_logprobs (vLLM's meaning): entry i is the raw log-softmax of prompt token i given the
    tokens before it; entry 0 is None. Checked against `deepinfer logits` of the same prompt, also
    when the prompt is prefilled in small chunks."""
    prompt = np.random.default_rng(21).integers(3, 1024, 40).tolist()
    out = tmp_path / "l.bin"
    run_cli(["logits", "--model", model_dir, "--input-ids", ",".join(map(str, prompt)), "--out", out])
    logits = np.fromfile(out, dtype=np.float32).reshape(len(prompt), -1).astype(np.float64)
    ref = logits - logits.max(-1, keepdims=True)
    ref = ref - np.log(np.exp(ref).sum(-1, keepdims=True))
    chunked = deepinfer.LLM(model=str(model_dir), kv_cache_memory=1 << 28, max_model_len=4096,
                            max_num_batched_tokens=7)
    for engine in (llm, chunked):
        res = engine.generate(prompt, deepinfer.SamplingParams(max_tokens=1, prompt_logprobs=3))[0]
        pl = res.prompt_logprobs
        assert len(pl) == len(prompt) and pl[0] is None
        for i in range(1, len(prompt)):
            assert pl[i].token == prompt[i]
            assert pl[i].logprob == pytest.approx(ref[i - 1, prompt[i]], abs=1e-4)
            assert len(pl[i].top) == 3
            top_ids = [t for t, _ in pl[i].top]
            assert top_ids == list(np.argsort(-ref[i - 1], kind="stable")[:3])


# --- V4.1 SWA bounded replay (DEEPINFER_YOCO_PREFILL_*) -------------------------------------------
#
# tiny V4.1: kv sources 2, 4, 6, so layers 7, 8, 9 are the decoder layers that `compact` runs only
# over a prefill's last KEEP tokens; window 8. The last prompt row sees decoder-layer rows at most
# 3 * (8 - 1) = 21 positions back, so KEEP >= 22 is exact and a smaller KEEP (below the prompt length)
# is an approximation: it runs and gives valid tokens, usually with slightly different logprobs.

V41_RECEPTIVE_FIELD = 3 * (8 - 1) + 1

# Runs in a child process: a crash of the engine (a signal) fails one test instead of killing pytest.
_CHILD = r"""
import json, sys
import deepinfer
a = json.loads(sys.argv[1])
llm = deepinfer.LLM(model=a["model"], kv_cache_memory=1 << 28, max_model_len=4096, **a["engine"])
outs = llm.generate(a["prompts"], deepinfer.SamplingParams(temperature=0, max_tokens=a["max_tokens"],
                                                           ignore_eos=True, logprobs=1))
print(json.dumps([[list(o.outputs[0].token_ids), [lp.logprob for lp in o.outputs[0].logprobs]] for o in outs]))
"""


def _greedy(model, prompts, *, mode, keep=None, max_tokens=6, **engine):
    """(tokens, logprobs) per prompt, greedy, from a fresh engine in a child process with the
    bounded-replay variables set."""
    env = dict(os.environ)
    env[MODE_VAR] = mode
    env.pop(KEEP_VAR, None)
    if keep is not None:
        env[KEEP_VAR] = str(keep)
    env["PYTHONPATH"] = os.pathsep.join([str(Path(deepinfer.__file__).parents[1]), env.get("PYTHONPATH", "")])
    arg = json.dumps({"model": str(model), "engine": engine, "prompts": prompts, "max_tokens": max_tokens})
    try:
        r = subprocess.run([sys.executable, "-c", _CHILD, arg], capture_output=True, text=True, env=env, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail(f"engine child timed out ({mode=} {keep=} {engine=})", pytrace=False)
    what = f"{MODE_VAR}={mode} {KEEP_VAR}={keep} engine args {engine}, prompt lengths {[len(p) for p in prompts]}"
    assert r.returncode >= 0, f"engine child killed by signal {-r.returncode} ({what})\n{r.stderr[-2000:]}"
    assert r.returncode == 0, f"engine child failed ({what})\n{r.stderr[-2000:]}"
    return [(toks, lps) for toks, lps in json.loads(r.stdout)]


@pytest.fixture(scope="module")
def v41_model(make_checkpoint):
    return make_checkpoint("tiny", seed=1, family="v41")


def test_v41_bounded_replay_short_prompts_are_exact(v41_model):
    """Prompts no longer than KEEP: compact drops nothing, so tokens and logprobs equal `off` bit for
    bit (prompts in one batch, several shorter than the window)."""
    rng = np.random.default_rng(30)
    keep = 12
    prompts = [rng.integers(3, 1024, n).tolist() for n in (1, 5, 8, 11, 12)]
    off = _greedy(v41_model, prompts, mode="off")
    assert _greedy(v41_model, prompts, mode="compact", keep=keep) == off


def test_v41_bounded_replay_keep_covering_the_receptive_field_is_exact(v41_model):
    """KEEP >= the decoder layers' receptive field: identical to `off` whatever the prompt length;
    the default KEEP (140) too."""
    rng = np.random.default_rng(31)
    prompts = [rng.integers(3, 1024, n).tolist() for n in (23, 60, 141, 200)]
    off = _greedy(v41_model, prompts, mode="off")
    assert _greedy(v41_model, prompts, mode="compact", keep=V41_RECEPTIVE_FIELD) == off
    assert _greedy(v41_model, prompts, mode="compact", keep=None) == off  # default 140


def test_v41_bounded_replay_short_keep_runs_and_gives_valid_tokens(v41_model):
    """KEEP below the receptive field, prompt much longer than KEEP: an approximation. It runs, gives
    max_tokens valid tokens with finite logprobs; prompts up to KEEP in the same batch stay exact."""
    rng = np.random.default_rng(32)
    keep = 10
    prompts = [rng.integers(3, 1024, n).tolist() for n in (60, 9, 97)]
    off = _greedy(v41_model, prompts, mode="off")
    compact = _greedy(v41_model, prompts, mode="compact", keep=keep)
    for toks, lps in compact:
        assert len(toks) == 6 and all(0 <= t < 1024 for t in toks)
        assert all(np.isfinite(lp) and lp <= 0 for lp in lps)
    assert compact[1] == off[1]  # 9 <= KEEP tokens: nothing dropped
    # Deterministic: a second engine gives the same result (usually not equal to `off`: not asserted).
    assert _greedy(v41_model, prompts, mode="compact", keep=keep) == compact


@pytest.mark.parametrize("budget", [16, 64])
def test_v41_bounded_replay_with_chunked_prefill(v41_model, budget):
    """Chunked prefill (max_num_batched_tokens = budget) under compact: a chunk that lies entirely
    before the replay start skips the decoder layers completely. The engine must not crash, and the
    result must not depend on the chunking (the same rows run the decoder layers either way)."""
    rng = np.random.default_rng(33)
    keep = 10
    prompts = [rng.integers(3, 1024, 60).tolist()]
    one_step = _greedy(v41_model, prompts, mode="compact", keep=keep)
    chunked = _greedy(v41_model, prompts, mode="compact", keep=keep, max_num_batched_tokens=budget)
    assert chunked == one_step
    # With the default KEEP (140) and a prompt longer than 140 + budget (exact for tiny: KEEP covers
    # the receptive field), chunking must also equal `off`.
    long = [rng.integers(3, 1024, 300).tolist()]
    assert _greedy(v41_model, long, mode="compact", max_num_batched_tokens=budget) == \
        _greedy(v41_model, long, mode="off")


@pytest.mark.parametrize("var,value", [(MODE_VAR, "bogus"), (MODE_VAR, ""), (KEEP_VAR, "0"), (KEEP_VAR, "abc"),
                                       (KEEP_VAR, "-3"), (KEEP_VAR, "12x")])
def test_v41_bounded_replay_bad_values_are_clear_errors(v41_model, monkeypatch, var, value):
    monkeypatch.setenv(var, value)
    if var == KEEP_VAR:
        monkeypatch.setenv(MODE_VAR, "compact")
    with pytest.raises(deepinfer.Error, match=var) as e:
        deepinfer.LLM(model=str(v41_model), kv_cache_memory=1 << 28, max_model_len=512)
    assert repr(value) in str(e.value) or f"'{value}'" in str(e.value)


@pytest.mark.parametrize("keep", [None, 10], ids=["off", "compact-keep-10"])
def test_v41_seeded_tokens_survive_preemption(v41_model, monkeypatch, keep):
    """README: a seeded request gives the same tokens after preemption (recompute). Under compact
    bounded replay the re-prefill of prompt + generated tokens must replay the decoder layers over
    the same rows as the original prefill + decode did, or the tokens change once KEEP is below the
    decoder layers' receptive field (10 < 22 here). Preemption is detected through the engine's
    token count (recomputed tokens are scheduled twice)."""
    if keep is None:
        monkeypatch.setenv(MODE_VAR, "off")
    else:
        monkeypatch.setenv(MODE_VAR, "compact")
        monkeypatch.setenv(KEEP_VAR, str(keep))
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, 1024, int(rng.integers(20, 60))).tolist() for _ in range(8)]
    params = [deepinfer.SamplingParams(temperature=0.8, max_tokens=30, seed=i, ignore_eos=True) for i in range(8)]

    def run(budget):
        engine = deepinfer.LLM(model=str(v41_model), kv_cache_memory=budget, max_model_len=128)
        out = _tokens(engine.generate(prompts, params))
        return out, engine._engine.stats()["tokens"]

    # The bytes one sequence of max_model_len needs, from the engine's own error for a 1-byte budget.
    with pytest.raises(deepinfer.Error) as e:
        deepinfer.LLM(model=str(v41_model), kv_cache_memory=1, max_model_len=128)
    m = re.search(r"max_model_len \d+ tokens \((\d+) bytes\)", str(e.value))
    assert m, str(e.value)
    one = int(m.group(1))
    ref, ref_tokens = run(1 << 28)
    preempted = 0
    for factor in (1.7, 1.9, 2.5):  # room for one or two grown sequences: short ones join, then preempt
        budget = int(one * factor)
        out, tokens = run(budget)
        if tokens > ref_tokens:
            preempted += 1
            assert out == ref, f"kv-cache-memory {budget}: seeded tokens changed after preemption"
    assert preempted > 0, "no budget preempted: adjust the factors"

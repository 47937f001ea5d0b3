"""The Python offline API: deepinfer.LLM over the engine (continuous batching, seeded sampling)."""
import numpy as np
import pytest

import deepinfer


@pytest.fixture(scope="module")
def llm(make_checkpoint):
    return deepinfer.LLM(model=str(make_checkpoint("tiny", seed=0)), kv_cache_memory=1 << 28, max_model_len=4096)


def _tokens(outs):
    return [[list(c.token_ids) for c in o.outputs] for o in outs]


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


def test_greedy_matches_the_cli(llm, run_cli, make_checkpoint):
    prompt = [0, 17, 42, 7, 99]
    out = llm.generate(prompt, deepinfer.SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))[0]
    cli = run_cli(["generate", "--model", make_checkpoint("tiny", seed=0), "--prompt-ids", "0,17,42,7,99",
                   "--max-tokens", "12", "--ignore-eos"])
    assert list(out.outputs[0].token_ids) == [int(t) for t in cli.stdout.strip().split(",")]


def test_n_text_logprobs_and_finish_reasons(llm):
    out = llm.generate("Hello world", deepinfer.SamplingParams(n=3, max_tokens=5, seed=7, logprobs=2,
                                                               ignore_eos=True))[0]
    assert len(out.outputs) == 3 and out.finished
    for c in out.outputs:
        assert len(c.token_ids) == 5 and c.finish_reason == "length"
        assert len(c.logprobs) == 5 and all(len(lp.top) == 2 for lp in c.logprobs)
        assert c.cumulative_logprob == pytest.approx(sum(lp.logprob for lp in c.logprobs), rel=1e-5)
        assert c.text == llm.tokenizer.decode(list(c.token_ids), skip_special_tokens=True)


def test_bad_input_is_a_clear_error(llm, make_checkpoint):
    with pytest.raises(ValueError, match="temperature"):
        deepinfer.SamplingParams(temperature=-1)
    with pytest.raises(ValueError, match="top_p"):
        deepinfer.SamplingParams(top_p=0)
    with pytest.raises(TypeError, match="unknown engine argument"):
        deepinfer.LLM(model=str(make_checkpoint("tiny", seed=0)), max_num_seq=3)
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


def test_prompt_logprobs_match_the_logits(llm, run_cli, make_checkpoint, tmp_path):
    """prompt_logprobs (vLLM's meaning): entry i is the raw log-softmax of prompt token i given the
    tokens before it; entry 0 is None. Checked against `deepinfer logits` of the same prompt, also
    when the prompt is prefilled in small chunks."""
    prompt = np.random.default_rng(21).integers(3, 1024, 40).tolist()
    out = tmp_path / "l.bin"
    run_cli(["logits", "--model", make_checkpoint("tiny", seed=0), "--input-ids", ",".join(map(str, prompt)),
             "--out", out])
    logits = np.fromfile(out, dtype=np.float32).reshape(len(prompt), -1).astype(np.float64)
    ref = logits - logits.max(-1, keepdims=True)
    ref = ref - np.log(np.exp(ref).sum(-1, keepdims=True))
    chunked = deepinfer.LLM(model=str(make_checkpoint("tiny", seed=0)), kv_cache_memory=1 << 28,
                            max_model_len=4096, max_num_batched_tokens=7)
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

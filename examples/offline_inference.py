#!/usr/bin/env python3
"""Offline inference with deepinfer.

    python examples/offline_inference.py --model DIR

DIR is a DeepSeek-V4.1 (or V4) checkpoint directory (config.json, safetensors, tokenizer.json).
Without --model: $DEEPINFER_HF_MODEL_DIR, else the Hugging Face cache entry of
deepseek-ai/DeepSeek-V4.1-Flash-1017 (its newest snapshot under $HF_HUB_CACHE, $HF_HOME/hub or
~/.cache/huggingface/hub), else the shipped default model
(models/mini-v41). It says which one it used. Run from the repository root after
`make build` (PYTHONPATH=python).
"""
import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))
import deepinfer  # noqa: E402


HF_REPO = "deepseek-ai/DeepSeek-V4.1-Flash-1017"


def hf_cache_model(repo: str = HF_REPO):
    """The newest complete snapshot of `repo` in the Hugging Face cache, or None."""
    hub = os.environ.get("HF_HUB_CACHE") or os.path.join(
        os.environ.get("HF_HOME", os.path.join(os.path.expanduser("~"), ".cache", "huggingface")), "hub")
    snaps = Path(hub) / ("models--" + repo.replace("/", "--")) / "snapshots"
    found = [d for d in snaps.glob("*") if (d / "config.json").exists()] if snaps.is_dir() else []
    return str(max(found, key=lambda d: d.stat().st_mtime)) if found else None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model")
    ap.add_argument("--max-tokens", type=int, default=24)
    args = ap.parse_args()
    model, source = args.model, "--model"
    if not model and os.environ.get("DEEPINFER_HF_MODEL_DIR"):
        model, source = os.environ["DEEPINFER_HF_MODEL_DIR"], "DEEPINFER_HF_MODEL_DIR"
    if not model and hf_cache_model():
        model, source = hf_cache_model(), f"the Hugging Face cache ({HF_REPO})"
    if not model:
        model, source = str(ROOT / "models" / "mini-v41"), "the shipped default model"
    if not (Path(model) / "config.json").exists():
        sys.exit(f"no model at {model} ({source}); pass --model")
    print(f"model: {model} (from {source})")

    llm = deepinfer.LLM(model=model)
    prompts = ["The capital of France is", "def fibonacci(n):", "你好，"]
    params = deepinfer.SamplingParams(temperature=0.8, top_p=0.95, max_tokens=args.max_tokens, seed=0)
    for prompt, out in zip(prompts, llm.generate(prompts, params)):
        c = out.outputs[0]
        print(f"{prompt!r} -> {c.text!r} ({len(c.token_ids)} tokens, {c.finish_reason})")
    chat = llm.chat([{"role": "user", "content": "Say hello."}], deepinfer.SamplingParams(max_tokens=16, seed=1))
    print(f"chat -> content {chat[0].content!r}, reasoning {chat[0].reasoning_content!r}")


if __name__ == "__main__":
    main()

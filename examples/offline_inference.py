#!/usr/bin/env python3
"""Offline inference with deepinfer.

    python examples/offline_inference.py --model DIR

DIR is a DeepSeek-V4 checkpoint directory (config.json, safetensors, tokenizer.json). Without
--model: $DEEPINFER_HF_MODEL_DIR, else the default model that `make run` generates
(build/models/tiny-v41). Run from the repository root after `make build` (PYTHONPATH=python).
"""
import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))
import deepinfer  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model")
    ap.add_argument("--max-tokens", type=int, default=24)
    args = ap.parse_args()
    model, source = args.model, "--model"
    if not model and os.environ.get("DEEPINFER_HF_MODEL_DIR"):
        model, source = os.environ["DEEPINFER_HF_MODEL_DIR"], "DEEPINFER_HF_MODEL_DIR"
    if not model:
        model, source = str(ROOT / "build" / "models" / "tiny-v41"), "the default generated model (make run)"
    if not (Path(model) / "config.json").exists():
        sys.exit(f"no model at {model} ({source}); run `make run` once to generate the default model")
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

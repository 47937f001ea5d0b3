"""Offline inference in vLLM's shape: `LLM(model=...).generate(prompts, SamplingParams(...))`.

Prompts are strings (tokenised with the model's tokenizer.json, no special tokens added: DeepSeek
prompts carry their own BOS) or lists of token ids. `chat()` renders messages with DeepSeek's
prompt format (`encode_messages`), generates, and splits the text into reasoning, content and tool
calls with the streaming output parser.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Sequence

from . import _deepinfer

SamplingParams = _deepinfer.SamplingParams


@dataclass
class ChatCompletionOutput:
    """One generated choice of `LLM.chat`: the raw output plus its parsed parts."""
    index: int
    text: str
    token_ids: list
    finish_reason: str | None
    reasoning_content: str
    content: str
    tool_calls: list = field(default_factory=list)


class LLM:
    """An offline engine over a DeepSeek-V4 checkpoint directory (config.json + safetensors).

    Engine arguments use vLLM's names: max_num_batched_tokens, max_num_seqs, max_model_len,
    kv_cache_memory (bytes), seed, enable_chunked_prefill, async_scheduling (default True),
    enforce_eager (default False: CUDA graphs for decode steps),
    device ("cuda" | "cpu" | "auto", default auto: cuda when a GPU is visible),
    dtype ("bfloat16" | "float32"), simulate_qat, tokenizer, skip_tokenizer_init.
    """

    def __init__(self, model: str | None = None, **engine_args: Any):
        model = model or os.environ.get("DEEPINFER_HF_MODEL_DIR")
        if not model:
            raise ValueError("LLM: give model=<checkpoint directory> (or set DEEPINFER_HF_MODEL_DIR)")
        self.model = str(model)
        self._engine = _deepinfer.Engine(self.model, **engine_args)
        tok_dir = engine_args.get("tokenizer") or self.model
        self.tokenizer = None
        if not engine_args.get("skip_tokenizer_init") and os.path.exists(os.path.join(tok_dir, "tokenizer.json")):
            self.tokenizer = _deepinfer.Tokenizer.from_pretrained(tok_dir)
        with open(os.path.join(self.model, "config.json")) as fh:
            model_type = json.load(fh).get("model_type", "")
        self.family = "v41" if "v41" in model_type else "v4"

    def _ids(self, prompt: str | Sequence[int]) -> list:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("LLM.generate: a text prompt needs a tokenizer (none in the model directory)")
            return self.tokenizer.encode(prompt)
        return [int(t) for t in prompt]

    def generate(self, prompts, sampling_params=None) -> list:
        """prompts: a string, a list of token ids, or a list of either. sampling_params: one
        SamplingParams for all, or one per prompt. Returns one RequestOutput per prompt, in order."""
        single = isinstance(prompts, str) or (len(prompts) > 0 and isinstance(prompts[0], int))
        batch = [prompts] if single else list(prompts)
        ids = [self._ids(p) for p in batch]
        if sampling_params is None:
            sampling_params = SamplingParams()
        params = list(sampling_params) if isinstance(sampling_params, (list, tuple)) else [sampling_params]
        return self._engine.generate(ids, params)

    def chat(self, messages, sampling_params=None, *, thinking: bool = False, reasoning_effort=None, tools=None,
             **encode_options) -> list:
        """Renders `messages` (OpenAI format) with the model family's prompt encoder, generates, and
        parses each choice. Returns a list (one per choice) of ChatCompletionOutput."""
        if self.tokenizer is None:
            raise ValueError("LLM.chat needs a tokenizer (none in the model directory)")
        prompt = _deepinfer.encode_messages(messages, family=self.family, thinking=thinking,
                                            reasoning_effort=reasoning_effort, tools=tools, **encode_options)
        out = self.generate([self.tokenizer.encode(prompt)], sampling_params)[0]
        choices = []
        for c in out.outputs:
            parser = _deepinfer.ChatOutputParser(self.family, thinking=thinking)
            a, b = parser.feed(c.text), parser.finish()
            choices.append(ChatCompletionOutput(
                index=c.index, text=c.text, token_ids=list(c.token_ids), finish_reason=c.finish_reason,
                reasoning_content=a["reasoning"] + b["reasoning"], content=a["content"] + b["content"],
                tool_calls=a["tool_calls"] + b["tool_calls"]))
        return choices

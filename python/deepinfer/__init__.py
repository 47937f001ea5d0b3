"""deepinfer: a DeepSeek-V4 family inference engine.

The native parts live in `_deepinfer` (built by CMake into this folder): Tokenizer,
IncrementalDetokenizer, encode_messages, ReasoningParser / ToolCallParser / ChatOutputParser,
SamplingParams, the offline Engine. `LLM` (llm.py) is the vLLM-shaped front end.
"""
from . import _deepinfer  # noqa: F401
from ._deepinfer import *  # noqa: F401,F403
from .llm import LLM, ChatCompletionOutput, SamplingParams  # noqa: F401

"""deepinfer: a DeepSeek-V4 family inference engine. The native parts live in `_deepinfer`
(built by CMake into this folder)."""
from . import _deepinfer  # noqa: F401
from ._deepinfer import *  # noqa: F401,F403

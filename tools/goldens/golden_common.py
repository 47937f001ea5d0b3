"""Shared helpers for the golden scripts (hf_v4.py, ref_v4.py): checkpoint reading,
FP8/FP4 weight dequantisation (docs/v4-architecture.md §3), input ids, metadata, saving.

Everything is plain PyTorch / NumPy / safetensors; nothing here needs network access.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import platform
import shlex
import sys
from typing import Dict, Iterable, Optional

import numpy as np
import torch

E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
               -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
MAX_GOLDEN_BYTES = 3 * 1024 * 1024


# --------------------------------------------------------------------------- checkpoint

def safetensors_files(ckpt_dir: str):
    files = sorted(glob.glob(os.path.join(ckpt_dir, "*.safetensors")))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {ckpt_dir}")
    return files


def read_checkpoint(ckpt_dir: str) -> Dict[str, torch.Tensor]:
    """All tensors of a checkpoint directory (every top-level *.safetensors), on CPU."""
    from safetensors import safe_open
    out: Dict[str, torch.Tensor] = {}
    for f in safetensors_files(ckpt_dir):
        with safe_open(f, framework="pt") as fh:
            for k in fh.keys():
                if k in out:
                    raise ValueError(f"tensor {k} appears in two shards")
                out[k] = fh.get_tensor(k)
    return out


def read_json(path: str) -> Optional[dict]:
    if not os.path.exists(path):
        return None
    with open(path) as fh:
        return json.load(fh)


def checkpoint_provenance(ckpt_dir: str, extra: Optional[Iterable[str]] = None) -> dict:
    """What we know about the checkpoint: ``--ckpt-info KEY=VALUE`` pairs from the caller
    (make_all.sh passes generator, preset, seed), the sha256 of every weight file, and any
    preset/seed-like keys the checkpoint's own files carry."""
    info: dict = {}
    for kv in extra or []:
        k, _, v = kv.partition("=")
        info[k] = v
    if "generator" not in info:  # otherwise the path is a temp dir: keep meta reproducible
        info["ckpt_dir"] = os.path.abspath(ckpt_dir)
    info["safetensors_sha256"] = {os.path.basename(f): sha256_file(f) for f in safetensors_files(ckpt_dir)}
    for name in ("deepinfer_checkpoint.json", "checkpoint_meta.json", "meta.json", "provenance.json"):
        j = read_json(os.path.join(ckpt_dir, name))
        if j is not None:
            info[name] = j
    for cfg_name in ("config.json", os.path.join("inference", "config.json")):
        j = read_json(os.path.join(ckpt_dir, cfg_name))
        if j is None:
            continue
        for k, v in j.items():
            lk = k.lower()
            if any(t in lk for t in ("preset", "seed", "generator", "deepinfer", "family", "dense")):
                info.setdefault("config_keys", {})[f"{cfg_name}:{k}"] = v
    return info


def is_quantised(tensors: Dict[str, torch.Tensor]) -> bool:
    return any(k.endswith(".scale") for k in tensors) or any(
        t.dtype in (torch.float8_e4m3fn, torch.float4_e2m1fn_x2) for t in tensors.values())


def unpack_fp4_codes(packed: torch.Tensor) -> torch.Tensor:
    """[..., K/2] int8/uint8/float4_e2m1fn_x2 -> [..., K] FP32, low nibble = even K (docs §3)."""
    b = packed.contiguous().view(torch.uint8)
    lut = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=b.device)
    return torch.stack([lut[(b & 0x0F).long()], lut[(b >> 4).long()]], dim=-1).flatten(-2)


def dequant_fp8_tiles(w: torch.Tensor, s: torch.Tensor, block: int = 128) -> torch.Tensor:
    """FP8 e4m3 weight [out, in] with E8M0 tile scales [ceil(out/B), ceil(in/B)] -> FP32."""
    o, i = w.shape
    sf = s.to(torch.float32)
    full = sf.repeat_interleave(block, 0)[:o].repeat_interleave(block, 1)[:, :i]
    return w.to(torch.float32) * full


def dequant_fp4_rows(w: torch.Tensor, s: torch.Tensor, block: int = 32) -> torch.Tensor:
    """Packed e2m1 expert weight [out, in/2] with E8M0 scales [out, in/32] -> FP32 [out, in]."""
    vals = unpack_fp4_codes(w)
    sf = s.to(torch.float32).repeat_interleave(block, 1)[:, :vals.shape[1]]
    return vals * sf


def dequantise_checkpoint(tensors: Dict[str, torch.Tensor], fp8_block: int = 128,
                          fp4_block: int = 32) -> Dict[str, torch.Tensor]:
    """Official-named tensors -> dense FP32 (integer tensors kept), ``.scale`` tensors dropped.
    FP8 weights: e4m3 x 128x128 E8M0 tile scale; I8 routed-expert weights: packed e2m1 x
    per-32 E8M0 scale (docs §3). Dense inputs are only cast to FP32."""
    out: Dict[str, torch.Tensor] = {}
    for name, t in tensors.items():
        if name.endswith(".scale"):
            continue
        scale = tensors.get(name[: -len(".weight")] + ".scale") if name.endswith(".weight") else None
        if scale is not None and t.dtype == torch.float8_e4m3fn:
            out[name] = dequant_fp8_tiles(t, scale, fp8_block)
        elif scale is not None and (t.dtype in (torch.int8, torch.uint8, torch.float4_e2m1fn_x2)):
            out[name] = dequant_fp4_rows(t, scale, fp4_block)
        elif scale is not None:
            raise ValueError(f"{name}: has a .scale but dtype {t.dtype}")
        elif t.dtype in (torch.float8_e4m3fn, torch.float4_e2m1fn_x2):
            raise ValueError(f"{name}: quantised dtype {t.dtype} without a .scale")
        elif t.is_floating_point():
            out[name] = t.to(torch.float32)
        else:
            out[name] = t
    return out


# --------------------------------------------------------------------------- inputs

def make_input_ids(seed: int, n: int, vocab: int) -> np.ndarray:
    """numpy default_rng(seed).integers(3, vocab, size=n) as int64 (ids 0..2 are specials)."""
    return np.random.default_rng(seed).integers(3, vocab, size=n, dtype=np.int64)


# --------------------------------------------------------------------------- numerics setup

def setup_torch(device: str, threads: Optional[int] = None) -> torch.device:
    """Strict FP32 matmuls (no TF32) and deterministic algorithms where available."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    if threads:
        torch.set_num_threads(threads)
    dev = torch.device(device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("--device cuda requested but CUDA is not available")
        torch.cuda.set_device(dev.index or 0)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    return dev


# --------------------------------------------------------------------------- meta / output

def versions() -> dict:
    v = {"python": platform.python_version(), "torch": torch.__version__, "numpy": np.__version__}
    try:
        import transformers
        v["transformers"] = transformers.__version__
    except Exception:  # noqa: BLE001
        pass
    try:
        import safetensors
        v["safetensors"] = safetensors.__version__
    except Exception:  # noqa: BLE001
        pass
    return v


REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def command_line(ckpt: Optional[str] = None) -> str:
    """The invocation, reproducible across runs: the checkpoint dir is written as <ckpt> (its
    identity is meta.checkpoint) and paths inside the repository are made repo-relative."""
    def norm(a: str) -> str:
        if ckpt is not None and os.path.abspath(a) == os.path.abspath(ckpt) and os.path.exists(a):
            return "<ckpt>"
        if os.path.isabs(a) and (a + "/").startswith(REPO_ROOT + "/"):
            return os.path.relpath(a, REPO_ROOT)
        return a
    script = os.path.relpath(os.path.abspath(sys.argv[0]), REPO_ROOT)
    return " ".join(shlex.quote(norm(a)) for a in [script] + sys.argv[1:])


def device_name(dev: torch.device) -> str:
    if dev.type == "cuda":
        return f"cuda:{torch.cuda.get_device_name(dev)}"
    return f"cpu:{platform.processor() or platform.machine()}"


def sha256_array(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def save_golden(path: str, arrays: Dict[str, np.ndarray], meta: dict) -> int:
    """np.savez_compressed with ``meta`` as a JSON string; returns the file size in bytes."""
    os.makedirs(os.path.dirname(os.path.abspath(path)) or ".", exist_ok=True)
    payload = dict(arrays)
    payload["meta"] = np.array(json.dumps(meta, indent=1, sort_keys=True, default=_json_default))
    np.savez_compressed(path, **payload)
    return os.path.getsize(path)


def _json_default(o):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, torch.dtype):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o)}")


def pad_sorted(rows: Iterable[np.ndarray], width: int) -> np.ndarray:
    """Sort each row's valid (>= 0) entries ascending and pad with -1 to ``width``."""
    rows = list(rows)
    out = np.full((len(rows), width), -1, dtype=np.int32)
    for i, r in enumerate(rows):
        v = np.sort(np.asarray(r)[np.asarray(r) >= 0])
        if len(v) > width:
            raise ValueError(f"row {i}: {len(v)} valid entries > width {width}")
        out[i, : len(v)] = v
    return out

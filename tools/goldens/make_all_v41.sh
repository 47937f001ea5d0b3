#!/usr/bin/env bash
# Regenerate the DeepSeek-V4.1 reference goldens.
#
#   tools/goldens/make_all_v41.sh [--ref-dir DIR] [--only NAME]... OUTDIR
#
# Builds FP8/FP4 random-weight checkpoints with tools/make_checkpoint.py --family v41 into a
# temporary directory and runs tools/goldens/ref_v41.py (DeepSeek's V4.1 reference through the
# CPU kernel port, indexer-key fix of docs §2.6 applied) on CPU, writing into OUTDIR:
#   ref41_tiny_s1.npz   tiny seed 1, prompt 121 ids (seed 1), 64 greedy steps
#   ref41_tiny_s2.npz   tiny seed 2, prompt 128 ids (seed 2), 64 greedy steps
#   ref41_tiny_s3.npz   tiny seed 3, prompt  97 ids (seed 3), 64 greedy steps
#   ref41_small_s1.npz  small seed 1, prompt 161 ids (seed 1), 64 greedy steps
# then tools/goldens/ref_v41_layers.py (prefill and decode steps, every sublayer's input and output, for teacher
# forcing; ties resolved as (score desc, index asc)):
#   ref41layers_tiny_s1.npz   tiny seed 1, prompt 64 + 64 greedy decode steps
#   ref41layers_tiny_s2.npz   tiny seed 2, prompt 41 + 16 steps
#   ref41layers_small_s1.npz  small seed 1, prompt 40 + 8 steps
# and adds / updates their entries in OUTDIR/manifest.json (other entries are left unchanged).
# Prompt lengths: odd and even (the ratio-2 compressors' trailing partial group), all longer than
# the window, index_topk and the candidate budget. --only NAME (repeatable) restricts the set.
# The reference code must already be in --ref-dir (default <repo>/.ref/v41); see
# tools/goldens/README.md. Needs python3 with torch 2.11, numpy, safetensors, tokenizers, sympy.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
py="${PYTHON:-python3}"
ref_dir="$repo/.ref/v41"
only=()
out=""

while [[ $# -gt 0 ]]; do
  case "$1" in
    --ref-dir) ref_dir="$2"; shift 2 ;;
    --only) only+=("$2"); shift 2 ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    -*) echo "make_all_v41.sh: unknown option $1" >&2; exit 2 ;;
    *) [[ -z "$out" ]] || { echo "make_all_v41.sh: one OUTDIR only" >&2; exit 2; }; out="$1"; shift ;;
  esac
done
[[ -n "$out" ]] || { echo "usage: make_all_v41.sh [--ref-dir DIR] [--only NAME]... OUTDIR" >&2; exit 2; }
mkdir -p "$out"
out="$(cd "$out" && pwd)"
ref_dir="$(cd "$ref_dir" && pwd)"
cd "$repo"

tmp="$(mktemp -d "${TMPDIR:-/tmp}/goldens41_ckpt.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT

wanted() {
  [[ ${#only[@]} -eq 0 ]] && return 0
  local n; for n in "${only[@]}"; do [[ "$n" == "$1" ]] && return 0; done; return 1
}
log() { echo "[make_all_v41] $*" >&2; }
start=$SECONDS
made=()

# name preset seed n_prompt
for spec in "ref41_tiny_s1 tiny 1 121" "ref41_tiny_s2 tiny 2 128" "ref41_tiny_s3 tiny 3 97" \
            "ref41_small_s1 small 1 161"; do
  read -r name preset seed n_prompt <<<"$spec"
  wanted "$name" || continue
  dir="$tmp/${preset}_s${seed}"
  gen="tools/make_checkpoint.py --family v41 --preset $preset --seed $seed"
  [[ -d "$dir" ]] || "$py" $gen --out "$dir" >&2
  log "$name"
  "$py" tools/goldens/ref_v41.py --ref-dir "$ref_dir" --ckpt "$dir" \
    --ckpt-info "generator=$gen" --ckpt-info "family=v41" --ckpt-info "preset=$preset" \
    --ckpt-info "seed=$seed" --ckpt-info "dense=0" \
    --input-ids-seed "$seed" --n-prompt "$n_prompt" --n-steps 64 --out "$out/$name.npz"
  made+=("$name.npz")
done

# Layer-by-layer (teacher-forcing) goldens: prefill only, every sublayer's input and output.
for spec in "ref41layers_tiny_s1 tiny 1 64 64" "ref41layers_tiny_s2 tiny 2 41 16" "ref41layers_small_s1 small 1 40 8"; do
  read -r name preset seed n_prompt n_steps <<<"$spec"
  wanted "$name" || continue
  dir="$tmp/${preset}_s${seed}"
  gen="tools/make_checkpoint.py --family v41 --preset $preset --seed $seed"
  [[ -d "$dir" ]] || "$py" $gen --out "$dir" >&2
  log "$name"
  "$py" tools/goldens/ref_v41_layers.py --ref-dir "$ref_dir" --ckpt "$dir" \
    --ckpt-info "generator=$gen" --ckpt-info "family=v41" --ckpt-info "preset=$preset" \
    --ckpt-info "seed=$seed" --ckpt-info "dense=0" \
    --input-ids-seed "$seed" --n-prompt "$n_prompt" --n-steps "$n_steps" --out "$out/$name.npz"
  made+=("$name.npz")
done

"$py" - "$out" "${made[@]}" <<'PYEOF'
import hashlib, json, os, sys
import numpy as np
out, names = sys.argv[1], sys.argv[2:]
path = os.path.join(out, "manifest.json")
man = json.load(open(path)) if os.path.exists(path) else {"generated_by": "tools/goldens/make_all.sh", "files": {}}
for n in names:
    f = os.path.join(out, n)
    meta = json.loads(str(np.load(f)["meta"]))
    man["files"][n] = {
        "bytes": os.path.getsize(f),
        "sha256": hashlib.sha256(open(f, "rb").read()).hexdigest(),
        "command": meta.get("command"),
        "device": meta.get("device"),
        "generated_by": "tools/goldens/make_all_v41.sh",
        "checkpoint": {k: v for k, v in meta.get("checkpoint", {}).items() if k != "ckpt_dir"},
    }
json.dump(man, open(path, "w"), indent=1, sort_keys=True)
print(f"[make_all_v41] manifest: {len(names)} entries updated", file=sys.stderr)
PYEOF
log "done in $((SECONDS - start)) s -> $out"

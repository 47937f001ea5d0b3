#!/usr/bin/env bash
# Regenerate every DeepSeek-V4 golden file.
#
#   tools/goldens/make_all.sh [--device cpu|cuda] [--ref-dir DIR] [--no-decode] [--only NAME]... OUTDIR
#
# Builds the random-weight checkpoints it needs with tools/make_checkpoint.py into a temporary
# directory (tiny seeds 1, 2, 3 and small seed 1; --dense variants for HF), then writes into OUTDIR:
#   hf_tiny_s{1,2,3}.npz  hf_v4.py, dense tiny seed S, input ids seed S, 300 tokens, --decode check
#   ref_tiny_s1.npz       ref_v4.py, FP8/FP4 tiny seed 1, prompt 200 (seed 1) + 64 greedy steps,
#                         --all-logits --capture
#   hf_small_s1.npz       hf_v4.py, dense small seed 1, 300 tokens, --decode check (logit subset)
#   ref_small_s1.npz      ref_v4.py, FP8/FP4 small seed 1, prompt 200 + 64 steps, --capture
#   manifest.json         file sizes, sha256 and the command lines
# --only NAME (repeatable; e.g. --only hf_tiny_s1) restricts the set. The reference model code
# must already be in --ref-dir (default: <repo>/.ref/v4); see tools/goldens/README.md.
# Needs: python3 with torch 2.11 and transformers 5.17 (DeepseekV4ForCausalLM), numpy,
# safetensors, tokenizers. No network access.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
py="${PYTHON:-python3}"
device=cpu
ref_dir="$repo/.ref/v4"
decode=(--decode)
only=()
out=""

while [[ $# -gt 0 ]]; do
  case "$1" in
    --device) device="$2"; shift 2 ;;
    --ref-dir) ref_dir="$2"; shift 2 ;;
    --no-decode) decode=(); shift ;;
    --only) only+=("$2"); shift 2 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    -*) echo "make_all.sh: unknown option $1" >&2; exit 2 ;;
    *) [[ -z "$out" ]] || { echo "make_all.sh: one OUTDIR only" >&2; exit 2; }; out="$1"; shift ;;
  esac
done
[[ -n "$out" ]] || { echo "usage: make_all.sh [--device cpu|cuda] [--ref-dir DIR] [--no-decode] OUTDIR" >&2; exit 2; }
mkdir -p "$out"
out="$(cd "$out" && pwd)"
ref_dir="$(cd "$ref_dir" && pwd)"
cd "$repo"

tmp="$(mktemp -d "${TMPDIR:-/tmp}/goldens_ckpt.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

wanted() {  # wanted NAME -> 0 if NAME is selected
  [[ ${#only[@]} -eq 0 ]] && return 0
  local n; for n in "${only[@]}"; do [[ "$n" == "$1" ]] && return 0; done; return 1
}

# ckpt PRESET SEED [dense] -> prints the checkpoint dir (generated once)
ckpt() {
  local preset="$1" seed="$2" dense="${3:-}" dir
  dir="$tmp/${preset}_s${seed}${dense:+_dense}"
  if [[ ! -d "$dir" ]]; then
    "$py" tools/make_checkpoint.py --family v4 --preset "$preset" --seed "$seed" --out "$dir" \
      ${dense:+--dense} >&2
  fi
  echo "$dir"
}

# info PRESET SEED [dense] -> fills the array ckpt_info with --ckpt-info arguments
info() {
  local gen="tools/make_checkpoint.py --family v4 --preset $1 --seed $2${3:+ --dense}" d=0
  [[ -n "${3:-}" ]] && d=1
  ckpt_info=(--ckpt-info "generator=$gen" --ckpt-info "preset=$1" --ckpt-info "seed=$2"
             --ckpt-info "dense=$d")
}

log() { echo "[make_all] $*" >&2; }
start=$SECONDS

for s in 1 2 3; do
  name="hf_tiny_s$s"
  wanted "$name" || continue
  dir="$(ckpt tiny "$s" dense)"; info tiny "$s" dense
  log "$name"
  "$py" tools/goldens/hf_v4.py --ckpt "$dir" "${ckpt_info[@]}" --input-ids-seed "$s" --n-tokens 300 \
    --device "$device" "${decode[@]}" --out "$out/$name.npz"
done

for s in 1 2 3; do
  name="ref_tiny_s$s"
  wanted "$name" || continue
  dir="$(ckpt tiny "$s")"; info tiny "$s"
  log "$name"
  "$py" tools/goldens/ref_v4.py --ref-dir "$ref_dir" --ckpt "$dir" "${ckpt_info[@]}" --input-ids-seed "$s" \
    --n-prompt 200 --n-steps 64 --all-logits --capture --device "$device" --out "$out/$name.npz"
done

if wanted hf_small_s1; then
  dir="$(ckpt small 1 dense)"; info small 1 dense
  log hf_small_s1
  "$py" tools/goldens/hf_v4.py --ckpt "$dir" "${ckpt_info[@]}" --input-ids-seed 1 --n-tokens 300 \
    --device "$device" "${decode[@]}" --out "$out/hf_small_s1.npz"
fi

if wanted ref_small_s1; then
  dir="$(ckpt small 1)"; info small 1
  log ref_small_s1
  "$py" tools/goldens/ref_v4.py --ref-dir "$ref_dir" --ckpt "$dir" "${ckpt_info[@]}" --input-ids-seed 1 \
    --n-prompt 200 --n-steps 64 --capture --device "$device" --out "$out/ref_small_s1.npz"
fi

"$py" - "$out" "$device" <<'EOF'
import glob, hashlib, json, os, sys
import numpy as np
out, device = sys.argv[1], sys.argv[2]
files = {}
for f in sorted(glob.glob(os.path.join(out, "*.npz"))):
    meta = json.loads(str(np.load(f)["meta"]))
    files[os.path.basename(f)] = {
        "bytes": os.path.getsize(f),
        "sha256": hashlib.sha256(open(f, "rb").read()).hexdigest(),
        "command": meta.get("command"),
        "device": meta.get("device"),
        "checkpoint": {k: v for k, v in meta.get("checkpoint", {}).items() if k != "ckpt_dir"},
    }
json.dump({"generated_by": "tools/goldens/make_all.sh", "device": device, "files": files},
          open(os.path.join(out, "manifest.json"), "w"), indent=1, sort_keys=True)
print(f"[make_all] manifest: {len(files)} files", file=sys.stderr)
EOF
log "done in $((SECONDS - start)) s -> $out"
ls -l "$out" >&2

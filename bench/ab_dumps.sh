#!/bin/bash
# Bit-exactness A / B of two bench_cuda_model builds on one checkpoint (ab_model.py's companion: that one times them).
# Each binary runs a few decode steps with DEEPINFER_DUMP_DIR set, which writes every tensor the model dumps (each
# layer's sublayer inputs and outputs, the hyper-connection mixes, the attention's index lists) of the last forward;
# the two directories are then compared byte for byte. A kernel change that claims the same bits on the real shapes
# (make test-cuda checks the tiny presets) must leave every file identical.
#
#   bash bench/ab_dumps.sh A_BIN B_BIN CKPT_DIR [--batches 1] [--context 128] [--steps 2]
#
# Exit status: 0 when every dump is identical, 1 when any differs (each is listed), 2 when a run fails or dumps
# nothing (no GPU: bench_cuda_model prints SKIP and dumps nothing).
set -u
[ $# -ge 3 ] || { echo "usage: $0 A_BIN B_BIN CKPT_DIR [--batches 1] [--context 128] [--steps 2]" >&2; exit 2; }
a_bin=$1 b_bin=$2 ckpt=$3
shift 3
batches=1 context=128 steps=2
while [ $# -gt 0 ]; do
  case $1 in
    --batches) batches=$2 ;;
    --context) context=$2 ;;
    --steps) steps=$2 ;;
    *) echo "$0: unknown option $1" >&2; exit 2 ;;
  esac
  shift 2
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for side in a b; do
  bin=$a_bin
  [ $side = b ] && bin=$b_bin
  mkdir -p "$work/$side"
  if ! DEEPINFER_DUMP_DIR="$work/$side" "$bin" "$ckpt" --batches "$batches" --context "$context" --steps "$steps" \
    --prefill 0 > "$work/$side.log" 2>&1; then
    echo "ab_dumps: $bin failed:"; tail -5 "$work/$side.log"; exit 2
  fi
  [ -n "$(ls "$work/$side")" ] || { echo "ab_dumps: $bin dumped nothing"; tail -3 "$work/$side.log"; exit 2; }
done
same=0 differ=0
for f in "$work"/a/*; do
  name=$(basename "$f")
  if cmp -s "$f" "$work/b/$name"; then
    same=$((same + 1))
  else
    differ=$((differ + 1))
    echo "differs: $name"
  fi
done
extra=$(comm -13 <(ls "$work/a") <(ls "$work/b") | wc -l)
echo "ab_dumps: $same identical, $differ different, $extra only in B (batches $batches, context $context)"
[ "$differ" -eq 0 ] && [ "$extra" -eq 0 ]

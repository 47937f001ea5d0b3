#!/bin/bash
# Alternated ktrace traces of variants of one bench_cuda_model binary, each variant an environment (the A/B switches of
# the env table), for bench/ktrace/ab.py:
#   bash bench/ktrace/take.sh BIN CKPT OUT_DIR ROUNDS NAME=ENV [NAME=ENV ...]
# e.g. bash bench/ktrace/take.sh build/bench/bench_cuda_model /tmp/ck41 /tmp/kts 3 \
#        off="DEEPINFER_CUDA_WALK_WHOLE=0" on="DEEPINFER_CUDA_WALK_WHOLE=1"
# writes OUT_DIR/kt_NAME_I.csv for I = 1..ROUNDS, every variant once per round in the order given (a drift of the
# machine then hits them alike), each trace a queued decode (KT_ARGS, default: --batches 1 --context 128 --steps 6
# --prefill 0 --queued). ENV: space-separated VAR=VALUE words, or empty for the binary's defaults. The tracer is built
# into OUT_DIR/kt first (bench/ktrace/build.sh). Then, for instance:
#   python3 bench/ktrace/ab.py --a OUT_DIR/kt_off_*.csv --b OUT_DIR/kt_on_*.csv --between wgmma sparse_attn
set -u
[ $# -ge 5 ] || { echo "usage: $0 BIN CKPT OUT_DIR ROUNDS NAME=ENV [NAME=ENV ...]" >&2; exit 2; }
bin=$1 ckpt=$2 out=$3 rounds=$4
shift 4
[[ $rounds =~ ^[1-9][0-9]*$ ]] || { echo "$0: ROUNDS must be a positive whole number, got '$rounds'" >&2; exit 2; }
for v in "$@"; do
  [[ $v =~ ^[A-Za-z0-9_]+= ]] || { echo "$0: a variant is NAME=ENV, got '$v'" >&2; exit 2; }
done
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
bash "$here/build.sh" "$out/kt" > "$out/ktrace_build.txt" 2>&1 || { cat "$out/ktrace_build.txt"; exit 2; }
read -r -a args <<< "${KT_ARGS:---batches 1 --context 128 --steps 6 --prefill 0 --queued}"
for ((i = 1; i <= rounds; ++i)); do
  for v in "$@"; do
    name=${v%%=*}
    read -r -a vars <<< "${v#*=}"
    csv="$out/kt_${name}_$i.csv"
    env "${vars[@]}" CUDA_INJECTION64_PATH="$out/kt/libktrace.so" KTRACE_OUT="$csv" "$bin" "$ckpt" "${args[@]}" \
      > "$out/kt_${name}_$i.log" 2>&1 || { echo "$0: $name round $i failed (its log: $out/kt_${name}_$i.log)" >&2; exit 1; }
    [ -s "$csv" ] || { echo "$0: $name round $i wrote no trace (no GPU?)" >&2; exit 1; }
  done
done
echo "take.sh: $rounds rounds of $# variants in $out"

#!/bin/bash
# One device call of issue 8's sessions in a fixed time budget, returning at most five files: main's checks, the batch-1
# figure and, given variants, alternated ktraces of each against the defaults. Why: device time comes in short calls
# that often fail to start, so a call should do the standard work in one go, keep what finished when the call is cut
# off, and leave the rest undone in a known order rather than by a timeout in the middle.
#   bash bench/gpu_call.sh TARBALL OUT [NAME=ENV ...]
# TARBALL: bench/pack_cuda_bins.sh's output with the five programs of tests/cuda/run.sh and bench_cuda_model; OUT: the
# folder that comes back (the device's $OUT). NAME=ENV: a variant for bench/ktrace/take.sh (ENV: space-separated
# VAR=VALUE words), traced against "d" (the binary's defaults). Steps, in order, each only when the time left in
# GPU_CALL_BUDGET seconds (default 300) covers its estimate (the H100's, fifty-eighth to sixtieth sessions):
#   1. unpack TARBALL; generate the V4.1 flash-shape checkpoint (4 layers, tools/make_checkpoint.py) into CKPT (default
#      /tmp/deepinfer-flash-v41-4, kept if it holds a config.json) in the background;
#   2. test (150 s): make test-cuda (tests/cuda/run.sh): its summary lines into OUT/log.txt, its outputs in
#      OUT/test_cuda.tgz;
#   3. model (60 s): bench_cuda_model CKPT --batches 1,8 --context 128 --steps 32 --prefill 0 (MODEL_ARGS replaces
#      those) into OUT/log.txt;
#   4. ktrace (10 s a trace): GPU_CALL_ROUNDS (default 3) rounds of d and every variant, then bench/ktrace/ab.py of each
#      variant against d (GPU_CALL_BETWEEN: its --between pairs) and report.py's per-kernel table of d's first trace
#      into OUT/log.txt; the traces in OUT/ktrace.tgz.
#   5. benches (60 s each): GPU_CALL_BENCHES (e.g. "bmma_probe gemv") through bench/cuda_run.sh, their tables into
#      OUT/log.txt (the binaries must be in TARBALL).
#   6. ncu (120 s), only with GPU_CALL_NCU=1: Nsight Compute over about one batch-1 decode step of bench_cuda_model
#      (each kernel alone; GPU_CALL_NCU_KERNELS, an ncu -k regex, narrows it to those kernels) with
#      bench/ktrace/ncu_step.py's metrics and warp-stall reasons; its per-name and stall tables into OUT/log.txt, the
#      CSV as OUT/ncu.csv.gz. GPU_CALL_NCU_ENV (space-separated VAR=VALUE words) sets the profiled run's environment,
#      e.g. a variant's switch.
# GPU_CALL_SKIP: step names to leave out (test, model, ktrace, benches, ncu). Exit status: 0 when every step that ran passed,
# 1 when one failed, 2 without a GPU (nothing run) or on bad arguments.
set -u
[ $# -ge 2 ] || { echo "usage: $0 TARBALL OUT [NAME=ENV ...]" >&2; exit 2; }
tarball=$1 out=$2
shift 2
for v in "$@"; do
  [[ $v =~ ^[A-Za-z0-9_]+= ]] || { echo "$0: a variant is NAME=ENV, got '$v'" >&2; exit 2; }
  [ "${v%%=*}" != d ] || { echo "$0: the variant name d is the defaults' own" >&2; exit 2; }
done
read -r -a ncu_env <<< "${GPU_CALL_NCU_ENV:-}"
for v in "${ncu_env[@]}"; do
  [[ $v =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] || { echo "$0: GPU_CALL_NCU_ENV takes VAR=VALUE words, got '$v'" >&2; exit 2; }
done
budget=${GPU_CALL_BUDGET:-300}
rounds=${GPU_CALL_ROUNDS:-3}
[[ $budget =~ ^[0-9]+$ && $rounds =~ ^[1-9][0-9]*$ ]] ||
  { echo "$0: GPU_CALL_BUDGET / GPU_CALL_ROUNDS must be whole numbers" >&2; exit 2; }
[ -f "$tarball" ] || { echo "$0: no tarball $tarball" >&2; exit 2; }
here=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"
log=$out/log.txt
SECONDS=0
say() { echo "$*" | tee -a "$log"; }
gpu=$(nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv,noheader 2> /dev/null | head -1)
[ -n "$gpu" ] || { say "gpu_call: no GPU here (nvidia-smi found none); nothing was run"; exit 2; }
say "gpu_call: $gpu; budget ${budget} s; $(cd "$here" && git log --oneline -1 2> /dev/null || echo 'no git')"
skipped() { [[ " ${GPU_CALL_SKIP:-} " == *" $1 "* ]]; }
# Whether step $1 (estimate $2 s) runs: not skipped, and the budget leaves room for it.
runs() {
  if skipped "$1"; then say "== $1: skipped (GPU_CALL_SKIP)"; return 1; fi
  local left=$((budget - SECONDS))
  if [ "$left" -lt "$2" ]; then say "== $1: not run (${left} s left, needs ~$2)"; return 1; fi
  say "== $1 (t=${SECONDS}s)"
}

w=$(mktemp -d)
tar -C "$w" -xJf "$tarball" || { say "gpu_call: cannot unpack $tarball"; exit 2; }
export LD_LIBRARY_PATH="$w/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
bin=$w/bin
ckpt=${CKPT:-/tmp/deepinfer-flash-v41-4}
ck_pid=""
if [ ! -f "$ckpt/config.json" ]; then
  python3 "$here/tools/make_checkpoint.py" --family v41 --preset flash-shape --layers 4 --seed 0 --out "$ckpt" \
    > "$out/make_checkpoint.txt" 2>&1 &
  ck_pid=$!
fi
rc=0

if runs test 150; then
  mkdir -p "$w/tc"
  bash "$here/tests/cuda/run.sh" "$bin" "$w/tc" > "$w/tc/run.txt" 2>&1
  trc=$?
  grep -E '^(ops|gemv|linear_tc|sampling|model)[:,] |^FAIL |ALL PASSED|test-cuda' "$w/tc/run.txt" | tee -a "$log"
  tar -C "$w/tc" -czf "$out/test_cuda.tgz" --exclude=./ckpt . 2> /dev/null
  [ "$trc" -eq 0 ] || { say "test: FAILED (exit $trc; test_cuda.tgz holds the outputs)"; rc=1; }
fi

if [ -n "$ck_pid" ]; then
  while kill -0 "$ck_pid" 2> /dev/null && [ $SECONDS -lt "$budget" ]; do sleep 1; done
  wait "$ck_pid" 2> /dev/null || true
fi
have_ckpt=0
[ -f "$ckpt/config.json" ] && have_ckpt=1
[ $have_ckpt -eq 1 ] || say "gpu_call: no checkpoint in $ckpt (see make_checkpoint.txt); the model steps are not run"

if [ $have_ckpt -eq 1 ] && runs model 60; then
  read -r -a margs <<< "${MODEL_ARGS:---batches 1,8 --context 128 --steps 32 --prefill 0}"
  timeout 90 "$bin/bench_cuda_model" "$ckpt" "${margs[@]}" >> "$log" 2>&1 || { say "model: FAILED"; rc=1; }
fi

if [ $have_ckpt -eq 1 ] && [ $# -gt 0 ] && runs ktrace $((10 * rounds * ($# + 1))); then
  kts=$w/kts
  if bash "$here/bench/ktrace/take.sh" "$bin/bench_cuda_model" "$ckpt" "$kts" "$rounds" d= "$@" >> "$log" 2>&1
  then
    read -r -a between <<< "${GPU_CALL_BETWEEN:-}"
    for v in "$@"; do
      name=${v%%=*}
      say "-- ab: d against $name (${v#*=})"
      python3 "$here/bench/ktrace/ab.py" --a "$kts"/kt_d_*.csv --b "$kts"/kt_"$name"_*.csv \
        ${between[@]+--between "${between[@]}"} >> "$log" 2>&1
    done
    python3 "$here/bench/ktrace/report.py" "$kts/kt_d_1.csv" --top 16 | sed -n '/^kernel .*calls/,$p' >> "$log" 2>&1
  else
    say "ktrace: FAILED"
    rc=1
  fi
  (cd "$kts" 2> /dev/null && tar -czf "$out/ktrace.tgz" ./*.csv ./*.log 2> /dev/null)
fi

read -r -a benches <<< "${GPU_CALL_BENCHES:-}"
if [ ${#benches[@]} -gt 0 ] && runs benches $((60 * ${#benches[@]})); then
  # One cuda_run.sh for all of them (its "NAME: rc=N" line per bench says which passed), on this call's checkpoint.
  BENCHES="${benches[*]}" CKPT_DIR=$ckpt bash "$here/bench/cuda_run.sh" "$bin" "$w/benches" > "$w/benches.txt" 2>&1
  for b in "${benches[@]}"; do
    say "-- bench $b"
    cat "$w/benches/$b.txt" >> "$log" 2> /dev/null
    if ! grep -q "^$b: rc=0 " "$w/benches.txt"; then
      say "$b: FAILED ($(grep "^$b: rc=" "$w/benches.txt" || echo 'no run'))"
      rc=1
    fi
  done
fi

if [ $have_ckpt -eq 1 ] && [ "${GPU_CALL_NCU:-0}" = 1 ] && runs ncu 120; then
  # A window of a queued (graph-free) batch-1 run past the load and the first steps: by default every kernel of about
  # one step (launches 200-359; the whole 420-launch window of the fifty-eighth session's table ran past 150 s with
  # the stall metrics), or with GPU_CALL_NCU_KERNELS (an ncu -k regex) the next 60 launches of those kernels only
  # (~45 s on the H100 for 40 GEMV and norm launches).
  metrics=$(python3 "$here/bench/ktrace/ncu_step.py" --print-metrics)
  if [ -n "${GPU_CALL_NCU_KERNELS:-}" ]; then
    window=(-k "regex:$GPU_CALL_NCU_KERNELS" --launch-skip 30 --launch-count 60)
  else
    window=(--launch-skip 200 --launch-count 160)
  fi
  [ ${#ncu_env[@]} -eq 0 ] || say "ncu: with ${ncu_env[*]}"
  env "${ncu_env[@]}" timeout 170 "${NCU:-ncu}" --clock-control none --csv "${window[@]}" --metrics "$metrics" \
    "$bin/bench_cuda_model" "$ckpt" --batches 1 --context 128 --steps 6 --prefill 0 --queued > "$w/ncu.csv" \
    2> "$w/ncu.err"
  nrc=$?
  gzip -c "$w/ncu.csv" > "$out/ncu.csv.gz"
  if [ $nrc -eq 0 ] && python3 "$here/bench/ktrace/ncu_step.py" "$w/ncu.csv" --all --quiet --stalls 16 >> "$log" 2>&1
  then :; else
    say "ncu: FAILED (ncu exit $nrc): $(tail -3 "$w/ncu.err" | tr '\n' ' ')"
    rc=1
  fi
fi

say "gpu_call: done in ${SECONDS} s, exit $rc"
exit $rc

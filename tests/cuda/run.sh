#!/bin/bash
# The GPU checks of issue 8 in one command (`make test-cuda` runs it on a build directory; on a GPU
# machine without the build dependencies, point it at prebuilt binaries):
#   bash tests/cuda/run.sh BIN_DIR [OUT_DIR]
# BIN_DIR holds deepinfer_cuda_tests (every CUDA op against the CPU op), deepinfer_cuda_gemv_tests (the
# decode GEMV against the CPU op, bit for bit), deepinfer_cuda_linear_tc_tests (the tensor-core linear within
# tolerance of the CPU op, and its two kernels bit for bit against each other), deepinfer_cuda_sampling_tests and
# deepinfer_cuda_model_tests
# (checkpoints on the CPU and the GPU, greedy tokens compared). The checkpoints: the tiny V4 and V4.1
# presets of tools/make_checkpoint.py (generated here, numpy only) and the shipped trained model
# models/mini-v41. Exit status: 1 if any case failed, 2 when no GPU is visible (nothing tested). Each program runs
# under a time limit (TEST_CUDA_TIMEOUT seconds, default 240; the H100 takes 8-34 s each), so that a kernel that hangs
# fails its program ("timed out") instead of holding the device call.
set -u
limit=${TEST_CUDA_TIMEOUT:-240}
lim() { timeout "$limit" "$@"; local r=$?; [ $r -eq 124 ] && echo "FAIL $1: timed out after ${limit} s"; return $r; }
here=$(cd "$(dirname "$0")/../.." && pwd)
bin=$(cd "$1" && pwd)
out=${2:-/tmp/deepinfer-test-cuda}
mkdir -p "$out/ckpt"
find_bin() { for c in "$bin/$1" "$bin/src/cuda/$1"; do [ -x "$c" ] && { echo "$c"; return; }; done; echo "missing $1 in $bin" >&2; exit 2; }
ops=$(find_bin deepinfer_cuda_tests)
model=$(find_bin deepinfer_cuda_model_tests)
python3 "${MAKE_CHECKPOINT:-$here/tools/make_checkpoint.py}" --family v4 --preset tiny --seed 1 --out "$out/ckpt/tiny-v4" > /dev/null || exit 2
python3 "${MAKE_CHECKPOINT:-$here/tools/make_checkpoint.py}" --family v41 --preset tiny --seed 1 --out "$out/ckpt/tiny-v41" > /dev/null || exit 2
rc=0
SECONDS=0
lim "$ops" > "$out/ops.txt" 2>&1
ops_rc=$?
if [ $ops_rc -eq 2 ]; then cat "$out/ops.txt"; echo "test-cuda: no GPU here, nothing was tested"; exit 2; fi
[ $ops_rc -eq 0 ] || rc=1
echo "ops: $(grep -c '^PASS ' "$out/ops.txt") PASS, $(grep -c '^FAIL ' "$out/ops.txt") FAIL (${SECONDS}s)"
grep '^FAIL ' "$out/ops.txt"
SECONDS=0; lim "$(find_bin deepinfer_cuda_gemv_tests)" > "$out/gemv.txt" 2>&1 || rc=1; echo "gemv: $(grep -c '^PASS ' "$out/gemv.txt") PASS, $(grep -c '^FAIL ' "$out/gemv.txt") FAIL (${SECONDS}s)"; grep '^FAIL ' "$out/gemv.txt"
SECONDS=0; lim "$(find_bin deepinfer_cuda_linear_tc_tests)" > "$out/linear_tc.txt" 2>&1 || rc=1; echo "linear_tc: $(grep -c '^PASS ' "$out/linear_tc.txt") PASS, $(grep -c '^FAIL ' "$out/linear_tc.txt") FAIL (${SECONDS}s)"; grep '^FAIL ' "$out/linear_tc.txt"
SECONDS=0; lim "$(find_bin deepinfer_cuda_sampling_tests)" > "$out/sampling.txt" 2>&1 || rc=1; echo "sampling: $(grep -c '^PASS ' "$out/sampling.txt") PASS, $(grep -c '^FAIL ' "$out/sampling.txt") FAIL (${SECONDS}s)"; grep '^FAIL ' "$out/sampling.txt"
SECONDS=0
lim "$model" "$out/ckpt/tiny-v4" "$out/ckpt/tiny-v41" "$here/models/mini-v41" 2>&1 | tee "$out/model.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
# The model again with the walk's bulk ring (DEEPINFER_CUDA_WALK_BULK, off by default until measured): the same tokens.
DEEPINFER_CUDA_WALK_BULK=1 lim "$model" "$out/ckpt/tiny-v4" "$out/ckpt/tiny-v41" "$here/models/mini-v41" > "$out/model_bulk.txt" 2>&1 || rc=1
echo "model, walk bulk ring: $(grep -E 'ALL PASSED|failed' "$out/model_bulk.txt" | tail -1)"
echo "model: ${SECONDS}s"
exit $rc

#!/bin/bash
# The GPU benchmarks of issue 8 in one command (the figures in bench/RESULTS.md come from it):
#   bash bench/cuda_run.sh BIN_DIR OUT_DIR [FAMILY [LAYERS [EXPERTS]]]
# BIN_DIR holds bench_cuda_gemm (FP8 GEMM vs cuBLASLt, FP4 experts), bench_cuda_gemv (decode GEMV vs
# the read ceiling, cuda::linear as the anchor), bench_cuda_attention (sparse
# attention decode vs the copy ceiling) and bench_cuda_model (end to end on a flash-shape checkpoint,
# generated here by tools/make_checkpoint.py: FAMILY v4|v41, LAYERS layers; default v41, 4 layers).
# BENCHES (default "gemm gemv attention model") picks which run; "stream" adds bench_cuda_stream (the decode GEMVs'
# weight access pattern without their arithmetic, vs the read ceiling) and "wgmma_probe" bench_cuda_wgmma_probe
# (fp8_wgmma_gemv's pipeline pieces timed apart, the E4M3 wgmma by width), "bmma_probe" bench_cuda_bmma_probe
# (fp8_bmma_gemv against the default E4M3 kernel at one x row, bits and time), "boundary_probe"
# bench_cuda_boundary_probe (a step-to-step dependency as a kernel boundary, plain or PDL, against a persistent
# kernel's grid barrier or per-block flags). Each writes OUT_DIR/<name>.txt.
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
bin=$(cd "$1" && pwd)
out=$2
family=${3:-v41}
layers=${4:-4}
experts=${5:-}
mkdir -p "$out"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,driver_version --format=csv,noheader | tee "$out/gpu.txt"
for b in ${BENCHES:-gemm gemv attention model}; do
  SECONDS=0
  case $b in
    gemm) timeout 300 "$bin/bench_cuda_gemm" > "$out/gemm.txt" 2>&1 ;;
    gemv) timeout 300 "$bin/bench_cuda_gemv" > "$out/gemv.txt" 2>&1 ;;
    attention) timeout 120 "$bin/bench_cuda_attention" > "$out/attention.txt" 2>&1 ;;
    stream) timeout 120 "$bin/bench_cuda_stream" > "$out/stream.txt" 2>&1 ;;
    wgmma_probe) timeout 180 "$bin/bench_cuda_wgmma_probe" > "$out/wgmma_probe.txt" 2>&1 ;;
    bmma_probe) timeout 120 "$bin/bench_cuda_bmma_probe" > "$out/bmma_probe.txt" 2>&1 ;;
    boundary_probe) timeout 60 "$bin/bench_cuda_boundary_probe" > "$out/boundary_probe.txt" 2>&1 ;;
    model)
      ckpt=${CKPT_DIR:-/tmp/deepinfer-flash-$family-$layers}
      if [ ! -f "$ckpt/config.json" ]; then
        args=(--family "$family" --preset flash-shape --seed 0 --out "$ckpt")
        python3 "${MAKE_CHECKPOINT:-$here/tools/make_checkpoint.py}" --help | grep -q -- --layers && args+=(--layers "$layers")
        [ -n "$experts" ] && args+=(--experts "$experts")
        python3 "${MAKE_CHECKPOINT:-$here/tools/make_checkpoint.py}" "${args[@]}" > "$out/make_checkpoint.txt" 2>&1 || { cat "$out/make_checkpoint.txt"; continue; }
        echo "checkpoint generated in ${SECONDS}s: $(du -sh "$ckpt" | cut -f1)" | tee -a "$out/make_checkpoint.txt"
      fi
      SECONDS=0
      timeout 400 "$bin/bench_cuda_model" "$ckpt" ${MODEL_ARGS:-} > "$out/model.txt" 2>&1 ;;
  esac
  echo "$b: rc=$? in ${SECONDS}s"
  tail -n 40 "$out/$b.txt"
done

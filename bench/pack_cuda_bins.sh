#!/bin/bash
# Packs prebuilt CUDA test and benchmark binaries, with the shared libraries they load that a bare GPU machine may lack,
# into one xz tarball small enough to travel with the working tree to a machine that has the GPU but not the build
# dependencies (the device tool of bench/RESULTS.md's sessions: its tree is capped at 64 MiB):
#   bash bench/pack_cuda_bins.sh BUILD_DIR OUT.tar.xz [BINARY ...]
# BINARY: names under BUILD_DIR/src/cuda or BUILD_DIR/bench (default: the five test programs of tests/cuda/run.sh and
# bench_cuda_gemv, bench_cuda_model). The tarball holds bin/ (stripped copies) and lib/ (every library ldd resolves
# but the C runtime's own: libc, libm, libstdc++, libgcc_s, the loader). On the GPU machine:
#   mkdir -p W && tar -C W -xJf OUT.tar.xz && export LD_LIBRARY_PATH=W/lib
#   bash tests/cuda/run.sh W/bin      # make test-cuda;  bash bench/cuda_run.sh W/bin OUT_DIR for the benchmarks
# Why one xz stream with a large dictionary: each binary links the whole CUDA backend (~17 MB, mostly the same
# kernels), so 7 binaries are ~37 MB compressed one by one but ~12 MB when xz can see across them.
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 BUILD_DIR OUT.tar.xz [BINARY ...]" >&2; exit 2; }
build=$(cd "$1" && pwd)
out=$2
shift 2
bins=("$@")
[ ${#bins[@]} -gt 0 ] || bins=(deepinfer_cuda_tests deepinfer_cuda_gemv_tests deepinfer_cuda_linear_tc_tests
  deepinfer_cuda_sampling_tests deepinfer_cuda_model_tests bench_cuda_gemv bench_cuda_model)
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib"
for b in "${bins[@]}"; do
  src=""
  for c in "$build/src/cuda/$b" "$build/bench/$b" "$build/$b"; do [ -x "$c" ] && { src=$c; break; }; done
  [ -n "$src" ] || { echo "pack_cuda_bins: no binary $b under $build (build it first)" >&2; exit 1; }
  cp "$src" "$stage/bin/$b"
  strip -s "$stage/bin/$b" 2> /dev/null || true
  ldd "$src" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | while read -r name path; do
    case $name in
      libc.so.* | libm.so.* | libstdc++.so.* | libgcc_s.so.* | ld-linux* | libpthread.so.* | libdl.so.* | librt.so.*) ;;
      libcuda.so.*) ;;  # the driver's: the GPU machine's own
      *) [ -f "$stage/lib/$name" ] || cp -L "$path" "$stage/lib/$name" ;;
    esac
  done
done
tar -C "$stage" -cf - bin lib | xz -T1 --lzma2=preset=6,dict=192MiB > "$out"
echo "pack_cuda_bins: $(ls "$stage/bin" | wc -l) binaries, $(ls "$stage/lib" | wc -l) libraries -> $out ($(du -h "$out" | cut -f1))"

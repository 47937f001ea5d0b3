#!/bin/bash
# Builds libktrace.so against the CUPTI found on this machine (the CUDA toolkit's extras, else the nvidia-cuda-cupti
# wheel that PyTorch installs). Usage: bash bench/ktrace/build.sh OUT_DIR; then run a program with
# CUDA_INJECTION64_PATH=OUT_DIR/libktrace.so KTRACE_OUT=trace.csv.
set -eu
out=${1:?output directory}
mkdir -p "$out"
inc=""
for d in /usr/local/cuda/targets/x86_64-linux/include /usr/local/cuda/extras/CUPTI/include $(python3 -c 'import nvidia, os; [print(os.path.join(p, s, "include")) for p in nvidia.__path__ for s in os.listdir(p)]' 2>/dev/null); do
  if [ -f "$d/cupti.h" ]; then inc=$d; break; fi
done
[ -n "$inc" ] || { echo "ktrace: no cupti.h found" >&2; exit 1; }
lib=$(ls -d "$inc/../lib64" "$inc/../lib" 2>/dev/null | while read -r l; do ls "$l"/libcupti.so* >/dev/null 2>&1 && echo "$l"; done | head -1)
[ -n "$lib" ] || { echo "ktrace: no libcupti next to $inc" >&2; exit 1; }
newest() { grep -ohE "\} CUpti_Activity$1[0-9]+;" "$inc"/cupti_activity.h | grep -oE "[0-9]+" | sort -n | tail -1; }
rec=$(newest Kernel)
so=$(ls "$lib"/libcupti.so* | head -1)
gcc -O2 -shared -fPIC -o "$out/libktrace.so" "$(dirname "$0")/ktrace.c" -I"$inc" -I/usr/local/cuda/include \
  -DKTRACE_RECORD=CUpti_ActivityKernel$rec \
  -DKTRACE_MEMCPY=CUpti_ActivityMemcpy$(newest Memcpy) -DKTRACE_MEMSET=CUpti_ActivityMemset$(newest Memset) "$so" -Wl,-rpath,"$lib"
echo "ktrace: $out/libktrace.so (CUPTI $inc, record CUpti_ActivityKernel$rec)"

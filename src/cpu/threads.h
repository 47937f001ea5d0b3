// CPU thread set-up, once per process: OpenMP runs every kernel, and OpenBLAS is kept to one thread
// so the two pools never compete for the cores (linear() then gives each OpenMP thread its own
// single-threaded sgemm panels). DEEPINFER_NUM_THREADS overrides the OpenMP thread count.
#pragma once

namespace deepinfer::cpu {

void configure_threads();
int num_threads();

}  // namespace deepinfer::cpu

#include "cpu/threads.h"

#include <cblas.h>
#include <omp.h>

#include <cstdlib>
#include <mutex>

namespace deepinfer::cpu {

void configure_threads() {
  static std::once_flag once;
  std::call_once(once, [] {
    openblas_set_num_threads(1);
    if (const char* v = std::getenv("DEEPINFER_NUM_THREADS")) {
      const int n = std::atoi(v);
      if (n > 0) omp_set_num_threads(n);
    }
  });
}

int num_threads() { return omp_get_max_threads(); }

}  // namespace deepinfer::cpu

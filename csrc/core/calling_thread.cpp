#include "calling_thread.h"

#include <ATen/Parallel.h>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace scl {

CallThreads::CallThreads(bool parallel_tiles) : parallel_tiles_(parallel_tiles) {
#ifdef _OPENMP
  // ATen sets a thread's OpenMP thread count at the thread's first parallel question, once per
  // library that asks: libtorch keeps its flag (at::get_num_threads), and this library's inlined
  // parallel_for keeps another (at::internal::lazy_init_num_threads). Both asked here first, a
  // first question in the middle of the call cannot overwrite the 1 below.
  at::get_num_threads();
  at::internal::lazy_init_num_threads();
  openmp_threads_ = omp_get_max_threads();
  omp_set_num_threads(1);
#endif
}

CallThreads::~CallThreads() {
#ifdef _OPENMP
  omp_set_num_threads(openmp_threads_);
#endif
}

CallThreads::TorchThreads::TorchThreads(bool active, int openmp_threads)
    : guard_(active ? false : c10::ParallelGuard::is_enabled()), active_(active) {
#ifdef _OPENMP
  if (active_) omp_set_num_threads(openmp_threads);
#endif
}

CallThreads::TorchThreads::~TorchThreads() {
#ifdef _OPENMP
  if (active_) omp_set_num_threads(1);
#endif
}

}  // namespace scl

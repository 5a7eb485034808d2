// The threads of one call of the op (CallPlan::parallel_tiles). Its ATen steps, O(N * D) each,
// run on the calling thread: each would open an OpenMP region of its own (some two dozen per call)
// for little work, and on a loaded machine every region can wait milliseconds for a core
// (bench/decisions/2026-11-28-cpu-grain.md). The tile kernels, O(N * N * D), get torch's threads
// when the call is past the grain.
#pragma once

#include <c10/util/ParallelGuard.h>

namespace scl {

// While it lives, ATen's parallel_for runs inline on this thread and OpenMP regions opened on it
// get a team of one. c10::ParallelGuard alone is not enough: it is what ATen's native thread pool
// asks, but with the OpenMP backend (torch's Linux wheels) at::in_parallel_region() is
// omp_in_parallel() alone, and some ATen kernels open OpenMP regions directly (index_add_'s
// sort-based scatter: five per call). So this thread's OpenMP thread count is 1 too, which is
// what at::get_num_threads() returns there.
class CallThreads {
 public:
  explicit CallThreads(bool parallel_tiles);
  ~CallThreads();
  CallThreads(const CallThreads&) = delete;
  CallThreads& operator=(const CallThreads&) = delete;

  // Runs the backend's tile kernels (kernels()), with torch's threads where the call has
  // parallel tiles.
  template <typename Kernels>
  decltype(auto) tiles(Kernels&& kernels) const {
    const TorchThreads threads(parallel_tiles_, openmp_threads_);
    return kernels();
  }

 private:
  // When active, torch's threads again for the life of one tile stage: the OpenMP thread count
  // the call replaced.
  class TorchThreads {
   public:
    TorchThreads(bool active, int openmp_threads);
    ~TorchThreads();

   private:
    c10::ParallelGuard guard_;
    const bool active_;
  };

  const bool parallel_tiles_;
  c10::ParallelGuard guard_{true};
  int openmp_threads_ = 0;  // this thread's OpenMP thread count before the call (0: no OpenMP)
};

}  // namespace scl

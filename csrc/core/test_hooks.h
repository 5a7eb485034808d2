// Switches that send CPU calls down the paths a GPU takes, so that the CPU test suite covers them.
// The installed library only reads them, all off; a library built with SCL_BUILD_TESTS=1 also
// registers scl::_set_test_hooks (csrc/testing/test_hooks_op.cpp), which the tests set through
// scl_kernels._testing.test_hooks. One struct read per call instead of environment variables.
#pragma once

#include <cstdint>
#include <string>

namespace scl {

struct TestHooks {
  // Prepare CPU rows as on a GPU: no host reads, value checks deferred (prepare_without_host_reads).
  bool device_preparation = false;
  // Leave any temperature tensor unread on the host, the kernels reading it from memory, where
  // the backend can (TileKernels::reads_temperature).
  bool temperature_in_memory = false;
  // > 0: elements per chunk of the row-wise temporaries, so that small inputs cross chunks.
  int64_t chunk_elements = 0;
  // The CUDA dry run (csrc/cuda_dry_run) records its launches without emulating the tiles, for
  // counting them at sizes where the emulation would take too long.
  bool dry_run_skips_tiles = false;
  // The CUDA dry run answers as a stream that captures a CUDA graph.
  bool dry_run_capturing = false;
  // Non-empty: the CPU kernels' instruction set ("default", "avx2", "avx512"), in place of the
  // one SCL_CPU_CAPABILITY or the hardware chose, so that one process tests every copy.
  std::string cpu_capability;
  // Non-empty: when value checks are read ("when_ready", "end_of_call", "next_call"), in place of
  // SCL_VALUE_CHECKS, which is read once per process (deferred_value_check.h).
  std::string value_checks;
  // Non-empty: the symmetric backward's walk ("triangle", "triangle-async", "rows"), in place of
  // SCL_CUDA_SYMMETRIC_BACKWARD, which is read once per process (call_plan.h), so that one
  // process tests and times every walk.
  std::string symmetric_backward_walk;
  // The CPU kernels see no BLAS, as in a PyTorch build that exports none: the plan refuses.
  bool blas_missing = false;
};

const TestHooks& test_hooks();
void set_test_hooks(const TestHooks& hooks);

}  // namespace scl

// Switches that send CPU calls down the paths a GPU takes, so that the CPU test suite covers them.
// The installed library only reads them, all off; a library built with SCL_BUILD_TESTS=1 also
// registers scl::_set_test_hooks (csrc/testing/test_hooks_op.cpp), whose schema is made from the
// list below and which the tests set by name through scl_kernels._testing.test_hooks. One struct
// read per call instead of environment variables.
//
// The hooks; each is off at its type's zero value (false, 0, ""):
//   device_preparation   prepare CPU rows as on a GPU: no host reads, value checks deferred
//       (prepare_without_host_reads).
//   temperature_in_memory   leave any temperature tensor unread on the host, the kernels reading
//       it from memory, where the backend can (TileKernels::reads_temperature).
//   chunk_elements   > 0: elements per chunk of the row-wise temporaries, so that small inputs
//       cross chunks.
//   dry_run_skips_tiles   the CUDA dry run (csrc/cuda_dry_run) records its launches without
//       emulating the tiles, for counting them at sizes where the emulation would take too long.
//   dry_run_capturing   the CUDA dry run answers as a stream that captures a CUDA graph.
//   cpu_capability   the CPU kernels' instruction set ("default", "avx2", "avx512") in place of
//       the one SCL_CPU_CAPABILITY or the hardware chose, so that one process tests every copy.
//   value_checks   when value checks are read ("when_ready", "end_of_call", "next_call") in place
//       of SCL_VALUE_CHECKS, which is read once per process (deferred_value_check.h).
//   symmetric_backward_walk   the symmetric backward's walk ("triangle", "triangle-async",
//       "rows") in place of SCL_CUDA_SYMMETRIC_BACKWARD, which is read once per process
//       (call_plan.h), so that one process tests and times every walk.
//   blas_missing   the CPU kernels see no BLAS, as in a PyTorch build that exports none: the plan
//       refuses.
//   multi_label_positives   how the CPU and CUDA C++ weigh multi-hot positives: "pair_walk"
//       pair by pair (the CPU's walk, csrc/cpu/positive_walk.cpp; CUDA's class overlaps in
//       blocks, csrc/core/class_overlap_products.h) or "class_subsets" (sums over class subsets,
//       csrc/cpu/class_subset_sums.h, csrc/core/class_subset_gathers.h; an error where the rows
//       do not fit them) in place of the choice by the rows' class counts (class_subsets.h).
// Each row is X(C++ type, name, schema declaration with the zero value as its default).
#pragma once

#include <cstdint>
#include <string>

#define SCL_TEST_HOOKS(X)                                              \
  X(bool, device_preparation, "bool device_preparation=False")         \
  X(bool, temperature_in_memory, "bool temperature_in_memory=False")   \
  X(int64_t, chunk_elements, "int chunk_elements=0")                   \
  X(bool, dry_run_skips_tiles, "bool dry_run_skips_tiles=False")       \
  X(bool, dry_run_capturing, "bool dry_run_capturing=False")           \
  X(std::string, cpu_capability, "str cpu_capability=\"\"")            \
  X(std::string, value_checks, "str value_checks=\"\"")                \
  X(std::string, symmetric_backward_walk, "str symmetric_backward_walk=\"\"") \
  X(bool, blas_missing, "bool blas_missing=False")                     \
  X(std::string, multi_label_positives, "str multi_label_positives=\"\"")

namespace scl {

struct TestHooks {
#define SCL_HOOK_FIELD(type, name, schema) type name{};
  SCL_TEST_HOOKS(SCL_HOOK_FIELD)
#undef SCL_HOOK_FIELD
};

const TestHooks& test_hooks();
void set_test_hooks(const TestHooks& hooks);

}  // namespace scl

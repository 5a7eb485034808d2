// Built only with SCL_BUILD_TESTS=1: the op that sets the test hooks (core/test_hooks.h), called
// by scl_kernels._testing.test_hooks.
#include <torch/library.h>

#include <string>

#include "core/test_hooks.h"

namespace scl {
namespace {

void set_hooks(bool device_preparation, bool temperature_in_memory, int64_t chunk_elements,
               bool dry_run_skips_tiles, bool dry_run_capturing, std::string cpu_capability,
               std::string value_checks, std::string symmetric_backward_walk,
               bool blas_missing) {
  TORCH_CHECK_VALUE(chunk_elements >= 0, "chunk_elements must be >= 0, got ", chunk_elements);
  set_test_hooks({device_preparation, temperature_in_memory, chunk_elements, dry_run_skips_tiles,
                  dry_run_capturing, std::move(cpu_capability), std::move(value_checks),
                  std::move(symmetric_backward_walk), blas_missing});
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(scl, m) {
  m.def("_set_test_hooks(bool device_preparation, bool temperature_in_memory, "
        "int chunk_elements, bool dry_run_skips_tiles, bool dry_run_capturing, "
        "str cpu_capability, str value_checks, str symmetric_backward_walk, "
        "bool blas_missing) -> ()",
        &set_hooks);
}

}  // namespace scl

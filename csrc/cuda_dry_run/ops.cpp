// The CUDA C++ backend's glue on CPU tensors with its launches recorded, not made: a dry run for
// counting them without a GPU and for checking the glue against the reference. Its ops, built
// only with SCL_BUILD_TESTS=1 in a library without the CUDA backend (csrc/build_description.py);
// csrc/cuda/supcon_cuda.cpp registers their CPU kernels.
#include <torch/library.h>

#include "core/call_arguments.h"
#include "supcon_autograd.h"

namespace scl {
namespace {

struct SupConCudaDryRunNames {
  static constexpr const char* kForward = "scl::supcon_cuda_dry_run";
  static constexpr const char* kBackward = "scl::supcon_cuda_dry_run_backward";
};

}  // namespace

TORCH_LIBRARY_FRAGMENT(scl, m) {
  m.def(("supcon_cuda_dry_run" + kForwardSchema).c_str());
  m.def(("supcon_cuda_dry_run_backward" + kBackwardSchema).c_str());
  m.def(("supcon_cuda_dry_run_plan" + kPlanSchema).c_str());
}

TORCH_LIBRARY_IMPL(scl, Autograd, m) {
  m.impl("supcon_cuda_dry_run", &autograd::supcon_autograd<SupConCudaDryRunNames>);
  m.impl("supcon_cuda_dry_run_backward",
         &autograd::supcon_backward_autograd<SupConCudaDryRunNames>);
}

}  // namespace scl

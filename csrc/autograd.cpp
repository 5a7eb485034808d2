// Autograd of the product's fused ops, scl::supcon and scl::supcon_triton (supcon_autograd.h).
#include <torch/library.h>

#include "supcon_autograd.h"

namespace scl {
namespace {

struct SupConNames {
  static constexpr const char* kForward = "scl::supcon";
  static constexpr const char* kBackward = "scl::supcon_backward";
};
struct SupConTritonNames {
  static constexpr const char* kForward = "scl::supcon_triton";
  static constexpr const char* kBackward = "scl::supcon_triton_backward";
};

}  // namespace

TORCH_LIBRARY_IMPL(scl, Autograd, m) {
  m.impl("supcon", &autograd::supcon_autograd<SupConNames>);
  m.impl("supcon_backward", &autograd::supcon_backward_autograd<SupConNames>);
  m.impl("supcon_triton", &autograd::supcon_autograd<SupConTritonNames>);
  m.impl("supcon_triton_backward", &autograd::supcon_backward_autograd<SupConTritonNames>);
}

}  // namespace scl

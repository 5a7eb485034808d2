// Built only with SCL_BUILD_TESTS=1: the op that sets the test hooks (core/test_hooks.h), called
// by scl_kernels._testing.test_hooks with the hooks by name. Its schema and the reading of its
// arguments are made from the hooks' list, so a new hook is one row there.
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <torch/library.h>

#include <string>

#include "core/test_hooks.h"

namespace scl {
namespace {

#define SCL_HOOK_COUNT(type, name, schema) +1
constexpr size_t kHookCount = 0 SCL_TEST_HOOKS(SCL_HOOK_COUNT);
#undef SCL_HOOK_COUNT

// Boxed: the arguments are on the stack in the list's order.
void set_hooks(const c10::OperatorHandle&, torch::jit::Stack* stack) {
  TestHooks hooks;
  size_t next = stack->size() - kHookCount;
#define SCL_READ_HOOK(type, name, schema) hooks.name = (*stack)[next++].to<type>();
  SCL_TEST_HOOKS(SCL_READ_HOOK)
#undef SCL_READ_HOOK
  torch::jit::drop(*stack, kHookCount);
  TORCH_CHECK_VALUE(hooks.chunk_elements >= 0, "chunk_elements must be >= 0, got ",
                    hooks.chunk_elements);
  set_test_hooks(hooks);
}

std::string schema() {
  std::string declarations;
#define SCL_HOOK_DECLARATION(type, name, schema) \
  declarations += (declarations.empty() ? "" : ", ") + std::string(schema);
  SCL_TEST_HOOKS(SCL_HOOK_DECLARATION)
#undef SCL_HOOK_DECLARATION
  return "_set_test_hooks(" + declarations + ") -> ()";
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(scl, m) {
  m.def(schema().c_str(), torch::CppFunction::makeFromBoxedFunction<&set_hooks>());
}

}  // namespace scl

#include "test_hooks.h"

namespace scl {
namespace {

TestHooks& hooks() {
  static TestHooks current;
  return current;
}

}  // namespace

const TestHooks& test_hooks() { return hooks(); }

void set_test_hooks(const TestHooks& next) { hooks() = next; }

}  // namespace scl

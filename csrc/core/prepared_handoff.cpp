#include "prepared_handoff.h"

namespace scl {
namespace {

// On the CPU, kept only while the problem's tiles are at most this many multiply-adds (N = 256 at
// D = 1024): above it the preparation is a small share of the call, and the kept O(N*D) tensors
// (unit rows, class sums) would grow with the batch. On the device's path (off the CPU, or on it
// under the test hook device_preparation: supcon_problem.h) it is kept at every size: there
// the preparation is dozens of launches whose issue time the host pays again in backward
// (bench/decisions/2026-11-26-gpu-call-first-steps-h200.md, "One preparation per step on the
// GPU"), and the O(N*D) kept is a small fraction of what the encoder keeps for the same rows.
constexpr int64_t kKeepWorkOnCpu = int64_t{1} << 26;

bool worth_keeping(const SupConProblem& problem) {
  return prepare_without_host_reads(problem.z) || problem.m * problem.n * problem.d <= kKeepWorkOnCpu;
}

struct HandoffState {
  bool capturing = false;
  c10::intrusive_ptr<PreparedProblem> captured;
  c10::intrusive_ptr<PreparedProblem> reuse;
};

thread_local HandoffState state;

}  // namespace

CaptureForward::CaptureForward() {
  state.capturing = true;
  state.captured.reset();
}

CaptureForward::~CaptureForward() {
  state.capturing = false;
  state.captured.reset();
}

c10::IValue CaptureForward::take() {
  if (!state.captured) return c10::IValue();
  return c10::IValue::make_capsule(std::move(state.captured));
}

ReuseInBackward::ReuseInBackward(const c10::IValue& prepared) {
  state.reuse = prepared.isCapsule()
                    ? c10::static_intrusive_pointer_cast<PreparedProblem>(prepared.toCapsule())
                    : c10::intrusive_ptr<PreparedProblem>();
}

ReuseInBackward::~ReuseInBackward() { state.reuse.reset(); }

void offer_prepared(const SupConProblem& problem) {
  if (!state.capturing || !worth_keeping(problem)) return;
  state.captured = c10::make_intrusive<PreparedProblem>(problem);
}

const SupConProblem* prepared_for_backward() {
  return state.reuse ? &state.reuse->problem : nullptr;
}

}  // namespace scl

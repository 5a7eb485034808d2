// Hands a problem's preparation (norms, class ids, class sums, |P(i)|: the O(N*D) terms of
// supcon_problem.h) from a fused op's forward to its backward, through the op's autograd node.
//
// At fine-tuning sizes (N of 16 to a few hundred) that preparation is a few dozen ATen calls and
// costs as much as the tiles; doing it again in backward made the fused op slower than dense
// PyTorch (bench/decisions/2026-11-22-small-batches-backward-reuses-preparation.md). The op's
// schema stays as it is (raw-op callers and the fakes see nothing): while the autograd kernel
// holds a CaptureForward, the core's forward on the same thread leaves its problem here, and while
// it holds a ReuseInBackward, the core's backward on that thread takes the problem instead of
// preparing it again. Both calls are synchronous on the calling thread, so the hand-over cannot
// cross calls. Off the CPU every problem is kept (one preparation per step); on the CPU only those
// below a size (their O(N*D) tensors then stay small), larger ones being prepared again.
#pragma once

#include <ATen/core/ivalue.h>

#include "supcon_problem.h"

namespace scl {

// What an autograd node keeps between forward and backward (an IValue capsule).
struct PreparedProblem : torch::CustomClassHolder {
  explicit PreparedProblem(SupConProblem problem) : problem(std::move(problem)) {}
  SupConProblem problem;
};

// While alive, supcon_forward on this thread keeps its problem (off the CPU, or small) for take().
class CaptureForward {
 public:
  CaptureForward();
  ~CaptureForward();
  CaptureForward(const CaptureForward&) = delete;
  CaptureForward& operator=(const CaptureForward&) = delete;
  // The captured problem as a capsule, or None when the forward kept nothing.
  c10::IValue take();
};

// While alive, supcon_backward on this thread uses `prepared` (a capsule from take(), or None).
class ReuseInBackward {
 public:
  explicit ReuseInBackward(const c10::IValue& prepared);
  ~ReuseInBackward();
  ReuseInBackward(const ReuseInBackward&) = delete;
  ReuseInBackward& operator=(const ReuseInBackward&) = delete;
};

// For the core: forward offers its problem (kept only under a CaptureForward, and on the CPU
// only if small); backward asks for the one to reuse (null outside a ReuseInBackward or when none).
void offer_prepared(const SupConProblem& problem);
const SupConProblem* prepared_for_backward();

}  // namespace scl

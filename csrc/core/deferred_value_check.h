// Value checks whose verdict is computed where the tensors live and read on the host without
// waiting for the device. Reading an accelerator's flag at once would make the host wait for
// everything queued before it (the caller's encoder, say) and then leave the device idle while
// the op's own launches follow. Instead each flag is copied to pinned memory right behind the
// reduction that computes it, and the verdict is read when the copy has landed:
//
//   SCL_VALUE_CHECKS=when_ready (default): at the end of the call if the device has already run
//     the copies (an event query, no wait; always so for CPU flags), otherwise at the start of
//     the first later call of the op (forward or backward) that finds them done. Until then the
//     call's result is not finite (a NaN or inf row makes its norm, logits and loss non-finite).
//   SCL_VALUE_CHECKS=end_of_call: the host waits for the copies at the end of the call, so the
//     error always comes from the call that received the values (one host wait per forward).
//   SCL_VALUE_CHECKS=next_call: always at the next call, even when the verdict is known: the
//     accelerator's late case, deterministic, so that tests can run it on the CPU.
//
// The variable is read once per process (the tests set the test hook value_checks instead).
// raise_deferred_value_errors() (the op scl::raise_deferred_value_errors) waits for every
// pending check and raises the first failure: the point where a caller wants to know.
#pragma once

#include <ATen/ATen.h>
#include <c10/core/Event.h>

#include <optional>
#include <string>
#include <vector>

namespace scl {

enum class VerdictTiming { kWhenReady, kEndOfCall, kNextCall };

// SCL_VALUE_CHECKS's choice (or the test hook's); a ValueError naming the variable when its
// value is none of the three, from the first call of the op on any device.
VerdictTiming verdict_timing();

class DeferredValueChecks {
 public:
  // Queues the read of `ok` (a bool tensor of one element, on any device); `failure` is the
  // ValueError's message if it turns out false.
  void expect(const at::Tensor& ok, std::string failure);
  // The same for an int32 count of failures (one element): the check passes when it is 0.
  void expect_zero(const at::Tensor& failures, std::string failure);
  // At the end of the call: raises the first failed expectation's ValueError (in the order they
  // were queued) when SCL_VALUE_CHECKS says the verdict is read now, or hands the checks to the
  // later calls.
  void finish_call();

  struct Pending {
    at::Tensor host_verdict;  // pinned copy (accelerator flags) or the flag itself (CPU): a bool
                              // that is true, or an int32 that is 0, when the check passes
    std::string failure;
  };

 private:
  void queue(const at::Tensor& verdict, std::string failure);

  std::vector<Pending> pending_;
  std::optional<c10::Event> copies_done_;  // recorded again after each device-to-host copy
};

// At the start of a call of the op: raises the first failure among earlier calls' checks whose
// copies have landed, and forgets those checks. wait: wait for every pending check first.
void raise_earlier_failures(bool wait);

}  // namespace scl

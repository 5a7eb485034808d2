#include "deferred_value_check.h"

#include "test_hooks.h"

#include <ATen/record_function.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <cstdlib>
#include <mutex>
#include <string>
#include <utility>

namespace scl {
namespace {

VerdictTiming timing_named(const std::string& mode, const char* source) {
  if (mode.empty() || mode == "when_ready") return VerdictTiming::kWhenReady;
  if (mode == "end_of_call") return VerdictTiming::kEndOfCall;
  if (mode == "next_call") return VerdictTiming::kNextCall;
  TORCH_CHECK_VALUE(false, source, " must be when_ready, end_of_call or next_call, got '", mode,
                    "'");
}

// The process's choice: the variable read once, at the first call of the op.
VerdictTiming process_timing() {
  const char* text = std::getenv("SCL_VALUE_CHECKS");
  return timing_named(text == nullptr ? "" : text, "SCL_VALUE_CHECKS");
}

// A named scope, so that a profile shows where the host waits on a device (bench/launch_count.py
// counts these).
void wait_for(c10::Event& copies_done) {
  RECORD_FUNCTION("scl::host_wait_for_value_checks", std::vector<c10::IValue>());
  copies_done.synchronize();
}

const DeferredValueChecks::Pending* first_failure(
    const std::vector<DeferredValueChecks::Pending>& checks) {
  for (const auto& check : checks) {
    const at::Tensor& verdict = check.host_verdict;
    const bool ok = verdict.scalar_type() == at::kBool ? *verdict.const_data_ptr<bool>()
                                                       : *verdict.const_data_ptr<int32_t>() == 0;
    if (!ok) return &check;
  }
  return nullptr;
}

// The checks of calls that returned before their verdict was read.
struct EarlierCall {
  std::vector<DeferredValueChecks::Pending> checks;
  std::optional<c10::Event> copies_done;
};

std::mutex earlier_calls_mutex;
// Never destroyed: at the process's exit torch's device state may be gone before this library's
// statics, and freeing a pinned verdict or a device event then aborts the process (seen on an
// H100 after a benchmark whose last call's verdict had not landed).
std::vector<EarlierCall>& earlier_calls() {
  static auto* calls = new std::vector<EarlierCall>();
  return *calls;
}

}  // namespace

VerdictTiming verdict_timing() {
  static const VerdictTiming chosen = process_timing();
  const std::string& hooked = test_hooks().value_checks;
  return hooked.empty() ? chosen : timing_named(hooked, "the test hook value_checks");
}

void DeferredValueChecks::expect(const at::Tensor& ok, std::string failure) {
  TORCH_INTERNAL_ASSERT(ok.scalar_type() == at::kBool && ok.numel() == 1);
  queue(ok, std::move(failure));
}

void DeferredValueChecks::expect_zero(const at::Tensor& failures, std::string failure) {
  TORCH_INTERNAL_ASSERT(failures.scalar_type() == at::kInt && failures.numel() == 1);
  queue(failures, std::move(failure));
}

void DeferredValueChecks::queue(const at::Tensor& verdict, std::string failure) {
  if (verdict.is_cpu()) {
    pending_.push_back({verdict, std::move(failure)});
    return;
  }
  // Pinned, so that the copy is queued on the device's stream instead of blocking the host.
  at::Tensor host_verdict = at::empty({}, verdict.options().device(at::kCPU).pinned_memory(true));
  host_verdict.copy_(verdict.reshape({}), /*non_blocking=*/true);
  const c10::Device device = verdict.device();
  // One event for all copies, recorded again after each: streams run in order, so the last
  // copy's completion covers the earlier ones queued on the same stream.
  if (!copies_done_.has_value()) copies_done_.emplace(device.type());
  copies_done_->record(c10::impl::getDeviceGuardImpl(device.type())->getStream(device));
  pending_.push_back({std::move(host_verdict), std::move(failure)});
}

void DeferredValueChecks::finish_call() {
  if (pending_.empty()) return;
  const VerdictTiming verdict = verdict_timing();
  if (verdict == VerdictTiming::kEndOfCall && copies_done_.has_value()) wait_for(*copies_done_);
  const bool landed = !copies_done_.has_value() || copies_done_->query();
  if (verdict == VerdictTiming::kNextCall || !landed) {
    const std::lock_guard<std::mutex> lock(earlier_calls_mutex);
    earlier_calls().push_back({std::move(pending_), std::move(copies_done_)});
    pending_.clear();
    copies_done_.reset();
    return;
  }
  const Pending* failed = first_failure(pending_);
  TORCH_CHECK_VALUE(failed == nullptr, failed == nullptr ? "" : failed->failure);
}

void raise_earlier_failures(bool wait) {
  std::string failure;
  {
    const std::lock_guard<std::mutex> lock(earlier_calls_mutex);
    std::vector<EarlierCall>& calls = earlier_calls();
    std::vector<EarlierCall> still_running;
    for (EarlierCall& call : calls) {
      if (call.copies_done.has_value()) {
        if (wait) {
          wait_for(*call.copies_done);
        } else if (!call.copies_done->query()) {
          still_running.push_back(std::move(call));
          continue;
        }
      }
      const DeferredValueChecks::Pending* failed = first_failure(call.checks);
      if (failed != nullptr && failure.empty()) failure = failed->failure;
    }
    calls = std::move(still_running);
  }
  TORCH_CHECK_VALUE(failure.empty(), failure,
                    " (in an earlier call of the op, whose result is not finite: the check ran on "
                    "the device and is reported by the first call after it; SCL_VALUE_CHECKS="
                    "end_of_call reports it before that call returns)");
}

TORCH_LIBRARY_IMPL(scl, CompositeExplicitAutograd, m) {
  m.impl("raise_deferred_value_errors", [] { raise_earlier_failures(/*wait=*/true); });
}

}  // namespace scl

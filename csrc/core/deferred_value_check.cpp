#include "deferred_value_check.h"

#include <ATen/record_function.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

namespace scl {

void DeferredValueChecks::expect(const at::Tensor& ok, std::string failure) {
  TORCH_INTERNAL_ASSERT(ok.scalar_type() == at::kBool && ok.numel() == 1);
  if (ok.is_cpu()) {
    pending_.push_back({ok, std::move(failure)});
    return;
  }
  // Pinned, so that the copy is queued on the device's stream instead of blocking the host.
  at::Tensor host_ok = at::empty({}, ok.options().device(at::kCPU).pinned_memory(true));
  host_ok.copy_(ok.reshape({}), /*non_blocking=*/true);
  const c10::Device device = ok.device();
  // One event for all copies, recorded again after each: streams run in order, so the last
  // copy's completion covers the earlier ones queued on the same stream.
  if (!copies_done_.has_value()) copies_done_.emplace(device.type());
  copies_done_->record(c10::impl::getDeviceGuardImpl(device.type())->getStream(device));
  pending_.push_back({std::move(host_ok), std::move(failure)});
}

void DeferredValueChecks::raise_first_failure() {
  if (pending_.empty()) return;
  // A named scope, so that a profile shows where the host waits on a device (and where, on the
  // CPU's copy of the device path, it would: bench/launch_count.py counts these).
  RECORD_FUNCTION("scl::host_wait_for_value_checks", std::vector<c10::IValue>());
  if (copies_done_.has_value()) copies_done_->synchronize();
  for (const Pending& check : pending_) {
    TORCH_CHECK_VALUE(*check.host_ok.const_data_ptr<bool>(), check.failure);
  }
}

}  // namespace scl

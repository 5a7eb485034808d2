// Value checks whose verdict is computed where the tensors live and read on the host only when
// the op is about to return. On an accelerator, reading a flag at once would make the host wait
// for everything queued before it (the caller's encoder, say) and then leave the device idle
// while the op's own launches follow; here the flag's copy is queued behind its reduction, the
// op queues the rest of its work, and the final read waits for that copy alone, which the device
// reached long before the tile kernels behind it. CPU flags are read directly.
#pragma once

#include <ATen/ATen.h>
#include <c10/core/Event.h>

#include <optional>
#include <string>
#include <vector>

namespace scl {

class DeferredValueChecks {
 public:
  // Queues the read of `ok` (a bool tensor of one element, on any device); `failure` is the
  // ValueError's message if it turns out false.
  void expect(const at::Tensor& ok, std::string failure);
  // Raises the first failed expectation's ValueError, in the order they were queued.
  void raise_first_failure();

 private:
  struct Pending {
    at::Tensor host_ok;  // pinned copy (accelerator flags) or the flag itself (CPU)
    std::string failure;
  };
  std::vector<Pending> pending_;
  std::optional<c10::Event> copies_done_;  // recorded again after each device-to-host copy
};

}  // namespace scl

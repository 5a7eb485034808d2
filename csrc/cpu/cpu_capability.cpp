#include "cpu_capability.h"

#include <ATen/Version.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "../core/test_hooks.h"
#include "isa_target.h"

namespace scl::cpu {
namespace {

constexpr CpuCapability kCapabilities[] = {CpuCapability::kDefault, CpuCapability::kAvx2,
                                           CpuCapability::kAvx512};

// What the processor and the operating system support: the CPUID bits, with the OS saving the
// wide registers (GCC's and clang's runtime checks XGETBV before reporting AVX or AVX-512).
CpuCapability hardware_capability() {
#if SCL_CPU_DISPATCH_X86
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("fma")) {
    return CpuCapability::kAvx512;
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return CpuCapability::kAvx2;
#endif
  return CpuCapability::kDefault;
}

// ATen's choice for its own kernels (it honours ATEN_CPU_CAPABILITY, without checking that the
// CPU can run it): "DEFAULT", "AVX2", "AVX512", or on other architectures names that are no
// x86 ISA, which leave the choice to the hardware.
CpuCapability aten_capability() {
  const std::string name = at::get_cpu_capability();
  if (name == "DEFAULT") return CpuCapability::kDefault;
  if (name == "AVX2") return CpuCapability::kAvx2;
  return CpuCapability::kAvx512;
}

}  // namespace

const char* capability_name(CpuCapability capability) {
  switch (capability) {
    case CpuCapability::kAvx2:
      return "avx2";
    case CpuCapability::kAvx512:
      return "avx512";
    case CpuCapability::kDefault:
      break;
  }
  return "default";
}

namespace {

// The instruction set `requested` names (`source` says who asked, for the errors).
CpuCapability requested_capability(const std::string& requested, CpuCapability hardware,
                                   const char* source) {
  for (const CpuCapability capability : kCapabilities) {
    if (requested != capability_name(capability)) continue;
    TORCH_CHECK(capability <= hardware, "scl: ", source, "=", requested,
                ", but this CPU runs at most ", capability_name(hardware));
    return capability;
  }
  TORCH_CHECK(false, "scl: ", source, "=", requested,
              " is not an instruction set of the CPU kernels: default, avx2 or avx512");
}

// SCL_CPU_CAPABILITY, read once: the process's choice.
CpuCapability process_capability(CpuCapability hardware) {
  const char* requested = std::getenv("SCL_CPU_CAPABILITY");
  if (requested == nullptr || *requested == '\0') return std::min(hardware, aten_capability());
  return requested_capability(requested, hardware, "SCL_CPU_CAPABILITY");
}

}  // namespace

CpuCapability cpu_capability() {
  static const CpuCapability hardware = hardware_capability();
  static const CpuCapability chosen = process_capability(hardware);
  const std::string& hooked = test_hooks().cpu_capability;
  return hooked.empty() ? chosen : requested_capability(hooked, hardware, "the test hook cpu_capability");
}

// The ISA the CPU kernels would use for a call made now: for tests and bug reports.
TORCH_LIBRARY_FRAGMENT(scl, m) {
  m.def("cpu_capability() -> str", [] { return std::string(capability_name(cpu_capability())); });
}

}  // namespace scl::cpu

// Which instruction set the CPU tile kernels run with, chosen at run time as ATen chooses for its
// own kernels: the build carries one copy of the kernels per ISA (supcon_tiles_<isa>.cpp).
#pragma once

namespace scl::cpu {

// The instruction sets the kernels are compiled for, lowest first. kAvx2 means AVX2 + FMA and
// kAvx512 AVX-512 F/BW/VL/DQ + FMA, ATen's meaning of the names. Outside x86-64 only kDefault.
enum class CpuCapability { kDefault, kAvx2, kAvx512 };

// The ISA for this call: the best this CPU runs, lowered to ATen's own choice (so
// ATEN_CPU_CAPABILITY=default lowers it too), unless SCL_CPU_CAPABILITY=default|avx2|avx512
// names one. Raises for any other value of SCL_CPU_CAPABILITY, or one this CPU cannot run.
CpuCapability cpu_capability();

// "default", "avx2" or "avx512": the spelling of SCL_CPU_CAPABILITY.
const char* capability_name(CpuCapability capability);

}  // namespace scl::cpu

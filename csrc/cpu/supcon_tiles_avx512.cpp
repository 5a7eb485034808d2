// The tile kernels for x86-64 CPUs with AVX-512 F/BW/VL/DQ (Intel from Skylake-SP, AMD from Zen 4).
#include "isa_target.h"

#if SCL_CPU_DISPATCH_X86
#include "tile_kernel_baseline.h"  // before the target rises

#define CPU_CAPABILITY scl_avx512
#define CPU_CAPABILITY_AVX512
SCL_TARGET_PUSH("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")
#include "supcon_tiles_kernels.h"
SCL_TARGET_POP
#endif

// The tile kernels for x86-64 CPUs with AVX2 and FMA (Intel from Haswell, AMD from Zen on).
#include "isa_target.h"

#if SCL_CPU_DISPATCH_X86
#include "tile_kernel_baseline.h"  // before the target rises

#define CPU_CAPABILITY scl_avx2
#define CPU_CAPABILITY_AVX2
SCL_TARGET_PUSH("avx2,fma")
#include "supcon_tiles_kernels.h"
SCL_TARGET_POP
#endif

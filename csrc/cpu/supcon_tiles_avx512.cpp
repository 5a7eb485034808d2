// The tile kernels for x86-64 CPUs with AVX-512 F/BW/VL/DQ (Intel from Skylake-SP, AMD from Zen 4).
#include "isa_target.h"

#if SCL_CPU_DISPATCH_X86
#include "tile_kernel_baseline.h"  // before the target rises

#define CPU_CAPABILITY scl_avx512
#define CPU_CAPABILITY_AVX512
SCL_TARGET_PUSH("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")
// GCC 12's avx512fintrin.h leaves the pass-through operand of its unmasked intrinsics
// (_mm512_undefined_ps) uninitialised on purpose, and -Wmaybe-uninitialized reports each use
// inlined into ATen's exp_u20 (GCC bug 105593, fixed in GCC 13 by a self-initialisation).
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include "supcon_tiles_kernels.h"
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic pop
#endif
SCL_TARGET_POP
#endif

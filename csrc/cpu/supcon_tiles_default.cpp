// The tile kernels at the build's baseline instruction set: SSE2 on x86-64, NEON on aarch64, or
// the host's own ISA in a build with SCL_CPU_ARCH_FLAGS=-march=native.
#include "tile_kernel_baseline.h"

#define CPU_CAPABILITY scl_default
#include "supcon_tiles_kernels.h"

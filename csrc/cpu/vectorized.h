// Selects ATen's SIMD implementation from the ISA this file is compiled for (setup.py and
// CMakeLists.txt pass the host's flags unless SCL_CPU_ARCH_FLAGS says otherwise). Must come before
// any other ATen include in a translation unit. The namespace name is ours so that these
// instantiations never collide with libtorch's own.
#pragma once

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512DQ__) && defined(__FMA__)
#define CPU_CAPABILITY_AVX512
#define CPU_CAPABILITY scl_avx512
#elif defined(__AVX2__) && defined(__FMA__)
#define CPU_CAPABILITY_AVX2
#define CPU_CAPABILITY scl_avx2
#else
#define CPU_CAPABILITY scl_default
#endif

#include <ATen/cpu/vec/vec.h>

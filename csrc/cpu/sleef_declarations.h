// SLEEF's vector functions (exp and the like of ATen's AVX2 and AVX-512 vector types) for a file
// whose instruction set was raised inside the file (isa_target.h). sleef.h declares its 256-bit and
// 512-bit functions only where the compiler defines __AVX__ / __AVX512F__, which a raised target
// does not do in C++ (GCC and clang fix those macros before they read the pragma), so this header
// defines them for sleef.h alone. Include it after raising the target, so that the declarations
// take that ISA's calling convention (vectors in ymm / zmm registers, as libtorch's SLEEF has it).
#pragma once

#if defined(CPU_CAPABILITY_AVX2) || defined(CPU_CAPABILITY_AVX512)
#ifndef __AVX__
#define __AVX__ 1
#define SCL_SLEEF_DEFINED_AVX
#endif
#endif
#if defined(CPU_CAPABILITY_AVX512) && !defined(__AVX512F__)
#define __AVX512F__ 1
#define SCL_SLEEF_DEFINED_AVX512F
#endif

#include <sleef.h>

#ifdef SCL_SLEEF_DEFINED_AVX
#undef __AVX__
#undef SCL_SLEEF_DEFINED_AVX
#endif
#ifdef SCL_SLEEF_DEFINED_AVX512F
#undef __AVX512F__
#undef SCL_SLEEF_DEFINED_AVX512F
#endif

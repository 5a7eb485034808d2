// Compiles a stretch of a file for a higher x86-64 instruction set than the build's baseline, so
// that one build carries the tile kernels for several ISAs and picks one at run time
// (cpu_capability.h), with no per-file compiler flags: each per-ISA file raises the target around
// the kernel code it includes.
//
// The hazard is the one-definition rule: an inline function or template outside the per-ISA
// namespaces (std::, c10::, scl::cpu itself) first defined inside a raised stretch is compiled
// for that ISA, and the linker may keep that copy for every caller, baseline ones included. So a
// per-ISA file includes tile_kernel_baseline.h, every such header the kernels use, before raising
// the target: GCC and clang compile a template with the target of its definition, wherever it is
// instantiated. ATen's vector types are the exception by design: they live in a namespace named
// by CPU_CAPABILITY, which each per-ISA file sets to its own name.
#pragma once

// Only GCC and clang (on x86-64) can raise the target inside a file; other compilers and other
// architectures build the baseline kernels alone (on aarch64 NEON is the baseline).
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define SCL_CPU_DISPATCH_X86 1
#else
#define SCL_CPU_DISPATCH_X86 0
#endif

#define SCL_PRAGMA(...) _Pragma(#__VA_ARGS__)
#if defined(__clang__)
#define SCL_TARGET_PUSH(features) \
  SCL_PRAGMA(clang attribute push(__attribute__((target(features))), apply_to = function))
#define SCL_TARGET_POP SCL_PRAGMA(clang attribute pop)
#else
#define SCL_TARGET_PUSH(features) SCL_PRAGMA(GCC push_options) SCL_PRAGMA(GCC target(features))
#define SCL_TARGET_POP SCL_PRAGMA(GCC pop_options)
#endif

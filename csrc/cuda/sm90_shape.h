// The wgmma + TMA family's block shape and which problems it takes: torch-free and CUDA-free, so
// that the launch choices (launch.cpp) are the same in the CUDA build and in the dry run that
// counts launches without a GPU (csrc/cuda_dry_run).
#pragma once

#include <cstdint>

#include "launch.h"
#include "tile_args.h"

namespace scl::cuda::sm90 {

constexpr int kBlock = 128;  // own rows per program, streamed rows per tile
// The resident row width (D padded with zeros, which TMA fills): 128, or 256 for D in (128, 256],
// whose two-stage ring (128 KiB) and own block (64 KiB) still fit the 227 KiB of shared memory
// because the backward's weights stay in registers.
constexpr int kMaxWidth = 256;
constexpr int resident_width(int64_t d) { return d <= 128 ? 128 : kMaxWidth; }

// Whether the wgmma kernels take this problem: 16-bit inputs, D within their resident block, on
// sm_90 (the build compiles their bodies for sm_90a only).
inline bool supports(const TileProblem& p, const Device& device) {
  return device.compute_capability == 90 && p.type != ElementType::kFloat32 && p.d <= kMaxWidth &&
         p.own.rows < (int64_t{1} << 31) && p.streamed.rows < (int64_t{1} << 31);
}

// Whether the triangle backward takes a problem supports() takes (D within 128).
inline bool supports_triangle(const TileProblem& p) { return resident_width(p.d) == kBlock; }

}  // namespace scl::cuda::sm90

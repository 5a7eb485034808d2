// Which streamed tiles a program of the wgmma kernels walks, in which order: one schedule per kind
// of walk (sm90_kernels.cuh picks it). The program's own row block is blockIdx.x; blockIdx.y
// splits a walk's tiles or, in the full-row backward walks, chunks the gradient's columns. The
// schedules' arithmetic is tile_math.h's, which the CPU tests check.
#pragma once

#include "../core/tile_math.h"
#include "sm90_mainloop.cuh"
#include "tile_args.h"

namespace scl::cuda::sm90 {

namespace tm = scl::tile_math;

// Gradient columns per backward program (grid.y chunks them, each recomputing the logits): the
// whole row at D <= 128, two programs at 256 (a 64 x 256 fp32 accumulator beside the logits'
// spills). The plain walks spilled at 128 while their weights went through shared memory.
constexpr int kGradWidth = 128;

// The forward walks: the own block against every streamed block (the plain forward) or, kUpper,
// against blocks J = I .. nb - 1 (the symmetric forward's upper triangle, diagonal first), split
// among grid.y programs.
template <bool kUpper>
struct SplitSchedule {
  static constexpr bool kDiagonalFirst = kUpper;
  static constexpr bool kClusterPairs = false;
  static constexpr int grad_chunk = 0;
  int64_t own_block, row0;
  int64_t first_block;  // of the walk, before the split
  tm::TileRange range;
  int64_t tile_count;

  __device__ __forceinline__ static SplitSchedule of(const TileProblem& p, const WalkOutputs& out) {
    const int64_t own_block = blockIdx.x, row0 = own_block * kBlock;
    const int64_t streamed_blocks = (p.streamed.rows + kBlock - 1) / kBlock;
    const int64_t first_block = kUpper ? own_block : 0;
    const tm::TileRange range = tm::split_range(streamed_blocks - first_block, out.num_splits, blockIdx.y);
    return {own_block, row0, first_block, range, range.end - range.begin};
  }
  __device__ __forceinline__ int64_t tiles() const { return tile_count; }
  __device__ __forceinline__ int64_t streamed_block(int64_t t) const { return first_block + range.begin + t; }
  // Only the first tile of the first split: block I against itself.
  __device__ __forceinline__ bool first_tile_is_diagonal() const { return range.begin == 0; }
};

// The full-row backward walks: the own block against every streamed block, for gradient columns
// [kGradWidth chunk, kGradWidth chunk + kGradWidth), chunk = grid.y.
struct FullRowSchedule {
  static constexpr bool kDiagonalFirst = false;
  static constexpr bool kClusterPairs = false;
  int64_t own_block, row0;
  int64_t streamed_blocks;
  int grad_chunk;

  __device__ __forceinline__ static FullRowSchedule of(const TileProblem& p, const WalkOutputs&) {
    const int64_t own_block = blockIdx.x, row0 = own_block * kBlock;
    return {own_block, row0, (p.streamed.rows + kBlock - 1) / kBlock, int(blockIdx.y)};
  }
  __device__ __forceinline__ int64_t tiles() const { return streamed_blocks; }
  __device__ __forceinline__ int64_t streamed_block(int64_t t) const { return t; }
};

// The triangle backward's cluster pairs (row blocks 2p, 2p + 1, tile_math::pair_triangle_*): both
// programs of a pair walk the same tiles, split alike among grid.y programs, whose column sides
// they add together.
struct PairTriangleSchedule {
  static constexpr bool kDiagonalFirst = false;
  static constexpr bool kClusterPairs = true;
  static constexpr int grad_chunk = 0;  // the whole 128-wide row
  int64_t own_block, row0;
  tm::TileRange range;
  int64_t tile_count;

  __device__ __forceinline__ static PairTriangleSchedule of(const TileProblem& p, const WalkOutputs& out) {
    const int64_t own_block = blockIdx.x, row0 = own_block * kBlock;
    const int64_t streamed_blocks = (p.streamed.rows + kBlock - 1) / kBlock;
    const tm::TileRange range =
        tm::split_range(tm::pair_triangle_tiles(streamed_blocks, own_block), out.num_splits, blockIdx.y);
    return {own_block, row0, range, range.end - range.begin};
  }
  __device__ __forceinline__ int64_t tiles() const { return tile_count; }
  __device__ __forceinline__ int64_t streamed_block(int64_t t) const {
    return tm::pair_triangle_column_block(own_block, range.begin + t);
  }
  // Whether tile t also adds the column block's side (the partner adds the other half of it).
  __device__ __forceinline__ bool has_column_side(int64_t t) const { return tm::pair_triangle_has_column_side(range.begin + t); }
};

}  // namespace scl::cuda::sm90

// What both kernel families do with a tile of dot products once the product is done: base-2
// logits, the self-column mask, then gradient weights or the rows' running log-sum-exps
// (csrc/core/tile_math.h has the arithmetic, fragments.cuh the reductions).
#pragma once

#include <cstdint>
#include <type_traits>

#include "../core/tile_math.h"
#include "fragments.cuh"
#include "tile_args.h"
#include "walk_terms.h"

namespace scl::cuda {

// Whether a tile of own rows [own0, own0 + own_rows) against streamed rows [streamed0,
// streamed0 + streamed_rows) holds an anchor's self column. Own rows are the anchors, except in
// the columns walk, whose own rows are columns and whose streamed rows are the anchors.
template <Walk kWalk>
__device__ __forceinline__ bool walk_tile_holds_self_column(int64_t own0, int64_t own_rows,
                                                            int64_t streamed0, int64_t streamed_rows,
                                                            int64_t self_offset) {
  return kWalk == Walk::kGradColumns
             ? tile_math::tile_holds_self_column(streamed0, streamed_rows, own0, own_rows, self_offset)
             : tile_math::tile_holds_self_column(own0, own_rows, streamed0, streamed_rows, self_offset);
}

// The group mask where a kernel is compiled with it (kGroups): a row's ids, read once per walk
// or tile (TileProblem::own_groups, padded: no bounds), and which of a thread's tile elements
// the mask takes out, a bit per row and column. Each column's ids are read once per tile and
// compared with every row's at once, so that none stay in registers through the tile (read
// per element, every column's ids were kept for the thread's next row, and spilled). Without
// the mask nothing is read or compared.
template <bool kGroups>
struct RowGroup {
  tile_math::GroupId id;
  __device__ __forceinline__ static RowGroup load(const tile_math::GroupId* ids, int64_t row) {
    const int2 both = __ldg(reinterpret_cast<const int2*>(ids + row));
    return {{both.x, both.y}};
  }
};
template <>
struct RowGroup<false> {
  __device__ __forceinline__ static RowGroup load(const tile_math::GroupId*, int64_t) { return {}; }
};

// column_row(c): the row of `ids` that a thread's column c is.
template <bool kGroups, int kRows, int kCols>
struct GroupMask {
  static_assert(kCols <= 64, "a bit per column");
  using Bits = std::conditional_t<(kCols <= 32), uint32_t, uint64_t>;
  Bits bits[kRows];

  // Columns a few at a time, in a loop not unrolled: unrolled, a tile's loads were all issued
  // at once, and their registers spilled in the sm_90a triangle and columns walks.
  static constexpr int kColumnsAtOnce = kCols % 8 == 0 ? 8 : kCols;

  template <class ColumnRow>
  __device__ __forceinline__ GroupMask(const RowGroup<true> (&rows)[kRows], const tile_math::GroupId* ids,
                                       ColumnRow&& column_row) {
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) bits[r] = 0;
#pragma unroll 1
    for (int c0 = 0; c0 < kCols; c0 += kColumnsAtOnce) {
      CUTE_UNROLL
      for (int k = 0; k < kColumnsAtOnce; ++k) {
        const tile_math::GroupId column = RowGroup<true>::load(ids, column_row(c0 + k)).id;
        CUTE_UNROLL
        for (int r = 0; r < kRows; ++r) bits[r] |= Bits(tile_math::group_masks_pair(rows[r].id, column)) << (c0 + k);
      }
    }
  }
  __device__ __forceinline__ bool operator()(int r, int c) const { return (bits[r] >> c) & 1; }
};
template <int kRows, int kCols>
struct GroupMask<false, kRows, kCols> {
  template <class ColumnRow>
  __device__ __forceinline__ GroupMask(const RowGroup<false> (&)[kRows], const tile_math::GroupId*, ColumnRow&&) {}
  __device__ __forceinline__ bool operator()(int, int) const { return false; }
};

// Rewrites a tile's dot products in place: `acc_rc` and `coords_rc` are the accumulator and its
// coordinates seen as (rows, columns) (fragments.cuh), own(r) the terms of view row r,
// streamed(c) those of local column c, is_self(r, c) whether the element is an anchor's own
// column, group_masked(r, c) whether the group mask takes it out (GroupMask). The lse walk
// leaves base-2 logits and adds the tile to running[r]; the gradient walks leave each
// element's weight (G r_j, unscaled by the row's coef in the plain walks).
template <Walk kWalk, int kRows, int kCols, class AccRC, class CoordsRC, class Own, class Streamed,
          class IsSelf, class GroupMasked>
__device__ __forceinline__ void tile_epilogue(AccRC& acc_rc, const CoordsRC& coords_rc, Own&& own,
                                              Streamed&& streamed, IsSelf&& is_self,
                                              const GroupMasked& group_masked,
                                              tile_math::RunningLse2* running) {
  namespace tm = tile_math;
  using Terms = WalkTerms<kWalk>;
  static_assert(kWalk != Walk::kLseSymmetric, "the symmetric forward adds both sides of a tile: its kernels walk their own");
  CUTE_UNROLL
  for (int r = 0; r < kRows; ++r) {
    const auto own_r = Terms::Own::of(own(r));
    float tile_max = -INFINITY;
    CUTE_UNROLL
    for (int c = 0; c < kCols; ++c) {
      const auto streamed_c = Terms::Streamed::of(streamed(cute::get<1>(coords_rc(r, c))));
      float s2 = Terms::logit2(acc_rc(r, c), own_r, streamed_c);
      if (is_self(r, c)) s2 = -INFINITY;
      if (group_masked(r, c)) s2 = -INFINITY;
      if constexpr (kWalk != Walk::kLsePlain) s2 = Terms::weight(s2, own_r, streamed_c);
      acc_rc(r, c) = s2;
      tile_max = fmaxf(tile_max, s2);
    }
    if constexpr (kWalk == Walk::kLsePlain) {
      tile_max = quad_max(tile_max);
      const float shift = running[r].shift_for(tile_max);
      float sum = 0.f;
      CUTE_UNROLL
      for (int c = 0; c < kCols; ++c) sum += tm::exp2_approx(acc_rc(r, c) - shift);
      running[r].add(tile_max, quad_sum(sum));
    }
  }
}

}  // namespace scl::cuda

// What both kernel families do with a tile of dot products once the product is done: base-2
// logits, the self-column mask, then gradient weights or the rows' running log-sum-exps
// (csrc/core/tile_math.h has the arithmetic, fragments.cuh the reductions).
#pragma once

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

// Rewrites a tile's dot products in place: `acc_rc` and `coords_rc` are the accumulator and its
// coordinates seen as (rows, columns) (fragments.cuh), own(r) the terms of view row r,
// streamed(c) those of local column c, is_self(r, c) whether the element is an anchor's own
// column. The lse walk leaves base-2 logits and adds the tile to running[r]; the gradient walks
// leave each element's weight (G r_j, unscaled by the row's coef in the plain walks).
template <Walk kWalk, int kRows, int kCols, class AccRC, class CoordsRC, class Own, class Streamed,
          class IsSelf>
__device__ __forceinline__ void tile_epilogue(AccRC& acc_rc, const CoordsRC& coords_rc, Own&& own,
                                              Streamed&& streamed, IsSelf&& is_self,
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

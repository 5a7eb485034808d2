// What both kernel families do with a tile of dot products once the product is done: base-2
// logits, the self-column mask, then gradient weights or the rows' running log-sum-exps
// (csrc/core/tile_math.h has the arithmetic, fragments.cuh the reductions).
#pragma once

#include "../core/tile_math.h"
#include "fragments.cuh"
#include "tile_args.h"

namespace scl::cuda {

// The walks of an own row block over streamed tiles (tile_args.h says what their terms hold).
// kGradTriangle (sm_90a) is the symmetric backward over the upper triangle by cluster pairs: its
// tiles' weights are those of kGradRowsSymmetric, both sides of a tile are added.
enum class Walk { kLsePlain, kLseSymmetric, kGradRowsPlain, kGradRowsSymmetric, kGradColumns, kGradTriangle };

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
  CUTE_UNROLL
  for (int r = 0; r < kRows; ++r) {
    const RowTerms own_r = own(r);
    float tile_max = -INFINITY;
    CUTE_UNROLL
    for (int c = 0; c < kCols; ++c) {
      const RowTerms st = streamed(cute::get<1>(coords_rc(r, c)));
      // The columns walk's own rows are columns: the same rounding as the rows walk's logit.
      float s2 = kWalk == Walk::kGradColumns ? tm::logit2(acc_rc(r, c), st.x, own_r.x, 0.f)
                                             : tm::logit2(acc_rc(r, c), own_r.x, st.x, st.y);
      if (is_self(r, c)) s2 = -INFINITY;
      if constexpr (kWalk == Walk::kGradRowsSymmetric || kWalk == Walk::kGradTriangle) {
        s2 = tm::symmetric_grad_weight(s2, own_r.w, st.x, st.w);
      } else if constexpr (kWalk == Walk::kGradRowsPlain) {
        s2 = tm::plain_grad_weight(s2, {own_r.y, own_r.z}, st.z);
      } else if constexpr (kWalk == Walk::kGradColumns) {
        s2 = tm::plain_grad_weight(s2, {st.y, st.z}, st.w);
      }
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

// The symmetric forward's epilogue (Walk::kLseSymmetric) on the wgmma kernels. Its tile is
// computed transposed (rows: the tile's block J, columns: the own block I), so one exp
// E = 2^(s2 - log2(e)/t) per element serves both sides: the sums of J are row sums within a quad,
// added to global memory by one atomic per row and tile; the sums of I accumulate element-wise
// in registers and are added once, at the end.
#pragma once

#include "../core/tile_math.h"
#include "fragments.cuh"
#include "sm90_mainloop.cuh"
#include "tile_args.h"
#include "tile_epilogue.cuh"
#include "walk_terms.h"

namespace scl::cuda::sm90 {

template <class Mainloop, class Schedule, bool kGroups>
struct LseSymmetricEpilogue {
  static constexpr bool kTransposedLogits = true;
  using EpilogueStorage = NoEpilogueStorage;
  using Terms = WalkTerms<Walk::kLseSymmetric>;

  Mainloop& m;
  const Schedule& schedule;
  const TileProblem& p;
  const WalkOutputs& out;
  typename Mainloop::Acc sums_i;  // the own rows' sums, per accumulator element

  __device__ __forceinline__ LseSymmetricEpilogue(Mainloop& mainloop, const Schedule& s, const TileProblem& problem,
                                                  const WalkOutputs& o)
      : m(mainloop), schedule(s), p(problem), out(o), sums_i(partition_fragment_C(mainloop.logits_mma, typename Mainloop::Tile{})) {
    clear(sums_i);
  }

  // The diagonal tile (block I against itself) masks the self column; its rows are block I's
  // own, which the column sums already count. The group mask: the tile's rows are block J's,
  // its columns block I's (the tile is transposed).
  template <class Diagonal>
  __device__ __forceinline__ void tile(int64_t t, int stage, Diagonal) {
    constexpr bool kDiagonal = Diagonal::value;
    const int64_t c0 = schedule.streamed_block(t) * kBlock;
    auto acc_rc = m.acc_rc();
    const auto coords_rc = m.coords_rc();
    Tensor sums_rc = make_tensor(sums_i.data(), sm90_rows_columns(sums_i.layout()));
    RowGroup<kGroups> group_j[Mainloop::kRows];
    CUTE_UNROLL
    for (int r = 0; r < Mainloop::kRows; ++r) {
      group_j[r] = RowGroup<kGroups>::load(p.streamed_groups, c0 + m.rows0 + get<0>(coords_rc(r, 0)));
    }
    const GroupMask<kGroups, Mainloop::kRows, Mainloop::kCols> group_masked(
        group_j, p.own_groups, [&](int c) { return schedule.row0 + get<1>(coords_rc(0, c)); });
    CUTE_UNROLL
    for (int r = 0; r < Mainloop::kRows; ++r) {
      const int local_j = m.rows0 + get<0>(coords_rc(r, 0));
      const auto row_j = Terms::Streamed::of(m.streamed_row_terms(stage, local_j));
      float sum_j = 0.f;
      CUTE_UNROLL
      for (int c = 0; c < Mainloop::kCols; ++c) {
        const int local_i = get<1>(coords_rc(r, c));
        float s2 = Terms::logit2(acc_rc(r, c), Terms::Own::of(m.own_row_terms(local_i)), row_j);
        if (kDiagonal && local_i == local_j) s2 = -INFINITY;
        if (group_masked(r, c)) s2 = -INFINITY;
        const float e = tile_math::exp2_approx(s2);
        sums_rc(r, c) += e;
        sum_j += e;
      }
      sum_j = quad_sum(sum_j);
      if (!kDiagonal && (m.thread & 3) == 0) atomicAdd(out.row_sum + c0 + local_j, sum_j);
    }
    m.release(stage);
  }
  __device__ __forceinline__ void finish_walk() {}

  __device__ __forceinline__ void store() {
    const auto coords_rc = m.coords_rc();
    Tensor sums_rc = make_tensor(sums_i.data(), sm90_rows_columns(sums_i.layout()));
    CUTE_UNROLL
    for (int c = 0; c < Mainloop::kCols; ++c) {
      float s = 0.f;
      CUTE_UNROLL
      for (int r = 0; r < Mainloop::kRows; ++r) s += sums_rc(r, c);
      atomicAdd(out.row_sum + schedule.row0 + get<1>(coords_rc(0, c)), s);
    }
  }
};

}  // namespace scl::cuda::sm90

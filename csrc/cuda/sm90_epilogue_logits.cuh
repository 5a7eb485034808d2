// The first step of every sm_90a walk's epilogue but the symmetric forward's: a streamed tile's
// logits in the consumer's accumulator rewritten in place as the walk's values (base-2 logits
// added to the rows' running LSE, or gradient weights), the self column masked
// (tile_epilogue.cuh has the arithmetic, shared with the mma.sync kernels).
#pragma once

#include "../core/tile_math.h"
#include "sm90_mainloop.cuh"
#include "tile_args.h"
#include "tile_epilogue.cuh"

namespace scl::cuda::sm90 {

// The group ids of the consumer's own rows (RowGroup), read once, when the walk starts.
template <bool kGroups, class Mainloop>
struct OwnGroups {
  RowGroup<kGroups> row[Mainloop::kRows];

  __device__ __forceinline__ OwnGroups(const Mainloop& m, const TileProblem& p) {
    const auto coords_rc = m.coords_rc();
    CUTE_UNROLL
    for (int r = 0; r < Mainloop::kRows; ++r) {
      row[r] = RowGroup<kGroups>::load(p.own_groups, m.first_row + get<0>(coords_rc(r, 0)));
    }
  }
};

// `running`: the rows' running LSE in the forward (kLsePlain), unused by the backward walks.
template <Walk kWalk, bool kGroups, class Mainloop, class Schedule>
__device__ __forceinline__ void tile_values(Mainloop& m, const Schedule& schedule, const TileProblem& p,
                                            const OwnGroups<kGroups, Mainloop>& own_groups, int64_t t,
                                            int stage, tile_math::RunningLse2* running) {
  const int64_t c0 = schedule.streamed_block(t) * kBlock;
  const bool masked = walk_tile_holds_self_column<kWalk>(schedule.row0, kBlock, c0, kBlock, p.self_offset);
  // In a masked tile the self column lies within a tile's width of the diagonal, so one
  // 32-bit offset per tile replaces two 64-bit compares per logit: local column = local row
  // + self_delta (in the columns walk, own row i + self_offset is anchor i's self column).
  const int self_delta = !masked ? 0
                         : kWalk == Walk::kGradColumns ? int(m.first_row - c0 - p.self_offset)
                                                       : int(m.first_row + p.self_offset - c0);
  auto acc_rc = m.acc_rc();
  const auto coords_rc = m.coords_rc();
  const GroupMask<kGroups, Mainloop::kRows, Mainloop::kCols> group_masked(
      own_groups.row, p.streamed_groups, [&](int c) { return c0 + get<1>(coords_rc(0, c)); });
  tile_epilogue<kWalk, Mainloop::kRows, Mainloop::kCols>(
      acc_rc, coords_rc, [&](int r) { return m.acc_row_terms(r); },
      [&](int c) { return m.streamed_row_terms(stage, c); },
      [&](int r, int c) { return masked && get<1>(coords_rc(r, c)) == get<0>(coords_rc(r, c)) + self_delta; },
      group_masked, running);
}

}  // namespace scl::cuda::sm90

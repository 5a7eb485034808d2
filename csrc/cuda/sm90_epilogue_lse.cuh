// The plain forward's epilogue (Walk::kLsePlain) on the wgmma kernels: each of the consumer's rows
// keeps a running base-2 log-sum-exp over the program's split of the tiles, written at the end
// as one (max, sum) pair per row and split, which the glue merges in float64.
#pragma once

#include "../core/tile_math.h"
#include "sm90_epilogue_logits.cuh"
#include "sm90_mainloop.cuh"
#include "tile_args.h"

namespace scl::cuda::sm90 {

template <class Mainloop, class Schedule, bool kGroups>
struct LsePlainEpilogue {
  static constexpr bool kTransposedLogits = false;
  using EpilogueStorage = NoEpilogueStorage;

  tile_math::RunningLse2 running[Mainloop::kRows];
  Mainloop& m;
  const Schedule& schedule;
  const TileProblem& p;
  const WalkOutputs& out;
  OwnGroups<kGroups, Mainloop> own_groups;

  __device__ __forceinline__ LsePlainEpilogue(Mainloop& mainloop, const Schedule& s, const TileProblem& problem,
                                              const WalkOutputs& o)
      : m(mainloop), schedule(s), p(problem), out(o), own_groups(mainloop, problem) {}

  __device__ __forceinline__ void tile(int64_t t, int stage, std::false_type) {
    tile_values<Walk::kLsePlain>(m, schedule, p, own_groups, t, stage, running);
    m.release(stage);
  }
  __device__ __forceinline__ void finish_walk() {}

  __device__ __forceinline__ void store() {
    const auto coords_rc = m.coords_rc();
    CUTE_UNROLL
    for (int r = 0; r < Mainloop::kRows; ++r) {
      const int64_t row = m.first_row + get<0>(coords_rc(r, 0));
      if (row < p.own.rows && (m.thread & 3) == 0) {
        out.part_max[int64_t(blockIdx.y) * p.own.rows + row] = running[r].max;
        out.part_sum[int64_t(blockIdx.y) * p.own.rows + row] = running[r].sum;
      }
    }
  }
};

}  // namespace scl::cuda::sm90

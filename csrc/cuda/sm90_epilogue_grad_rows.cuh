// The full-row backward walks' epilogue on the wgmma kernels (Walk::kGradRowsPlain,
// kGradRowsSymmetric, kGradColumns), and the own rows' gradient product they share with the
// triangle (sm90_epilogue_triangle.cuh).
//
// The backward's weights stay in registers: rounded to T they are the A operand of a second,
// register-sourced wgmma (as FlashAttention-3 feeds P to its PV product; the accumulator's and
// the A operand's fragments place the same (row, column) in the same register, checked on the
// host), whose B operand is the streamed tile itself, read as (D, rows): the TMA's K-major
// 128-byte swizzled rows are exactly wgmma's MN-major swizzled layout.
#pragma once

#include <utility>

#include "fragments.cuh"
#include "sm90_epilogue_logits.cuh"
#include "sm90_mainloop.cuh"
#include "sm90_tile_scheduler.cuh"
#include "tile_args.h"
#include "walk_terms.h"

namespace scl::cuda::sm90 {

// dZ_I += W Z_J over a walk: the consumer's 64 own rows by kGradWidth gradient columns in fp32
// registers, W the tile's weights left in the logits accumulator.
template <class T, class Mainloop>
struct OwnRowsGradient {
  using L = typename Mainloop::L;
  using GradTile = Shape<Int<kRowsPerConsumer>, Int<kGradWidth>>;
  using GradsMma = decltype(make_tiled_mma(typename Atoms<T>::Grads{}));
  using GradsThread = decltype(std::declval<GradsMma&>().get_thread_slice(0));
  using Grad = decltype(partition_fragment_C(std::declval<GradsMma&>(), GradTile{}));

  GradsMma grads_mma;
  GradsThread grads_thr;
  Grad grad;

  __device__ __forceinline__ explicit OwnRowsGradient(int thread)
      : grads_mma(make_tiled_mma(typename Atoms<T>::Grads{})),
        grads_thr(grads_mma.get_thread_slice(thread)),
        grad(partition_fragment_C(grads_mma, GradTile{})) {
    clear(grad);
  }

  // Adds the tile in `stage` times its weights (m.acc), gradient columns [kGradWidth chunk,
  // kGradWidth chunk + kGradWidth). `while_running` runs between the wgmma's issue and its wait.
  template <class WhileRunning>
  __device__ __forceinline__ void add_tile(Mainloop& m, int stage, int chunk, WhileRunning&& while_running) {
    // (row, column) of the grads wgmma's A fragment: the consumer's weights (its rows, tile rows).
    Tensor weight_coords = grads_thr.partition_A(make_identity_tensor(typename Mainloop::Tile{}));
    // The weights as the grads wgmma's A operand: element i of its fragment is element i of
    // the accumulator (the same (row, column); csrc/tests/fragment_layout_check.cpp).
    Tensor weights = make_tensor<T>(shape(weight_coords));
    CUTE_UNROLL
    for (int i = 0; i < size(m.acc); ++i) weights(i) = T(m.acc(i));
    // The wgmma reads its register operand asynchronously: the fences keep the compiler from
    // moving the conversions after it or reusing those registers before the wait.
    warpgroup_fence_operand(weights);
    warpgroup_fence_operand(grad);
    warpgroup_arrive();
    gemm(grads_mma, weights,
         grads_thr.make_fragment_B(grads_thr.partition_B(
             local_tile(make_tensor(make_smem_ptr(m.stage_rows(stage)), typename L::BlockTransposed{}),
                        Shape<Int<kGradWidth>, Int<kBlock>>{}, make_coord(chunk, 0)))),
         grad);
    warpgroup_commit_batch();
    while_running();
    warpgroup_wait<0>();
    warpgroup_fence_operand(grad);
    warpgroup_fence_operand(weights);
  }

  // Each element's (row, column) in the consumer's 64 x kGradWidth gradient tile.
  __device__ __forceinline__ auto coords() { return grads_thr.partition_C(make_identity_tensor(GradTile{})); }
};

// Every gradient row is written by one program (no atomics): the walk's sum over all streamed
// tiles, scaled in the plain rows walk by the anchor's coef.
template <Walk kWalk, class T, class Mainloop, class Schedule, bool kGroups>
struct GradRowsEpilogue {
  static_assert(kWalk == Walk::kGradRowsPlain || kWalk == Walk::kGradRowsSymmetric || kWalk == Walk::kGradColumns);
  static constexpr bool kTransposedLogits = false;
  using EpilogueStorage = NoEpilogueStorage;

  Mainloop& m;
  const Schedule& schedule;
  const TileProblem& p;
  const WalkOutputs& out;
  OwnRowsGradient<T, Mainloop> own_rows;
  OwnGroups<kGroups, Mainloop> own_groups;

  __device__ __forceinline__ GradRowsEpilogue(Mainloop& mainloop, const Schedule& s, const TileProblem& problem,
                                              const WalkOutputs& o)
      : m(mainloop), schedule(s), p(problem), out(o), own_rows(mainloop.thread), own_groups(mainloop, problem) {}

  __device__ __forceinline__ void tile(int64_t t, int stage, std::false_type) {
    tile_values<kWalk>(m, schedule, p, own_groups, t, stage, nullptr);
    own_rows.add_tile(m, stage, schedule.grad_chunk, [] {});
    m.release(stage);
  }
  __device__ __forceinline__ void finish_walk() {}

  __device__ __forceinline__ void store() {
    Tensor out_coords = own_rows.coords();
    Tensor grad_rc = make_tensor(own_rows.grad.data(), sm90_rows_columns(own_rows.grad.layout()));
    Tensor out_rc = make_tensor(out_coords.data(), sm90_rows_columns(out_coords.layout()));
    CUTE_UNROLL
    for (int r = 0; r < size<0>(grad_rc); ++r) {
      const int64_t row = m.first_row + get<0>(out_rc(r, 0));
      if (row >= p.own.rows) continue;
      float scale = 1.f;
      if constexpr (kWalk == Walk::kGradRowsPlain) scale = WalkTerms<kWalk>::Own::of(m.acc_row_terms(r)).coef;
      CUTE_UNROLL
      for (int c = 0; c < size<1>(grad_rc); ++c) {
        const int64_t col = schedule.grad_chunk * kGradWidth + get<1>(out_rc(r, c));
        if (col < out.grad_columns) out.grad[row * out.grad_columns + col] = grad_rc(r, c) * scale;
      }
    }
  }
};

}  // namespace scl::cuda::sm90

// The wgmma + TMA kernels (sm_90a) for 16-bit inputs whose rows fit a resident block 128 or 256
// elements wide (D <= 256 after padding): the headline case. Everything else runs the mma.sync
// family.
//
// A program is three warpgroups: a producer that streams tiles by TMA and two consumers that
// take turns at each tile's logits wgmma (sm90_mainloop.cuh, shared by every walk). A walk is
// the main loop plus three pieces, picked by WalkPieces below: its tile schedule
// (sm90_tile_scheduler.cuh), its epilogue (sm90_epilogue_*.cuh: what a consumer does with a
// tile's logits and what it writes at the end) and what that epilogue keeps in shared memory.
// Every piece is inlined into one kernel per walk, so the split costs no instruction.
#pragma once

#include "sm90_epilogue_grad_rows.cuh"
#include "sm90_epilogue_lse.cuh"
#include "sm90_epilogue_lse_symmetric.cuh"
#include "sm90_epilogue_triangle.cuh"
#include "sm90_mainloop.cuh"
#include "sm90_tile_scheduler.cuh"
#include "tile_args.h"
#include "walk_terms.h"

namespace scl::cuda::sm90 {

// A walk's schedule, epilogue (over a consumer's Mainloop) and shared storage.
template <Walk kWalk, class T>
struct WalkPieces {  // the full-row backward walks
  using Schedule = FullRowSchedule;
  template <class Mainloop, bool kGroups>
  using Epilogue = GradRowsEpilogue<kWalk, T, Mainloop, Schedule, kGroups>;
  using EpilogueStorage = NoEpilogueStorage;
  static constexpr bool kLongTiles = false;  // see ring_stages
};
template <class T>
struct WalkPieces<Walk::kLsePlain, T> {
  using Schedule = SplitSchedule</*kUpper=*/false>;
  template <class Mainloop, bool kGroups>
  using Epilogue = LsePlainEpilogue<Mainloop, Schedule, kGroups>;
  using EpilogueStorage = NoEpilogueStorage;
  static constexpr bool kLongTiles = false;
};
template <class T>
struct WalkPieces<Walk::kLseSymmetric, T> {
  using Schedule = SplitSchedule</*kUpper=*/true>;
  template <class Mainloop, bool kGroups>
  using Epilogue = LseSymmetricEpilogue<Mainloop, Schedule, kGroups>;
  using EpilogueStorage = NoEpilogueStorage;
  static constexpr bool kLongTiles = false;
};
template <class T, class Exchange>
struct TrianglePieces {
  using Schedule = PairTriangleSchedule;
  template <class Mainloop, bool kGroups>
  using Epilogue = TriangleEpilogue<T, Mainloop, Schedule, Exchange, kGroups>;
  using EpilogueStorage = TriangleStorage<T, Exchange>;
  static constexpr bool kLongTiles = true;
};
template <class T>
struct WalkPieces<Walk::kGradTriangle, T> : TrianglePieces<T, FencedExchange> {};
template <class T>
struct WalkPieces<Walk::kGradTriangleAsync, T> : TrianglePieces<T, AsyncExchange> {};

template <class T, Walk kWalk, int kWidth>
using WalkStorage = SharedStorage<T, kWidth, ring_stages(kWidth, WalkPieces<kWalk, T>::kLongTiles),
                                  typename WalkPieces<kWalk, T>::EpilogueStorage>;

// kGroups: compiled with the group mask (a call with groups).
template <class T, Walk kWalk, int kWidth, bool kGroups>
__global__ void __launch_bounds__(kThreads, 1) walk_kernel(const __grid_constant__ Params<T, kWidth> params) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Pieces = WalkPieces<kWalk, T>;
  using Schedule = typename Pieces::Schedule;
  using Storage = WalkStorage<T, kWalk, kWidth>;
  using Mainloop = ConsumerMainloop<T, kWidth, Storage>;
  extern __shared__ __align__(1024) char shared_raw[];
  Storage& shared = *reinterpret_cast<Storage*>(shared_raw);
  const Schedule schedule = Schedule::of(params.p, params.out);

  const int warpgroup = threadIdx.x / 128;
  if (threadIdx.x == 0) init_barriers(shared);
  if constexpr (Schedule::kClusterPairs) {  // the partner arrives on this program's barriers
    cute::cluster_arrive_relaxed();
    cute::cluster_wait();
  } else {
    __syncthreads();
  }

  if (warpgroup == 0) {
    load_tiles(params, shared, schedule);
    if constexpr (Schedule::kClusterPairs) cute::cluster_arrive_relaxed();  // the exit barrier's
    return;
  }

  cutlass::arch::warpgroup_reg_alloc<232>();
  Mainloop mainloop(shared, warpgroup - 1, schedule.row0);
  typename Pieces::template Epilogue<Mainloop, kGroups> epilogue(mainloop, schedule, params.p, params.out);
  mainloop.wait_for_own_block();
  mainloop.walk(schedule, epilogue);
  epilogue.store();
  // A program's shared memory must outlive its partner's accesses to it (the CUDA programming
  // guide's rule for distributed shared memory): the mbarrier handshakes already order them, but
  // only a cluster barrier says so to compute-sanitizer's racecheck, which reported every
  // exchange's store as a write into a program that might have exited.
  if constexpr (Schedule::kClusterPairs) {
    cute::cluster_arrive();
    cute::cluster_wait();
  }
#endif
}

}  // namespace scl::cuda::sm90

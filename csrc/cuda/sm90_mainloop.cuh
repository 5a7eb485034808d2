// The part of the wgmma + TMA kernels (sm90_kernels.cuh) that every walk shares: the shared
// memory and its barriers, the producer's TMA loads, and the consumers' logits product taken in
// turns. What a walk does with a tile's logits is its epilogue (sm90_epilogue_*.cuh); which tiles
// it walks, its tile schedule (sm90_tile_scheduler.cuh).
//
// The producer (one thread of warpgroup 0) loads the program's own 128-row block once and
// streams 128-row tiles through a ring by TMA (four stages at width 128, two at 256), each stage
// with its rows' terms (a bulk copy) on the same transaction barrier. The two consumer warpgroups
// own 64 rows each of every tile product and run the same loop, taking turns to issue their
// logits wgmma (FlashAttention-3's ping-pong, ConsumerTurns below) so that one's exps run while
// the other's product does (the producer keeps few registers, setmaxnreg, so the consumers can
// hold a 64 x 128 logit tile and a 64 x 128 gradient tile each).
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/numeric_types.h>

#include <type_traits>
#include <utility>

#include "barrier_wait.cuh"
#include "fragments.cuh"
#include "sm90_shape.h"
#include "tile_args.h"

namespace scl::cuda::sm90 {

using namespace cute;

// Ring depth. A forward tile's products take about 1,000 cycles (0.6 us), less than a TMA load's
// latency from HBM under load: the producer needs several tiles of lead. Four stages (128 KiB) at
// width 128; at 256 two (128 KiB) are all that fit beside the own block. The triangle's tiles
// take three products (about 3,000 cycles) and its weights and exchange need 96 KiB: two.
constexpr int ring_stages(int width, bool triangle = false) { return width == 128 && !triangle ? 4 : 2; }
constexpr int kConsumers = 2;  // warpgroups of 64 rows
constexpr int kRowsPerConsumer = kBlock / kConsumers;
constexpr int kThreads = 128 * (1 + kConsumers);

template <class T>
struct Atoms;
template <>
struct Atoms<cutlass::bfloat16_t> {
  using Logits = SM90_64x128x16_F32BF16BF16_SS<GMMA::Major::K, GMMA::Major::K>;
  using Grads = SM90_64x128x16_F32BF16BF16_RS<GMMA::Major::K, GMMA::Major::MN>;
  using Columns = SM90_64x128x16_F32BF16BF16_SS<GMMA::Major::MN, GMMA::Major::MN>;
};
template <>
struct Atoms<cutlass::half_t> {
  using Logits = SM90_64x128x16_F32F16F16_SS<GMMA::Major::K, GMMA::Major::K>;
  using Grads = SM90_64x128x16_F32F16F16_RS<GMMA::Major::K, GMMA::Major::MN>;
  using Columns = SM90_64x128x16_F32F16F16_SS<GMMA::Major::MN, GMMA::Major::MN>;
};

template <class T, int kWidth, int kRingStages = ring_stages(kWidth)>
struct Layouts {
  static constexpr int kStages = kRingStages;
  // (row, k): 8-row groups of 128-byte swizzled rows, what TMA writes and wgmma reads K-major.
  using Block = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<T>{}, Shape<Int<kBlock>, Int<kWidth>>{}));
  using Ring = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<T>{},
                                      Shape<Int<kBlock>, Int<kWidth>, Int<kStages>>{}));
  // A stage of the ring as (d, row), the second product's MN-major B operand: the same bytes.
  using BlockTransposed = decltype(tile_to_shape(GMMA::Layout_MN_SW128_Atom<T>{},
                                                 Shape<Int<kWidth>, Int<kBlock>>{}, Step<_2, _1>{}));
  // The triangle's column product's A operand: a tile's weights as (streamed row j, own row i),
  // MN-major (j contiguous), so that a thread's two adjacent columns of the accumulator are
  // adjacent bytes.
  using WeightsTransposed = decltype(tile_to_shape(GMMA::Layout_MN_SW128_Atom<T>{},
                                                   Shape<Int<kBlock>, Int<kBlock>>{}, Step<_2, _1>{}));
  // The byte offset of (j, i) in that tile, as the few 32-bit operations it takes: 128-byte runs
  // of 64 rows j per own row i, 8 runs of i to a 1 KiB swizzle atom whose 16-byte chunks are
  // XORed with i % 8 (GMMA's 128-byte swizzle acts on the byte address), atoms along i, then the
  // second 64 rows j. The host check compares it with a tensor over shared memory at every (j,
  // i); the kernel computes it per element because CuTe's generic addresses spill there.
  static __host__ __device__ uint32_t weights_byte_offset(int j, int i) {
    static_assert(sizeof(T) == 2 && kBlock == 128);
    const uint32_t row = uint32_t(i), col = uint32_t(j);
    return (col / 64) * 16384 + (row / 8) * 1024 + (row % 8) * 128 + (((col % 64) / 8) ^ (row % 8)) * 16 +
           (col % 8) * 2;
  }
};

// For walks whose epilogue keeps nothing in shared memory.
struct NoEpilogueStorage {
  __device__ __forceinline__ void init_barriers() {}
};

// The ring, the own block, their terms and barriers, then what the walk's epilogue keeps.
template <class T, int kWidth, int kRingStages, class EpilogueStorage>
struct SharedStorage {
  using L = Layouts<T, kWidth, kRingStages>;
  static constexpr int kStages = L::kStages;
  alignas(1024) T own[cosize_v<typename L::Block>];
  alignas(1024) T ring[cosize_v<typename L::Ring>];
  alignas(16) RowTerms own_terms[kBlock];
  alignas(16) RowTerms ring_terms[kStages][kBlock];
  alignas(8) uint64_t own_full;
  alignas(8) uint64_t full[kStages];
  alignas(8) uint64_t empty[kStages];
  EpilogueStorage epilogue;
};

using FullBarrier = cutlass::arch::ClusterTransactionBarrier;
using EmptyBarrier = cutlass::arch::ClusterBarrier;

// One thread, before the first barrier of the program.
template <class Storage>
__device__ __forceinline__ void init_barriers(Storage& shared) {
  FullBarrier::init(&shared.own_full, 1);
  for (int s = 0; s < Storage::kStages; ++s) {
    FullBarrier::init(&shared.full[s], 1);
    EmptyBarrier::init(&shared.empty[s], kConsumers * 128);
  }
  shared.epilogue.init_barriers();
  cutlass::arch::fence_barrier_init();
}

// The TMA of a [rows, d] row matrix into Block-shaped boxes (built on the host).
template <class T, int kWidth>
auto make_block_tma(const RowMatrix& m, int64_t d) {
  Tensor g = make_tensor(make_gmem_ptr(static_cast<const T*>(m.data)),
                         make_shape(int(m.rows), int(d)), make_stride(int(m.stride), _1{}));
  return make_tma_copy(SM90_TMA_LOAD{}, g, typename Layouts<T, kWidth>::Block{});
}
template <class T, int kWidth>
using BlockTma = decltype(make_block_tma<T, kWidth>(RowMatrix{}, 0));

template <class T, int kWidth>
struct Params {
  TileProblem p;
  BlockTma<T, kWidth> own_tma;
  BlockTma<T, kWidth> streamed_tma;
  WalkOutputs out;
};

// The producer warpgroup: it gives its registers to the consumers, and its first thread loads the
// own block, then the schedule's tiles, each into the next free stage of the ring.
template <class T, int kWidth, class Storage, class Schedule>
__device__ __forceinline__ void load_tiles(const Params<T, kWidth>& params, Storage& shared,
                                           const Schedule& schedule) {
  using L = typename Storage::L;
  constexpr int kStages = Storage::kStages;
  constexpr int kTileBytes = kBlock * kWidth * int(sizeof(T)) + kBlock * int(sizeof(RowTerms));
  const TileProblem& p = params.p;
  cutlass::arch::warpgroup_reg_dealloc<40>();
  if (threadIdx.x != 0) return;
  Tensor m_own = params.own_tma.get_tma_tensor(make_shape(int(p.own.rows), int(p.d)));
  Tensor m_str = params.streamed_tma.get_tma_tensor(make_shape(int(p.streamed.rows), int(p.d)));
  Tensor g_own = local_tile(m_own, Shape<Int<kBlock>, Int<kWidth>>{}, make_coord(_, 0));
  Tensor g_str = local_tile(m_str, Shape<Int<kBlock>, Int<kWidth>>{}, make_coord(_, 0));
  Tensor s_own = make_tensor(make_smem_ptr(shared.own), typename L::Block{});
  Tensor s_ring = make_tensor(make_smem_ptr(shared.ring), typename L::Ring{});
  auto [from_own, to_own] = tma_partition(params.own_tma, Int<0>{}, Layout<_1>{},
                                          group_modes<0, 2>(s_own), group_modes<0, 2>(g_own));
  auto [from_str, to_ring] = tma_partition(params.streamed_tma, Int<0>{}, Layout<_1>{},
                                           group_modes<0, 2>(s_ring), group_modes<0, 2>(g_str));
  FullBarrier::arrive_and_expect_tx(&shared.own_full, kTileBytes);
  copy(params.own_tma.with(shared.own_full), from_own(_, schedule.own_block), to_own);
  SM90_BULK_COPY_G2S::copy(p.own_terms + schedule.row0, &shared.own_full, shared.own_terms,
                           kBlock * int(sizeof(RowTerms)));
  for (int64_t t = 0; t < schedule.tiles(); ++t) {
    const int stage = int(t % kStages);
    const int64_t block = schedule.streamed_block(t);
    // The stage's previous tile must be consumed (the first round finds it free).
    if (t >= kStages) wait_for_pipeline(&shared.empty[stage], int((t / kStages - 1) & 1), "empty", stage);
    FullBarrier::arrive_and_expect_tx(&shared.full[stage], kTileBytes);
    copy(params.streamed_tma.with(shared.full[stage]), from_str(_, block), to_ring(_, stage));
    SM90_BULK_COPY_G2S::copy(p.streamed_terms + block * kBlock, &shared.full[stage],
                             shared.ring_terms[stage], kBlock * int(sizeof(RowTerms)));
  }
}

// The consumers' turns at issuing a tile's logits wgmma: 0, 1, 0, 1, ... Left alone, both wait
// for the same stage, and when they issue together a tile's tensor and exp phases add up
// instead of overlapping. A two-point fit over the first GPU session's step times (a fit, not a
// measurement of the kernels) put them at about 1.7x the issue-slot model, which assumes the
// overlap: about what lockstep would cost
// (bench/decisions/2026-11-23-after-first-gpu-session.md). Whether the turns overlap them now
// is not measured yet (bench/decisions/2026-11-28-walks-m0-rules.md).
// Two named barriers of both consumers' 256 threads: a consumer waits on its own, then arrives
// on the other's once its wgmma is issued. Consumer 1 opens (an arrive for consumer 0's first
// turn) and consumer 0 closes (a wait for consumer 1's last arrive), so every barrier
// generation completes: both walk the same tiles.
struct ConsumerTurns {
  int consumer;
  static constexpr uint32_t kThreads = 2 * 128;
  __device__ void wait() const { cutlass::arch::NamedBarrier::arrive_and_wait(kThreads, consumer); }
  __device__ void pass() const { cutlass::arch::NamedBarrier::arrive(kThreads, 1 - consumer); }
  __device__ void open() const { if (consumer == 1) pass(); }
  __device__ void close() const { if (consumer == 0) wait(); }
};

// One consumer warpgroup's view of the walk: its 64 rows, the logits accumulator of a tile and
// the (row, column) each of its registers holds, the tiles' terms in shared memory. A walk's
// epilogue reads and rewrites `acc` and releases each stage when it has read the tile.
template <class T, int kWidth, class Storage>
struct ConsumerMainloop {
  using L = typename Storage::L;
  static constexpr int kStages = Storage::kStages;
  using Tile = Shape<Int<kRowsPerConsumer>, Int<kBlock>>;
  using LogitsMma = decltype(make_tiled_mma(typename Atoms<T>::Logits{}));
  using LogitsThread = decltype(std::declval<LogitsMma&>().get_thread_slice(0));
  using OwnBlock = decltype(make_tensor(make_smem_ptr(std::declval<T*>()), typename L::Block{}));
  using OwnHalf = decltype(local_tile(std::declval<OwnBlock&>(), Shape<Int<kRowsPerConsumer>, Int<kWidth>>{},
                                      make_coord(0, 0)));
  using Acc = decltype(partition_fragment_C(std::declval<LogitsMma&>(), Tile{}));
  using Coords = decltype(std::declval<LogitsThread&>().partition_C(make_identity_tensor(Tile{})));
  using RowsColumns = decltype(sm90_rows_columns(typename Acc::layout_type{}));
  // A thread's accumulator elements as (rows, columns) (fragments.cuh).
  static constexpr int kRows = size<0>(RowsColumns{});
  static constexpr int kCols = size<1>(RowsColumns{});

  Storage& shared;
  int consumer;
  ConsumerTurns turns;
  int thread;
  int rows0;  // this consumer's rows of the MMA's M side
  int64_t first_row;  // its first own row in the own matrix
  LogitsMma logits_mma;
  LogitsThread thr;
  OwnBlock s_own;
  // The M side of the logits product: this consumer's 64 rows of the own block (of the tile when
  // transposed).
  OwnHalf own_half;
  Acc acc;
  Coords coords;

  // `row0`: the own block's first row.
  __device__ __forceinline__ ConsumerMainloop(Storage& storage, int consumer_index, int64_t row0)
      : shared(storage),
        consumer(consumer_index),
        turns{consumer_index},
        thread(int(threadIdx.x % 128)),
        rows0(consumer_index * kRowsPerConsumer),
        first_row(row0 + rows0),
        logits_mma(make_tiled_mma(typename Atoms<T>::Logits{})),
        thr(logits_mma.get_thread_slice(thread)),
        s_own(make_tensor(make_smem_ptr(storage.own), typename L::Block{})),
        own_half(local_tile(s_own, Shape<Int<kRowsPerConsumer>, Int<kWidth>>{}, make_coord(consumer_index, 0))),
        acc(partition_fragment_C(logits_mma, Tile{})),
        coords(thr.partition_C(make_identity_tensor(Tile{}))) {}

  __device__ __forceinline__ auto acc_rc() { return make_tensor(acc.data(), sm90_rows_columns(acc.layout())); }
  __device__ __forceinline__ auto coords_rc() const { return make_tensor(coords.data(), sm90_rows_columns(coords.layout())); }

  // Rows' terms, read from shared memory where used: registers are the scarce resource here.
  __device__ __forceinline__ RowTerms own_row_terms(int row) const { return shared_terms(&shared.own_terms[row]); }
  __device__ __forceinline__ RowTerms streamed_row_terms(int stage, int row) const {
    return shared_terms(&shared.ring_terms[stage][row]);
  }
  // Those of the own row that accumulator row r (of acc_rc) holds.
  __device__ __forceinline__ RowTerms acc_row_terms(int r) const {
    return own_row_terms(rows0 + get<0>(coords_rc()(r, 0)));
  }
  // A stage of the ring: rows by d, as TMA wrote it.
  __device__ __forceinline__ T* stage_rows(int stage) const { return shared.ring + stage * cosize_v<typename L::Block>; }

  __device__ __forceinline__ void wait_for_own_block() const { wait_for_pipeline(&shared.own_full, 0, "own_full", 0); }
  __device__ __forceinline__ void release(int stage) const { EmptyBarrier::arrive(&shared.empty[stage]); }

  // Streamed tile t's logits into acc: wait for its stage, then the wgmma in this consumer's
  // turn. Rows are this consumer's own rows and columns the tile's, or, kTransposed, rows its 64
  // of the tile's and columns the own block. Returns the stage.
  template <bool kTransposed>
  __device__ __forceinline__ int tile_logits(int64_t t) {
    const int stage = int(t % kStages);
    wait_for_pipeline(&shared.full[stage], int((t / kStages) & 1), "full", stage);
    // The stage as a runtime pointer: its wgmma descriptors are then formed in the loop rather
    // than hoisted for both stages, which would spill them.
    Tensor s_tile = make_tensor(make_smem_ptr(stage_rows(stage)), typename L::Block{});

    clear(acc);
    turns.wait();
    warpgroup_fence_operand(acc);
    warpgroup_arrive();
    if constexpr (kTransposed) {
      Tensor tile_half = local_tile(s_tile, Shape<Int<kRowsPerConsumer>, Int<kWidth>>{}, make_coord(consumer, 0));
      gemm(logits_mma, thr.make_fragment_A(thr.partition_A(tile_half)), thr.make_fragment_B(thr.partition_B(s_own)),
           acc);
    } else {
      gemm(logits_mma, thr.make_fragment_A(thr.partition_A(own_half)), thr.make_fragment_B(thr.partition_B(s_tile)),
           acc);
    }
    warpgroup_commit_batch();
    turns.pass();
    warpgroup_wait<0>();
    warpgroup_fence_operand(acc);
    return stage;
  }

  // The walk: every tile's logits, handed to the epilogue, in the consumers' turns. A schedule
  // whose first tile may be a diagonal block runs it before the loop, so that only that tile
  // tests for self columns. (Only there: the same wrapping around the other walks' loops makes
  // the plain gradient walk spill.)
  template <class Schedule, class Epilogue>
  __device__ __forceinline__ void walk(const Schedule& schedule, Epilogue& epilogue) {
    turns.open();
    int64_t t = 0;
    if constexpr (Schedule::kDiagonalFirst) {
      if (schedule.tiles() > 0 && schedule.first_tile_is_diagonal()) {
        epilogue.tile(t, tile_logits<Epilogue::kTransposedLogits>(t), std::true_type{});
        ++t;
      }
    }
    for (; t < schedule.tiles(); ++t) {
      epilogue.tile(t, tile_logits<Epilogue::kTransposedLogits>(t), std::false_type{});
    }
    epilogue.finish_walk();
    turns.close();
  }
};

// The kernels' bodies exist only for sm_90a (wgmma, setmaxnreg); a plain sm_90 build would give
// H100s empty kernels that write nothing, so it is refused here rather than at run time.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900 && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "the sm_90 kernels need the arch-specific target: put 9.0a, not 9.0, in SCL_CUDA_ARCH_LIST"
#endif

}  // namespace scl::cuda::sm90

// The wgmma + TMA kernels (sm_90a) for 16-bit inputs whose rows fit a resident block 128 or 256
// elements wide (D <= 256 after padding): the headline case. Everything else runs the mma.sync
// family.
//
// A program is three warpgroups. The producer (one thread of warpgroup 0) loads the program's
// own 128-row block once and streams 128-row tiles through a ring by TMA (four stages at width
// 128, two at 256), each stage with its rows' terms (a bulk copy) on the same transaction
// barrier. The two consumer warpgroups own 64 rows each of every tile product and run the same
// loop, taking turns to issue their logits wgmma (FlashAttention-3's ping-pong, ConsumerTurns
// below) so that one's exps run while the other's product does (the producer keeps few
// registers, setmaxnreg, so the consumers can hold a 64 x 128 logit tile and a 64 x 128
// gradient tile each). The backward's weights stay in
// registers: rounded to T they are the A operand of a second, register-sourced wgmma (as
// FlashAttention-3 feeds P to its PV product; the accumulator's and the A operand's fragments
// place the same (row, column) in the same register, checked on the host), whose B operand is
// the streamed tile itself, read as (D, rows): the TMA's K-major 128-byte swizzled rows are
// exactly wgmma's MN-major swizzled layout.
//
// The symmetric backward at width 128 walks the upper triangle (Walk::kGradTriangle): programs
// run in clusters of two, row blocks 2p and 2p + 1, that meet the same column blocks in the same
// order. A tile adds its weights times the streamed rows into the program's own rows (registers,
// as above) and, through the weights stored transposed in shared memory, its own rows into the
// column block's; the partners swap halves of that partial over distributed shared memory
// (cluster_pair.cuh) and each adds one half into global memory by vector atomics, so each
// column block's gradient crosses L2 once per pair of programs (docs/CUDA_KERNELS.md).
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/numeric_types.h>

#include "../core/tile_math.h"
#include "cluster_pair.cuh"
#include "fragments.cuh"
#include "tile_args.h"
#include "tile_epilogue.cuh"

namespace scl::cuda::sm90 {

using namespace cute;
namespace tm = scl::tile_math;

constexpr int kBlock = 128;  // own rows per program, streamed rows per tile
// The resident row width (D padded with zeros, which TMA fills): 128, or 256 for D in (128, 256],
// whose two-stage ring (128 KiB) and own block (64 KiB) still fit the 227 KiB of shared memory
// because the backward's weights stay in registers.
constexpr int kMaxWidth = 256;
constexpr int resident_width(int64_t d) { return d <= 128 ? 128 : kMaxWidth; }
// Ring depth. A forward tile's products take about 1,000 cycles (0.6 us), less than a TMA load's
// latency from HBM under load: the producer needs several tiles of lead. Four stages (128 KiB) at
// width 128; at 256 two (128 KiB) are all that fit beside the own block. The triangle's tiles
// take three products (about 3,000 cycles) and its weights and exchange need 96 KiB: two.
constexpr int ring_stages(int width, bool triangle = false) { return width == 128 && !triangle ? 4 : 2; }
constexpr int kConsumers = 2;  // warpgroups of 64 rows
constexpr int kRowsPerConsumer = kBlock / kConsumers;
constexpr int kThreads = 128 * (1 + kConsumers);

// Gradient columns per backward program (grid.y chunks them, each recomputing the logits): the
// whole row at D <= 128, two programs at 256 (a 64 x 256 fp32 accumulator beside the logits'
// spills). The plain walks spilled at 128 while their weights went through shared memory.
constexpr int kGradWidth = 128;

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

// A consumer's share of the triangle's column product, 64 rows j x 128 columns d in fp32: the
// partners exchange halves of d (64 columns), 32 floats per thread.
constexpr int kExchangeFloats = 32;
constexpr int kHalfWidth = 64;

// What only the triangle needs in shared memory.
template <class T>
struct TriangleStorage {
  // A column tile's weights (WeightsTransposed), double-buffered: a consumer stores tile k's
  // while the other may still read tile k - 1's.
  alignas(1024) T weights[2][kBlock * kBlock];
  // The partner's half for this program: per consumer, 8 x 16 bytes per thread, consecutive
  // threads at consecutive 16 bytes.
  alignas(16) float4 received[kConsumers][kExchangeFloats / 4][128];
  alignas(8) uint64_t received_full[kConsumers];  // the partner's consumer stored its half
  alignas(8) uint64_t partner_read[kConsumers];   // the partner's consumer read this one's
};
struct NoTriangleStorage {};

template <class T, int kWidth, bool kTriangle = false>
struct SharedStorage {
  using L = Layouts<T, kWidth, ring_stages(kWidth, kTriangle)>;
  static constexpr int kStages = L::kStages;
  alignas(1024) T own[cosize_v<typename L::Block>];
  alignas(1024) T ring[cosize_v<typename L::Ring>];
  alignas(16) RowTerms own_terms[kBlock];
  alignas(16) RowTerms ring_terms[kStages][kBlock];
  alignas(8) uint64_t own_full;
  alignas(8) uint64_t full[kStages];
  alignas(8) uint64_t empty[kStages];
  std::conditional_t<kTriangle, TriangleStorage<T>, NoTriangleStorage> triangle;
};

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

// The consumers' turns at issuing a tile's logits wgmma: 0, 1, 0, 1, ... Left alone, both wait
// for the same stage, and when they issue together a tile's tensor and exp phases add up
// instead of overlapping; the first GPU session measured the kernels at 1.7x the issue-slot
// model, which assumes the overlap, close to what lockstep would cost (bench/NOTES.md).
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

// The kernels' bodies exist only for sm_90a (wgmma, setmaxnreg); a plain sm_90 build would give
// H100s empty kernels that write nothing, so it is refused here rather than at run time.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900 && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "the sm_90 kernels need the arch-specific target: put 9.0a, not 9.0, in SCL_CUDA_ARCH_LIST"
#endif

// Adds half the columns of a 64 x 128 wgmma accumulator (32 elements per thread: value(e),
// e < 32, at coord(e) + (row0, col0)) into a [rows padded to 256, 128] fp32 gradient (no bounds
// to check: the triangle's buffer) by 16-byte vector atomics. Elements 4g .. 4g + 3 of a thread
// are columns c, c + 1 of rows r and r + 8, and its quad neighbour (lane ^ 1) holds columns
// c + 2, c + 3 or c - 2, c - 1 of the same rows (csrc/tests/fragment_layout_check.cpp): the
// neighbours swap a row's pair each, so the even lane adds row r's four columns and the odd lane
// row r + 8's. They swap through `scratch` (4 x 128 float4 of the consumer's shared memory,
// consecutive threads at consecutive 16 bytes): four 16-byte stores and loads where shuffles
// would take sixteen.
template <class Value, class Coord>
__device__ __forceinline__ void add_half_by_quads(float* grad, int64_t row0, int col0, Value&& value,
                                                  Coord&& coord, float4* scratch, int thread) {
  const bool odd = thread & 1;
  auto given = [&](int g, int k) { return odd ? value(4 * g + k) : value(4 * g + 2 + k); };
  CUTE_UNROLL
  for (int h = 0; h < kExchangeFloats / 8; ++h) {
    scratch[h * 128 + thread] = make_float4(given(2 * h, 0), given(2 * h, 1), given(2 * h + 1, 0), given(2 * h + 1, 1));
  }
  __syncwarp();
  CUTE_UNROLL
  for (int h = 0; h < kExchangeFloats / 8; ++h) {
    const float4 got = scratch[h * 128 + (thread ^ 1)];
    CUTE_UNROLL
    for (int k = 0; k < 2; ++k) {
      const int e = 4 * (2 * h + k);
      const float got0 = k == 0 ? got.x : got.z, got1 = k == 0 ? got.y : got.w;
      const float4 four = odd ? make_float4(got0, got1, value(e + 2), value(e + 3))
                              : make_float4(value(e), value(e + 1), got0, got1);
      const int row = odd ? int(get<0>(coord(e + 2))) : int(get<0>(coord(e)));
      const int col = odd ? int(get<1>(coord(e + 2))) - 2 : int(get<1>(coord(e)));
      atomicAdd(reinterpret_cast<float4*>(grad + (row0 + row) * kBlock + col0 + col), four);
    }
  }
  __syncwarp();  // before the scratch is written again
}

// The named barrier (after ConsumerTurns' 0 and 1) at which both consumers have stored a
// triangle tile's weights.
constexpr uint32_t kWeightsStoredBarrier = 2;

template <class T, Walk kWalk, int kWidth>
__global__ void __launch_bounds__(kThreads, 1) walk_kernel(const __grid_constant__ Params<T, kWidth> params) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr bool kLse = kWalk == Walk::kLsePlain;
  constexpr bool kSymmetricLse = kWalk == Walk::kLseSymmetric;
  constexpr bool kTriangle = kWalk == Walk::kGradTriangle;
  constexpr bool kGrad = !kLse && !kSymmetricLse;
  static_assert(!kTriangle || kWidth == kBlock, "the triangle keeps 128-wide rows only");
  using Storage = SharedStorage<T, kWidth, kTriangle>;
  using L = typename Storage::L;
  using FullBarrier = cutlass::arch::ClusterTransactionBarrier;
  using EmptyBarrier = cutlass::arch::ClusterBarrier;
  constexpr int kStages = L::kStages;
  const TileProblem& p = params.p;
  extern __shared__ __align__(1024) char shared_raw[];
  Storage& shared = *reinterpret_cast<Storage*>(shared_raw);

  const int64_t own_block = blockIdx.x;
  const int64_t row0 = own_block * kBlock;
  const int64_t streamed_blocks = (p.streamed.rows + kBlock - 1) / kBlock;
  // The symmetric forward's program I walks J = I .. nb - 1 (the upper triangle, diagonal first).
  const int64_t first_tile = kSymmetricLse ? own_block : 0;
  // The triangle's cluster pairs walk the same tiles, split alike (tile_math.h).
  const tm::TileRange range =
      (kLse || kSymmetricLse)
          ? tm::split_range(streamed_blocks - first_tile, params.out.num_splits, blockIdx.y)
      : kTriangle ? tm::split_range(tm::pair_triangle_tiles(streamed_blocks, own_block),
                                    params.out.num_splits, blockIdx.y)
                  : tm::TileRange{0, streamed_blocks};
  const int64_t tiles = range.end - range.begin;
  auto streamed_block = [&](int64_t t) {  // of the walk's tile t
    return kTriangle ? tm::pair_triangle_column_block(own_block, range.begin + t)
                     : first_tile + range.begin + t;
  };
  constexpr int kTileBytes = kBlock * kWidth * int(sizeof(T)) + kBlock * int(sizeof(RowTerms));

  const int warpgroup = threadIdx.x / 128;
  if (threadIdx.x == 0) {
    FullBarrier::init(&shared.own_full, 1);
    for (int s = 0; s < kStages; ++s) {
      FullBarrier::init(&shared.full[s], 1);
      EmptyBarrier::init(&shared.empty[s], kConsumers * 128);
    }
    if constexpr (kTriangle) {
      for (int c = 0; c < kConsumers; ++c) {
        EmptyBarrier::init(&shared.triangle.received_full[c], 128);
        EmptyBarrier::init(&shared.triangle.partner_read[c], 128);
      }
    }
    cutlass::arch::fence_barrier_init();
  }
  if constexpr (kTriangle) {  // the partner arrives on this program's barriers
    cute::cluster_arrive_relaxed();
    cute::cluster_wait();
  } else {
    __syncthreads();
  }

  if (warpgroup == 0) {  // producer
    cutlass::arch::warpgroup_reg_dealloc<40>();
    if (threadIdx.x == 0) {
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
      copy(params.own_tma.with(shared.own_full), from_own(_, own_block), to_own);
      SM90_BULK_COPY_G2S::copy(p.own_terms + row0, &shared.own_full, shared.own_terms,
                               kBlock * int(sizeof(RowTerms)));
      for (int64_t t = 0; t < tiles; ++t) {
        const int stage = int(t % kStages);
        const int64_t block = streamed_block(t);
        // The stage's previous tile must be consumed (the first round finds it free).
        if (t >= kStages) EmptyBarrier::wait(&shared.empty[stage], int((t / kStages - 1) & 1));
        FullBarrier::arrive_and_expect_tx(&shared.full[stage], kTileBytes);
        copy(params.streamed_tma.with(shared.full[stage]), from_str(_, block), to_ring(_, stage));
        SM90_BULK_COPY_G2S::copy(p.streamed_terms + block * kBlock, &shared.full[stage],
                                 shared.ring_terms[stage], kBlock * int(sizeof(RowTerms)));
      }
    }
    return;
  }

  // Consumers.
  cutlass::arch::warpgroup_reg_alloc<232>();
  const int consumer = warpgroup - 1;
  const ConsumerTurns turns{consumer};
  const int thread = threadIdx.x % 128;
  const int rows0 = consumer * kRowsPerConsumer;  // this consumer's rows of the MMA's M side
  auto logits_mma = make_tiled_mma(typename Atoms<T>::Logits{});
  auto grads_mma = make_tiled_mma(typename Atoms<T>::Grads{});
  auto thr = logits_mma.get_thread_slice(thread);
  auto grads_thr = grads_mma.get_thread_slice(thread);

  Tensor s_own = make_tensor(make_smem_ptr(shared.own), typename L::Block{});
  // M side: this consumer's 64 rows of the own block (of the tile in the symmetric forward).
  Tensor own_half = local_tile(s_own, Shape<Int<kRowsPerConsumer>, Int<kWidth>>{}, make_coord(consumer, 0));
  Tensor acc = partition_fragment_C(logits_mma, Shape<Int<kRowsPerConsumer>, Int<kBlock>>{});
  Tensor grad = partition_fragment_C(grads_mma, Shape<Int<kRowsPerConsumer>, Int<kGradWidth>>{});
  // Columns [128 chunk, 128 chunk + 128); the triangle's grid.y splits its tiles instead.
  const int grad_chunk = kGrad && !kTriangle ? int(blockIdx.y) : 0;
  Tensor sums_i = partition_fragment_C(logits_mma, Shape<Int<kRowsPerConsumer>, Int<kBlock>>{});
  clear(grad);
  clear(sums_i);
  Tensor coords = thr.partition_C(make_identity_tensor(Shape<Int<kRowsPerConsumer>, Int<kBlock>>{}));
  // (row, column) of the grads wgmma's A fragment: the consumer's weights (its rows, tile rows).
  Tensor weight_coords = grads_thr.partition_A(make_identity_tensor(Shape<Int<kRowsPerConsumer>, Int<kBlock>>{}));
  Tensor acc_rc = make_tensor(acc.data(), sm90_rows_columns(acc.layout()));
  Tensor sums_rc = make_tensor(sums_i.data(), sm90_rows_columns(sums_i.layout()));
  Tensor coords_rc = make_tensor(coords.data(), sm90_rows_columns(coords.layout()));
  constexpr int kRows = size<0>(decltype(acc_rc.layout()){});
  constexpr int kCols = size<1>(decltype(acc_rc.layout()){});

  FullBarrier::wait(&shared.own_full, 0);
  tm::RunningLse2 running[kRows];
  // A row's terms, read from shared memory where used: registers are the scarce resource here.
  auto own = [&](int r) { return shared_terms(&shared.own_terms[rows0 + get<0>(coords_rc(r, 0))]); };

  // One streamed tile's logits into acc: wait for the stage, then the wgmma. Returns the stage.
  auto tile_logits = [&](int64_t t) {
    const int stage = int(t % kStages);
    FullBarrier::wait(&shared.full[stage], int((t / kStages) & 1));
    // The stage as a runtime pointer: its wgmma descriptors are then formed in the loop rather
    // than hoisted for both stages, which would spill them.
    T* stage_rows = shared.ring + stage * cosize_v<typename L::Block>;
    Tensor s_tile = make_tensor(make_smem_ptr(stage_rows), typename L::Block{});

    clear(acc);
    turns.wait();
    warpgroup_fence_operand(acc);
    warpgroup_arrive();
    if constexpr (kSymmetricLse) {  // rows: the tile's J block; columns: the own I block
      Tensor tile_half = local_tile(s_tile, Shape<Int<kRowsPerConsumer>, Int<kWidth>>{},
                                    make_coord(consumer, 0));
      gemm(logits_mma, thr.make_fragment_A(thr.partition_A(tile_half)),
           thr.make_fragment_B(thr.partition_B(s_own)), acc);
    } else {
      gemm(logits_mma, thr.make_fragment_A(thr.partition_A(own_half)),
           thr.make_fragment_B(thr.partition_B(s_tile)), acc);
    }
    warpgroup_commit_batch();
    turns.pass();
    warpgroup_wait<0>();
    warpgroup_fence_operand(acc);
    return stage;
  };

  turns.open();
  if constexpr (kSymmetricLse) {
    // Only the first tile of the first split is diagonal: it runs before the loop, with the
    // self-column mask, and the loop's tiles test nothing per logit. (Only here: the same
    // wrapping around the other walks' loops makes the plain gradient walk spill.)
    auto symmetric_tile = [&](int64_t t, auto diagonal_tile) {
      constexpr bool kDiagonal = decltype(diagonal_tile)::value;
      const int stage = tile_logits(t);
      const int64_t c0 = (first_tile + range.begin + t) * kBlock;
      CUTE_UNROLL
      for (int r = 0; r < kRows; ++r) {
        const int local_j = rows0 + get<0>(coords_rc(r, 0));
        const RowTerms tj = shared_terms(&shared.ring_terms[stage][local_j]);
        float sum_j = 0.f;
        CUTE_UNROLL
        for (int c = 0; c < kCols; ++c) {
          const int local_i = get<1>(coords_rc(r, c));
          float s2 = tm::logit2(acc_rc(r, c), shared_terms(&shared.own_terms[local_i]).z, tj.x, tj.y);
          if (kDiagonal && local_i == local_j) s2 = -INFINITY;
          const float e = tm::exp2_approx(s2);
          sums_rc(r, c) += e;
          sum_j += e;
        }
        sum_j = quad_sum(sum_j);
        if (!kDiagonal && (thread & 3) == 0) atomicAdd(params.out.row_sum + c0 + local_j, sum_j);
      }
      EmptyBarrier::arrive(&shared.empty[stage]);
    };
    int64_t t = 0;
    if (tiles > 0 && range.begin == 0) symmetric_tile(t++, std::true_type{});
    for (; t < tiles; ++t) symmetric_tile(t, std::false_type{});
  } else {
    // A tile's logits, self-column mask and epilogue: acc then holds the weights, or running the
    // rows' LSE. Returns the stage.
    auto epilogue_tile = [&](int64_t t) {
      const int stage = tile_logits(t);
      const int64_t c0 = streamed_block(t) * kBlock;
      const bool masked = walk_tile_holds_self_column<kWalk>(row0, kBlock, c0, kBlock, p.self_offset);
      // In a masked tile the self column lies within a tile's width of the diagonal, so one
      // 32-bit offset per tile replaces two 64-bit compares per logit: local column = local row
      // + self_delta (in the columns walk, own row i + self_offset is anchor i's self column).
      const int self_delta = !masked ? 0
                             : kWalk == Walk::kGradColumns ? int(row0 + rows0 - c0 - p.self_offset)
                                                           : int(row0 + rows0 + p.self_offset - c0);
      tile_epilogue<kWalk, kRows, kCols>(
          acc_rc, coords_rc, own, [&](int c) { return shared_terms(&shared.ring_terms[stage][c]); },
          [&](int r, int c) {
            return masked && get<1>(coords_rc(r, c)) == get<0>(coords_rc(r, c)) + self_delta;
          },
          running);
      return stage;
    };
    // The triangle's column side: dZ_J += H^T Z_I, with H_ij r_i = W_ij r_i / r_j the weight of
    // own row i in streamed row j's gradient. Both consumers store their rows of the tile's
    // weights so scaled, transposed, into shared memory; each then multiplies 64 of the tile's
    // rows j by all 128 own rows i. The lambdas take `auto` buffers so that only the triangle
    // instantiates their bodies.
    auto column_mma = make_tiled_mma(typename Atoms<T>::Columns{});
    auto column_thr = column_mma.get_thread_slice(thread);
    Tensor column = partition_fragment_C(column_mma, Shape<Int<kRowsPerConsumer>, Int<kBlock>>{});
    Tensor column_coords = column_thr.partition_C(make_identity_tensor(Shape<Int<kRowsPerConsumer>, Int<kBlock>>{}));
    auto store_column_weights = [&](int stage, auto& weights_tile) {
      const uint32_t base = cast_smem_ptr_to_uint(weights_tile);
      float own_scale[kRows];
      CUTE_UNROLL
      for (int r = 0; r < kRows; ++r) own_scale[r] = own(r).x;
      CUTE_UNROLL
      for (int c = 0; c < kCols; c += 2) {  // columns c, c + 1 are tile rows j, j + 1
        const int j = get<1>(coords_rc(0, c));
        const float inverse0 = shared_terms(&shared.ring_terms[stage][j]).z;
        const float inverse1 = shared_terms(&shared.ring_terms[stage][j + 1]).z;
        CUTE_UNROLL
        for (int r = 0; r < kRows; ++r) {
          const uint32_t bits = uint32_t(T(acc_rc(r, c) * own_scale[r] * inverse0).raw()) |
                                (uint32_t(T(acc_rc(r, c + 1) * own_scale[r] * inverse1).raw()) << 16);
          const int i = rows0 + get<0>(coords_rc(r, c));
          const uint32_t address = base + L::weights_byte_offset(j, i);
          asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(address), "r"(bits));
        }
      }
      // The wgmma reads shared memory through the async proxy: the stores must be visible to it.
      cutlass::arch::fence_view_async_shared();
    };
    auto issue_column_product = [&](auto& weights_tile) {
      Tensor weights_ji = make_tensor(make_smem_ptr(weights_tile), typename L::WeightsTransposed{});
      clear(column);
      warpgroup_fence_operand(column);
      warpgroup_arrive();
      gemm(column_mma,
           column_thr.make_fragment_A(column_thr.partition_A(
               local_tile(weights_ji, Shape<Int<kRowsPerConsumer>, Int<kBlock>>{}, make_coord(consumer, 0)))),
           column_thr.make_fragment_B(column_thr.partition_B(
               make_tensor(make_smem_ptr(shared.own), typename L::BlockTransposed{}))),
           column);
      warpgroup_commit_batch();
      warpgroup_wait<0>();
      warpgroup_fence_operand(column);
    };
    // The partners swap halves of the column product: this program keeps columns [64 rank,
    // 64 rank + 64), its elements e + 32 rank for e < 32 (element e + 32 is element e 64 columns
    // on; fragment check), adds the partner's and sends the sum to global memory. k counts the
    // column tiles, so the barriers' phases.
    auto exchange_and_add = [&](int64_t t, int k, auto& mine) {
      const uint32_t rank = cute::block_rank_in_cluster(), partner = 1 - rank;
      float kept[kExchangeFloats];
      // The partner must have read this program's previous half before it is overwritten.
      if (k > 0) wait_for_cluster(&mine.partner_read[consumer], (k - 1) & 1);
      const uint32_t partner_received = cluster_shared_address(&mine.received[consumer][0][thread], partner);
      CUTE_UNROLL
      for (int v = 0; v < kExchangeFloats / 4; ++v) {
        float sent[4];
        CUTE_UNROLL
        for (int u = 0; u < 4; ++u) {
          const int e = 4 * v + u;
          kept[e] = rank == 0 ? column(e) : column(e + kExchangeFloats);
          sent[u] = rank == 0 ? column(e + kExchangeFloats) : column(e);
        }
        store_to_cluster(partner_received + v * uint32_t(sizeof(float4) * 128), sent[0], sent[1], sent[2], sent[3]);
      }
      arrive_in_cluster(cluster_shared_address(&mine.received_full[consumer], partner));
      wait_for_cluster(&mine.received_full[consumer], k & 1);
      CUTE_UNROLL
      for (int v = 0; v < kExchangeFloats / 4; ++v) {
        const float4 got = mine.received[consumer][v][thread];
        kept[4 * v] += got.x, kept[4 * v + 1] += got.y, kept[4 * v + 2] += got.z, kept[4 * v + 3] += got.w;
      }
      // A half wholly past D (D <= 64) adds nothing (kHalfWidth columns per half). The received
      // buffer, read, is the quads' scratch until the partner is told it may write again.
      if (int(rank) * kHalfWidth < p.d) {
        add_half_by_quads(params.out.grad, streamed_block(t) * kBlock + rows0, int(rank) * kHalfWidth,
                          [&](int e) { return kept[e]; }, [&](int e) { return column_coords(e); },
                          &mine.received[consumer][0][0], thread);
      }
      arrive_in_cluster(cluster_shared_address(&mine.partner_read[consumer], partner));
    };

    int column_tiles = 0;  // the triangle's tiles with a column side so far
    for (int64_t t = 0; t < tiles; ++t) {
      const int stage = epilogue_tile(t);
      const bool column_side = kTriangle && tm::pair_triangle_has_column_side(range.begin + t);
      if constexpr (kGrad) {
        // Stored before the weights are rounded, while the registers of acc are still needed.
        if constexpr (kTriangle) {
          if (column_side) store_column_weights(stage, shared.triangle.weights[column_tiles & 1]);
        }
        // The weights as the grads wgmma's A operand: element i of its fragment is element i of
        // the accumulator (the same (row, column); csrc/tests/fragment_layout_check.cpp).
        Tensor weights = make_tensor<T>(shape(weight_coords));
        CUTE_UNROLL
        for (int i = 0; i < size(acc); ++i) weights(i) = T(acc(i));
        // The wgmma reads its register operand asynchronously: the fences keep the compiler from
        // moving the conversions after it or reusing those registers before the wait.
        warpgroup_fence_operand(weights);
        warpgroup_fence_operand(grad);
        warpgroup_arrive();
        gemm(grads_mma, weights,
             grads_thr.make_fragment_B(grads_thr.partition_B(
                 local_tile(make_tensor(make_smem_ptr(shared.ring + stage * cosize_v<typename L::Block>),
                                        typename L::BlockTransposed{}),
                            Shape<Int<kGradWidth>, Int<kBlock>>{},
                            make_coord(grad_chunk, 0)))),
             grad);
        warpgroup_commit_batch();
        // Both consumers' rows of the column weights, while this one's product runs.
        if (column_side) cutlass::arch::NamedBarrier::arrive_and_wait(ConsumerTurns::kThreads, kWeightsStoredBarrier);
        warpgroup_wait<0>();
        warpgroup_fence_operand(grad);
        warpgroup_fence_operand(weights);
      }
      EmptyBarrier::arrive(&shared.empty[stage]);
      if constexpr (kTriangle) {
        if (column_side) {
          issue_column_product(shared.triangle.weights[column_tiles & 1]);
          exchange_and_add(t, column_tiles++, shared.triangle);
        }
      }
    }
    if constexpr (kTriangle) {
      // The partner arrives on this program's barrier after reading its last half: the program's
      // shared memory must outlive that.
      if (column_tiles > 0) wait_for_cluster(&shared.triangle.partner_read[consumer], (column_tiles - 1) & 1);
    }
  }
  turns.close();

  if constexpr (kLse) {
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      const int64_t row = row0 + rows0 + get<0>(coords_rc(r, 0));
      if (row < p.own.rows && (thread & 3) == 0) {
        params.out.part_max[int64_t(blockIdx.y) * p.own.rows + row] = running[r].max;
        params.out.part_sum[int64_t(blockIdx.y) * p.own.rows + row] = running[r].sum;
      }
    }
  } else if constexpr (kSymmetricLse) {
    CUTE_UNROLL
    for (int c = 0; c < kCols; ++c) {
      float s = 0.f;
      CUTE_UNROLL
      for (int r = 0; r < kRows; ++r) s += sums_rc(r, c);
      atomicAdd(params.out.row_sum + row0 + get<1>(coords_rc(0, c)), s);
    }
  } else if constexpr (kTriangle) {
    // Other programs' column sides add into these rows too.
    Tensor out_coords = grads_thr.partition_C(make_identity_tensor(Shape<Int<kRowsPerConsumer>, Int<kGradWidth>>{}));
    if (tiles > 0) {
      for (int half = 0; half < 2 && half * kHalfWidth < p.d; ++half) {
        // The partner writes no more into the received buffer: its last half was read.
        add_half_by_quads(params.out.grad, row0 + rows0, half * kHalfWidth,
                          [&](int e) { return half == 0 ? grad(e) : grad(e + kExchangeFloats); },
                          [&](int e) { return out_coords(e); }, &shared.triangle.received[consumer][0][0], thread);
      }
    }
  } else {
    Tensor out_coords = grads_thr.partition_C(make_identity_tensor(Shape<Int<kRowsPerConsumer>, Int<kGradWidth>>{}));
    Tensor grad_rc = make_tensor(grad.data(), sm90_rows_columns(grad.layout()));
    Tensor out_rc = make_tensor(out_coords.data(), sm90_rows_columns(out_coords.layout()));
    CUTE_UNROLL
    for (int r = 0; r < size<0>(grad_rc); ++r) {
      const int64_t row = row0 + rows0 + get<0>(out_rc(r, 0));
      if (row >= p.own.rows) continue;
      const float scale = kWalk == Walk::kGradRowsPlain ? own(r).w : 1.f;
      CUTE_UNROLL
      for (int c = 0; c < size<1>(grad_rc); ++c) {
        const int64_t col = grad_chunk * kGradWidth + get<1>(out_rc(r, c));
        if (col < params.out.grad_columns) params.out.grad[row * params.out.grad_columns + col] = grad_rc(r, c) * scale;
      }
    }
  }
#endif
}

}  // namespace scl::cuda::sm90

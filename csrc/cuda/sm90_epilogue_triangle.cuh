// The triangle backward's epilogue (Walk::kGradTriangle and Walk::kGradTriangleAsync, width
// 128): the symmetric backward over the upper triangle by cluster pairs, row blocks 2p and 2p + 1,
// that meet the same column blocks in the same order (PairTriangleSchedule). A tile adds its
// weights times the streamed rows into the program's own rows (registers, OwnRowsGradient) and,
// through the weights stored transposed in shared memory, its own rows into the column block's;
// the partners swap halves of that partial over distributed shared memory (cluster_pair.cuh) and
// each adds one half into global memory by vector atomics, so each column block's gradient
// crosses L2 once per pair of programs (docs/CUDA_KERNELS.md). How the halves are swapped is the
// walk's exchange policy: FencedExchange or AsyncExchange.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include <type_traits>
#include <utility>

#include "cluster_pair.cuh"
#include "sm90_epilogue_grad_rows.cuh"
#include "sm90_epilogue_logits.cuh"
#include "sm90_mainloop.cuh"
#include "tile_args.h"
#include "walk_terms.h"

namespace scl::cuda::sm90 {

// A consumer's share of the triangle's column product, 64 rows j x 128 columns d in fp32: the
// partners exchange halves of d (64 columns), 32 floats per thread, sent and read a quad at a time.
constexpr int kExchangeFloats = 32;
constexpr int kExchangeQuads = kExchangeFloats / int(std::extent_v<ClusterQuad>);
constexpr int kHalfWidth = 64;

// The named barrier (after ConsumerTurns' 0 and 1) at which both consumers have stored a
// triangle tile's weights.
constexpr uint32_t kWeightsStoredBarrier = 2;

// Both exchanges' mbarriers, after their buffers: per consumer, received_full (the partner's
// half is here) and partner_read (the partner has read this program's), 128 arrivals a phase.
// kPartnerDataAfterRead: whether the wait for partner_read must also see the partner's stores
// (acquire at cluster scope); the async exchange's partner_read carries no data.
template <bool kPartnerDataAfterRead>
struct ExchangeBarriers {
  alignas(8) uint64_t received_full[kConsumers];
  alignas(8) uint64_t partner_read[kConsumers];

  __device__ __forceinline__ void init() {
    for (int c = 0; c < kConsumers; ++c) {
      EmptyBarrier::init(&received_full[c], 128);
      EmptyBarrier::init(&partner_read[c], 128);
    }
  }
  // k: the column tiles exchanged so far, so the barriers' phases.
  __device__ __forceinline__ void wait_for_partner_read(int consumer, int k) {
    if (k > 0) wait_for_cluster<kPartnerDataAfterRead>(&partner_read[consumer], (k - 1) & 1, "partner_read", consumer);
  }
};

// The partners' exchange of Walk::kGradTriangle: st.shared::cluster into the partner's buffer,
// then arrives with release at cluster scope, each compiled to MEMBAR.ALL.GPU: a tile waits
// there for its stores into the partner and, at the release after its reductions, for those to
// land in L2 (bench/decisions/2026-11-28-walks-m0-rules.md, rule 2).
struct FencedExchange {
  // The partner's half for this program: per consumer, 8 x 16 bytes per thread, consecutive
  // threads at consecutive 16 bytes.
  alignas(16) float4 received[kConsumers][kExchangeQuads][128];
  ExchangeBarriers</*kPartnerDataAfterRead=*/true> barriers;

  // The received buffer, once read, is the quads' scratch until the partner is told it may
  // write again: after the reductions.
  static constexpr bool kReleasesBeforeReductions = false;
  __device__ __forceinline__ float4* quads_scratch(int consumer) { return &received[consumer][0][0]; }

  // Returns what send takes besides the data: nothing here.
  __device__ __forceinline__ uint32_t before_send(int consumer, int k, uint32_t) {
    barriers.wait_for_partner_read(consumer, k);
    return 0;
  }
  __device__ __forceinline__ static void send(uint32_t remote, uint32_t, const ClusterQuad& quad) {
    store_to_cluster(remote, quad);
  }
  __device__ __forceinline__ void sent(int consumer, uint32_t partner) {
    arrive_in_cluster(cluster_shared_address(&barriers.received_full[consumer], partner));
  }
  __device__ __forceinline__ void release(int consumer, uint32_t partner) {
    arrive_in_cluster(cluster_shared_address(&barriers.partner_read[consumer], partner));
  }
};

// The partners' exchange of Walk::kGradTriangleAsync (opt-in, SCL_CUDA_SYMMETRIC_BACKWARD=
// triangle-async; not run on a GPU yet), with no fence at GPU scope:
// - Each thread arms its own received_full with the 128 bytes its partner thread will send
//   (arrive.expect_tx), then sends its 128 bytes by st.async, each completing its bytes on the
//   partner's received_full. That complete-tx is a release at cluster scope (PTX ISA, st.async),
//   and the wait for received_full acquires at cluster scope: the phase completes only when all
//   128 arrivals and all 16 KiB have come (bytes that land before this program's arming leave
//   the count negative, not complete), so after the wait the whole half is visible. The phase
//   of tile k cannot take tile k + 1's bytes: the partner sends those only after this program
//   has read tile k's, which each thread does after it saw the phase complete.
// - The buffer is released right after it is read, before the reductions into global memory,
//   by an arrive with release at CTA scope (arrive_in_cluster_after_reads): it orders only this
//   thread's reads of its own shared memory, which the partner overwrites after its wait for
//   that arrive (ptxas compiles it to the arrive, no fence, its address waiting on the reads'
//   registers); the reductions use a scratch of their own. Such a release is what CUTLASS's multicast pipelines rely on when a consumer
//   frees a stage that another program's TMA refills. The PTX memory model states
//   synchronisation between programs only at cluster scope, which would bring the GPU-scope
//   fence back: compute-sanitizer's racecheck on a GPU is part of this walk's rule before it
//   can become the default (bench/decisions/2026-11-28-walks-m0-rules.md, rule 5).
// - One received buffer, not two: a second (32 KiB) does not fit beside the rest (214 of the
//   227 KiB with this scratch), and it would not be waited for: a consumer sends tile k + 1's
//   half a whole tile (three products) after the partner released tile k's, since the partner
//   released it right after its own wait for this program's tile-k half.
struct AsyncExchange {
  alignas(16) float4 received[kConsumers][kExchangeQuads][128];
  alignas(16) float4 scratch[kConsumers][kExchangeFloats / 8][128];  // the quads' (add_half_by_quads)
  ExchangeBarriers</*kPartnerDataAfterRead=*/false> barriers;

  static constexpr bool kReleasesBeforeReductions = true;
  static constexpr uint32_t kBytesPerThread = kExchangeFloats * sizeof(float);
  // The phase completes on the bytes armed: were they more than the partner thread's stores bring,
  // it would never complete; were they fewer, it could complete before the last store landed.
  static_assert(kExchangeQuads * sizeof(ClusterQuad) == kBytesPerThread,
                "the bytes armed on received_full must be those exchange_and_add sends by st.async");
  __device__ __forceinline__ float4* quads_scratch(int consumer) { return &scratch[consumer][0][0]; }

  // After this thread saw tile k - 1's phase complete (its read of it), so the arming counts
  // towards tile k's. Returns the partner's received_full, on which send counts the bytes.
  __device__ __forceinline__ uint32_t before_send(int consumer, int k, uint32_t partner) {
    barriers.wait_for_partner_read(consumer, k);
    FullBarrier::arrive_and_expect_tx(&barriers.received_full[consumer], kBytesPerThread);
    return cluster_shared_address(&barriers.received_full[consumer], partner);
  }
  __device__ __forceinline__ static void send(uint32_t remote, uint32_t partner_full, const ClusterQuad& quad) {
    store_async_to_cluster(remote, partner_full, quad);
  }
  __device__ __forceinline__ void sent(int, uint32_t) {}
  // `loaded`: one float of each load of the received half (arrive_in_cluster_after_reads).
  __device__ __forceinline__ void release(int consumer, uint32_t partner, const float (&loaded)[kExchangeQuads]) {
    arrive_in_cluster_after_reads(cluster_shared_address(&barriers.partner_read[consumer], partner), loaded);
  }
};

// What only the triangle needs in shared memory.
template <class T, class Exchange>
struct TriangleStorage {
  // A column tile's weights (WeightsTransposed), double-buffered: a consumer stores tile k's
  // while the other may still read tile k - 1's.
  alignas(1024) T weights[2][kBlock * kBlock];
  Exchange exchange;

  __device__ __forceinline__ void init_barriers() { exchange.barriers.init(); }
};

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

template <class T, class Mainloop, class Schedule, class Exchange, bool kGroups>
struct TriangleEpilogue {
  static constexpr bool kTransposedLogits = false;
  using EpilogueStorage = TriangleStorage<T, Exchange>;
  using L = typename Mainloop::L;
  using Tile = typename Mainloop::Tile;
  using ColumnMma = decltype(make_tiled_mma(typename Atoms<T>::Columns{}));
  using ColumnThread = decltype(std::declval<ColumnMma&>().get_thread_slice(0));
  using Column = decltype(partition_fragment_C(std::declval<ColumnMma&>(), Tile{}));
  using ColumnCoords = decltype(std::declval<ColumnThread&>().partition_C(make_identity_tensor(Tile{})));
  static_assert(std::is_same_v<L, Layouts<T, kBlock, ring_stages(kBlock, true)>>, "the triangle keeps 128-wide rows only");

  Mainloop& m;
  const Schedule& schedule;
  const TileProblem& p;
  const WalkOutputs& out;
  EpilogueStorage& mine;
  OwnRowsGradient<T, Mainloop> own_rows;
  OwnGroups<kGroups, Mainloop> own_groups;
  // The column side: dZ_J += H^T Z_I, with H_ij r_i = W_ij r_i / r_j the weight of own row i in
  // streamed row j's gradient. Both consumers store their rows of the tile's weights so scaled,
  // transposed, into shared memory; each then multiplies 64 of the tile's rows j by all 128 own
  // rows i.
  ColumnMma column_mma;
  ColumnThread column_thr;
  Column column;
  ColumnCoords column_coords;
  int column_tiles = 0;  // the tiles with a column side so far

  __device__ __forceinline__ TriangleEpilogue(Mainloop& mainloop, const Schedule& s, const TileProblem& problem,
                                              const WalkOutputs& o)
      : m(mainloop),
        schedule(s),
        p(problem),
        out(o),
        mine(mainloop.shared.epilogue),
        own_rows(mainloop.thread),
        own_groups(mainloop, problem),
        column_mma(make_tiled_mma(typename Atoms<T>::Columns{})),
        column_thr(column_mma.get_thread_slice(mainloop.thread)),
        column(partition_fragment_C(column_mma, Tile{})),
        column_coords(column_thr.partition_C(make_identity_tensor(Tile{}))) {}

  __device__ __forceinline__ void tile(int64_t t, int stage, std::false_type) {
    tile_values<Walk::kGradTriangle>(m, schedule, p, own_groups, t, stage, nullptr);
    const bool column_side = schedule.has_column_side(t);
    // Stored before the weights are rounded, while the registers of acc are still needed.
    if (column_side) store_column_weights(stage, mine.weights[column_tiles & 1]);
    own_rows.add_tile(m, stage, schedule.grad_chunk, [&] {
      // Both consumers' rows of the column weights, while this one's product runs.
      if (column_side) cutlass::arch::NamedBarrier::arrive_and_wait(ConsumerTurns::kThreads, kWeightsStoredBarrier);
    });
    m.release(stage);
    if (column_side) {
      issue_column_product(mine.weights[column_tiles & 1]);
      exchange_and_add(t, column_tiles++);
    }
  }

  // The partner arrives on this program's barrier after reading its last half: the program's
  // shared memory must outlive that.
  __device__ __forceinline__ void finish_walk() {
    mine.exchange.barriers.wait_for_partner_read(m.consumer, column_tiles);
  }

  // The own rows' side, once: other programs' column sides add into these rows too.
  __device__ __forceinline__ void store() {
    Tensor out_coords = own_rows.coords();
    if (schedule.tiles() > 0) {
      for (int half = 0; half < 2 && half * kHalfWidth < p.d; ++half) {
        // The partner writes no more into this program's shared memory: its last half was read
        // (the fenced exchange's scratch is the received buffer).
        add_half_by_quads(out.grad, m.first_row, half * kHalfWidth,
                          [&](int e) { return half == 0 ? own_rows.grad(e) : own_rows.grad(e + kExchangeFloats); },
                          [&](int e) { return out_coords(e); }, mine.exchange.quads_scratch(m.consumer), m.thread);
      }
    }
  }

 private:
  // The tile's weights scaled by r_i / r_j, rounded, into `weights_tile` as (j, i).
  __device__ __forceinline__ void store_column_weights(int stage, T* weights_tile) {
    using Terms = WalkTerms<Walk::kGradTriangle>;
    auto acc_rc = m.acc_rc();
    const auto coords_rc = m.coords_rc();
    const uint32_t base = cast_smem_ptr_to_uint(weights_tile);
    float own_scale[Mainloop::kRows];
    CUTE_UNROLL
    for (int r = 0; r < Mainloop::kRows; ++r) own_scale[r] = Terms::Own::of(m.acc_row_terms(r)).inv_norm;
    CUTE_UNROLL
    for (int c = 0; c < Mainloop::kCols; c += 2) {  // columns c, c + 1 are tile rows j, j + 1
      const int j = get<1>(coords_rc(0, c));
      const float inverse0 = Terms::Streamed::of(m.streamed_row_terms(stage, j)).norm;
      const float inverse1 = Terms::Streamed::of(m.streamed_row_terms(stage, j + 1)).norm;
      CUTE_UNROLL
      for (int r = 0; r < Mainloop::kRows; ++r) {
        const uint32_t bits = uint32_t(T(acc_rc(r, c) * own_scale[r] * inverse0).raw()) |
                              (uint32_t(T(acc_rc(r, c + 1) * own_scale[r] * inverse1).raw()) << 16);
        const int i = m.rows0 + get<0>(coords_rc(r, c));
        const uint32_t address = base + L::weights_byte_offset(j, i);
        asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(address), "r"(bits));
      }
    }
    // The wgmma reads shared memory through the async proxy: the stores must be visible to it.
    cutlass::arch::fence_view_async_shared();
  }

  __device__ __forceinline__ void issue_column_product(T* weights_tile) {
    Tensor weights_ji = make_tensor(make_smem_ptr(weights_tile), typename L::WeightsTransposed{});
    clear(column);
    warpgroup_fence_operand(column);
    warpgroup_arrive();
    gemm(column_mma,
         column_thr.make_fragment_A(column_thr.partition_A(local_tile(weights_ji, Tile{}, make_coord(m.consumer, 0)))),
         column_thr.make_fragment_B(column_thr.partition_B(
             make_tensor(make_smem_ptr(m.shared.own), typename L::BlockTransposed{}))),
         column);
    warpgroup_commit_batch();
    warpgroup_wait<0>();
    warpgroup_fence_operand(column);
  }

  // The partners swap halves of the column product: this program keeps columns [64 rank,
  // 64 rank + 64), its elements e + 32 rank for e < 32 (element e + 32 is element e 64 columns
  // on; fragment check), adds the partner's and sends the sum to global memory. k counts the
  // column tiles, so the barriers' phases.
  __device__ __forceinline__ void exchange_and_add(int64_t t, int k) {
    const int consumer = m.consumer, thread = m.thread;
    const uint32_t rank = cute::block_rank_in_cluster(), partner = 1 - rank;
    Exchange& exchange = mine.exchange;
    float kept[kExchangeFloats];
    // The partner must have read this program's previous half before it is overwritten.
    const uint32_t partner_full = exchange.before_send(consumer, k, partner);
    const uint32_t partner_received = cluster_shared_address(&exchange.received[consumer][0][thread], partner);
    CUTE_UNROLL
    for (int v = 0; v < kExchangeQuads; ++v) {
      ClusterQuad sent;
      CUTE_UNROLL
      for (int u = 0; u < int(std::extent_v<ClusterQuad>); ++u) {
        const int e = 4 * v + u;
        kept[e] = rank == 0 ? column(e) : column(e + kExchangeFloats);
        sent[u] = rank == 0 ? column(e + kExchangeFloats) : column(e);
      }
      Exchange::send(partner_received + v * uint32_t(sizeof(float4) * 128), partner_full, sent);
    }
    exchange.sent(consumer, partner);
    wait_for_cluster(&exchange.barriers.received_full[consumer], k & 1, "received_full", consumer);
    float loaded[kExchangeQuads];
    CUTE_UNROLL
    for (int v = 0; v < kExchangeQuads; ++v) {
      const float4 got = exchange.received[consumer][v][thread];
      loaded[v] = got.x;
      kept[4 * v] += got.x, kept[4 * v + 1] += got.y, kept[4 * v + 2] += got.z, kept[4 * v + 3] += got.w;
    }
    if constexpr (Exchange::kReleasesBeforeReductions) exchange.release(consumer, partner, loaded);
    // A half wholly past D (D <= 64) adds nothing (kHalfWidth columns per half).
    if (int(rank) * kHalfWidth < p.d) {
      add_half_by_quads(out.grad, schedule.streamed_block(t) * kBlock + m.rows0, int(rank) * kHalfWidth,
                        [&](int e) { return kept[e]; }, [&](int e) { return column_coords(e); },
                        exchange.quads_scratch(consumer), thread);
    }
    if constexpr (!Exchange::kReleasesBeforeReductions) exchange.release(consumer, partner);
  }
};

}  // namespace scl::cuda::sm90

// The mma.sync kernels (sm_80 and later): every layout, every dtype, any D. On sm_90a the
// bf16 / fp16 hot paths run the wgmma kernels instead (sm90_kernels.cuh); these serve fp32 there.
//
// A program is 4 warps and owns 64 rows; it walks 64-row tiles of streamed rows, K chunks of 128
// bytes at a time through a two-stage cp.async pipeline (own and streamed chunks both stream:
// simple and D-independent). Operands go shared -> registers through CuTe's ldmatrix atoms and
// into CuTe's MMA atoms; fp32 inputs are multiplied as three TF32 products (3xTF32: the big and
// small halves of each operand, big*big + big*small + small*big), which recovers fp32 accuracy.
// The backward's tile of weights goes through shared memory into the second product, which keeps
// every register layout CuTe's.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>

#include "../core/tile_math.h"
#include "fragments.cuh"
#include "tile_args.h"
#include "tile_epilogue.cuh"

namespace scl::cuda::sm80 {

using namespace cute;
namespace tm = scl::tile_math;

constexpr int kThreads = 128;
constexpr int kBlockM = 64;    // own rows per program: 4 warps x 16
constexpr int kBlockN = 64;    // streamed rows per tile
constexpr int kBlockOut = 32;  // gradient columns per program (64 spills in 16-bit)

// Per input type: the MMA atom, the shared-memory element, the K chunk (128 bytes) and the
// shared -> register copies (K-major operands, and the MN-major operand of the second product).
template <class T>
struct Operand;
template <class T, class MmaAtom>
struct Operand16 {
  using Mma = MmaAtom;
  using Smem = T;
  using LoadK = Copy_Atom<SM75_U32x4_LDSM_N, Smem>;
  using LoadMN = Copy_Atom<SM75_U16x8_LDSM_T, Smem>;
  static constexpr bool kThreeTf32 = false;
};
template <>
struct Operand<cutlass::bfloat16_t> : Operand16<cutlass::bfloat16_t, SM80_16x8x16_F32BF16BF16F32_TN> {};
template <>
struct Operand<cutlass::half_t> : Operand16<cutlass::half_t, SM80_16x8x16_F32F16F16F32_TN> {};
template <>
struct Operand<float> {
  using Mma = SM80_16x8x8_F32TF32TF32F32_TN;
  using Smem = cutlass::tfloat32_t;  // the float's bits, split into TF32 halves in registers
  using LoadK = Copy_Atom<UniversalCopy<Smem>, Smem>;
  using LoadMN = Copy_Atom<UniversalCopy<Smem>, Smem>;
  static constexpr bool kThreeTf32 = true;
};

template <class T>
struct Config {
  using Op = Operand<T>;
  using Smem = typename Op::Smem;
  static constexpr int kVector = 16 / sizeof(Smem);      // elements per 16-byte copy
  static constexpr int kBlockK = 128 / sizeof(Smem);     // 64 (16-bit) or 32 (fp32)
  static constexpr int kMmaK = sizeof(Smem) == 2 ? 16 : 8;
  // 128-byte rows, 16-byte units swizzled across 8 rows: conflict-free cp.async and ldmatrix.
  using SwizzleAtom = decltype(composition(
      Swizzle<3, (sizeof(Smem) == 2 ? 3 : 2), 3>{},
      Layout<Shape<_8, Int<kBlockK>>, Stride<Int<kBlockK>, _1>>{}));
  using OwnLayout = decltype(tile_to_shape(SwizzleAtom{}, Shape<Int<kBlockM>, Int<kBlockK>, _2>{}));
  using StreamLayout =
      decltype(tile_to_shape(SwizzleAtom{}, Shape<Int<kBlockN>, Int<kBlockK>, _2>{}));
  // The out chunk's rows are kBlockOut elements: 64 bytes in 16-bit, 128 in fp32.
  static constexpr int kOutRowBytes = kBlockOut * int(sizeof(Smem));
  using OutAtom = decltype(composition(
      Swizzle<(kOutRowBytes == 128 ? 3 : 2), (sizeof(Smem) == 2 ? 3 : 2), 3>{},
      Layout<Shape<_8, Int<kBlockOut>>, Stride<Int<kBlockOut>, _1>>{}));
  using OutLayout = decltype(tile_to_shape(OutAtom{}, Shape<Int<kBlockN>, Int<kBlockOut>, _2>{}));
  using WeightLayout = decltype(tile_to_shape(SwizzleAtom{}, Shape<Int<kBlockM>, Int<kBlockN>>{}));
  // The out chunk as the second product's B operand: (output column, streamed row, stage).
  using OutTransposed = decltype(composition(
      OutLayout{}, Layout<Shape<Int<kBlockOut>, Int<kBlockN>, _2>,
                          Stride<Int<kBlockN>, _1, Int<kBlockN * kBlockOut>>>{}));
  using TiledMma = decltype(make_tiled_mma(typename Op::Mma{}, Layout<Shape<_4, _1, _1>>{},
                                           Tile<Int<kBlockM>, _16, Int<kMmaK>>{}));

  static constexpr int kOwnElems = cosize(OwnLayout{});
  static constexpr int kStreamElems = cosize(StreamLayout{});
  static constexpr int kOutElems = cosize(OutLayout{});
  static constexpr int kWeightElems = cosize(WeightLayout{});
  // Plus the terms of a tile's streamed and own rows, double-buffered by tile.
  static constexpr int kSharedBytes =
      (kOwnElems + kStreamElems + kOutElems + kWeightElems) * int(sizeof(Smem)) +
      2 * (kBlockN + kBlockM) * int(sizeof(RowTerms));
};

// Copies rows [row0, row0 + ROWS) and columns [k0, k0 + WIDTH) of a RowMatrix into stage `stage`
// of a shared-memory layout at `base`, zero outside the matrix, by 16-byte cp.async with
// 32-bit shared addresses (generic 64-bit ones cost two registers each).
template <int ROWS, int WIDTH, class Smem, class Layout>
__device__ __forceinline__ void load_block(const RowMatrix& m, int64_t d, int64_t row0, int64_t k0,
                                           Smem* base, Layout const& layout, int stage) {
  constexpr int kVector = 16 / sizeof(Smem);
  constexpr int kVectors = ROWS * WIDTH / kVector;
  static_assert(kVectors % kThreads == 0);
  const Smem* src = static_cast<const Smem*>(m.data);
  const uint32_t to_base = cast_smem_ptr_to_uint(base);
  CUTE_UNROLL
  for (int i = 0; i < kVectors / kThreads; ++i) {
    const int v = threadIdx.x + i * kThreads;
    const int r = v / (WIDTH / kVector), c = (v % (WIDTH / kVector)) * kVector;
    const int64_t row = row0 + r, col = k0 + c;
    const bool inside = row < m.rows && col < d;
    const Smem* from = inside ? src + row * m.stride + col : src;
    const uint32_t to = to_base + uint32_t(sizeof(Smem)) * uint32_t(layout(r, c, stage));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(to), "l"(from),
                 "r"(inside ? 16 : 0));
  }
}

// acc += a b over one MMA K block; fp32 inputs as 3xTF32.
template <bool kThreeTf32, class TiledMma, class A, class B, class C>
__device__ __forceinline__ void mma_block(TiledMma const& mma, A const& a, B const& b, C& acc) {
  if constexpr (kThreeTf32) {
    auto a_big = make_fragment_like(a), a_small = make_fragment_like(a);
    auto b_big = make_fragment_like(b), b_small = make_fragment_like(b);
    auto split = [](auto const& from, auto& big, auto& small) {
      CUTE_UNROLL
      for (int i = 0; i < size(from); ++i) {
        const float x = __uint_as_float(from(i).storage);
        const uint32_t hi = (__float_as_uint(x) + 0x1000u) & 0xffffe000u;  // round to TF32
        big(i) = cutlass::tfloat32_t::bitcast(hi);
        small(i) = cutlass::tfloat32_t::bitcast(__float_as_uint(x - __uint_as_float(hi)));
      }
    };
    split(a, a_big, a_small);
    split(b, b_big, b_small);
    gemm(mma, a_small, b_big, acc);
    gemm(mma, a_big, b_small, acc);
    gemm(mma, a_big, b_big, acc);
  } else {
    gemm(mma, a, b, acc);
  }
}

// The shared-memory buffers and the K-chunk pipeline of one program: chunk k of the own block
// and of a streamed tile (and, first in a tile, the tile's out chunk for the backward).
template <class T>
struct Pipeline {
  using C = Config<T>;
  using Smem = typename C::Smem;
  Smem* own;
  Smem* streamed;
  Smem* out;
  Smem* weights;
  RowTerms* streamed_terms;  // [2][kBlockN]: the tile's streamed rows, by tile parity
  RowTerms* own_terms;       // [2][kBlockM]: lse_symmetric's own rows (a tile's J block)

  __device__ explicit Pipeline(char* shared) {
    own = reinterpret_cast<Smem*>(shared);
    streamed = own + C::kOwnElems;
    out = streamed + C::kStreamElems;
    weights = out + C::kOutElems;
    streamed_terms = reinterpret_cast<RowTerms*>(weights + C::kWeightElems);
    own_terms = streamed_terms + 2 * kBlockN;
  }
  // A tile's per-row terms (padded arrays: no bounds), read from shared memory in the epilogue
  // so that they need no registers while the products run.
  __device__ void load_terms(const RowTerms* from, int64_t row0, RowTerms* to, int parity) {
    static_assert(kBlockN == kBlockM && kBlockN <= kThreads);
    if (threadIdx.x < kBlockN) {
      SM80_CP_ASYNC_CACHEGLOBAL_ZFILL<uint128_t>::copy(
          *reinterpret_cast<const uint128_t*>(from + row0 + threadIdx.x),
          *reinterpret_cast<uint128_t*>(to + parity * kBlockN + threadIdx.x), true);
    }
  }
  __device__ void load(const TileProblem& p, int64_t own0, int64_t streamed0, int kc, int stage) {
    const int64_t k0 = int64_t(kc) * C::kBlockK;
    load_block<kBlockM, C::kBlockK>(p.own, p.d, own0, k0, own, typename C::OwnLayout{}, stage);
    load_block<kBlockN, C::kBlockK>(p.streamed, p.d, streamed0, k0, streamed,
                                    typename C::StreamLayout{}, stage);
  }
  __device__ void load_out(const RowMatrix& rows, int64_t d, int64_t streamed0, int64_t d0,
                           int stage) {
    load_block<kBlockN, kBlockOut>(rows, d, streamed0, d0, out, typename C::OutLayout{}, stage);
  }
};

// acc += A B^T for shared-memory tiles A (M x K, K-major) and B (N x K, read with LoadB), one
// MMA K block of fragments at a time (a whole chunk's would cost 80 registers).
template <class T, class LoadB, class SmemA, class SmemB, class Acc>
__device__ __forceinline__ void shared_product(SmemA const& sA, SmemB const& sB, Acc& acc) {
  using C = Config<T>;
  typename C::TiledMma mma;
  auto thr = mma.get_slice(threadIdx.x);
  constexpr int K = C::kMmaK;
  constexpr int M = decltype(size<0>(sA))::value, N = decltype(size<0>(sB))::value;
  Tensor rA = thr.partition_fragment_A(local_tile(sA, Shape<Int<M>, Int<K>>{}, make_coord(0, 0)));
  Tensor rB = thr.partition_fragment_B(local_tile(sB, Shape<Int<N>, Int<K>>{}, make_coord(0, 0)));
  auto load_a = make_tiled_copy_A(typename C::Op::LoadK{}, mma);
  auto load_b = make_tiled_copy_B(LoadB{}, mma);
  Tensor from_a = load_a.get_slice(threadIdx.x).partition_S(sA);
  Tensor from_b = load_b.get_slice(threadIdx.x).partition_S(sB);
  Tensor to_a = load_a.get_slice(threadIdx.x).retile_D(rA);
  Tensor to_b = load_b.get_slice(threadIdx.x).retile_D(rB);
  CUTE_UNROLL
  for (int kk = 0; kk < size<2>(from_a); ++kk) {
    copy(load_a, from_a(_, _, kk), to_a(_, _, 0));
    copy(load_b, from_b(_, _, kk), to_b(_, _, 0));
    mma_block<C::Op::kThreeTf32>(mma, rA(_, _, 0), rB(_, _, 0), acc);
  }
}

// S += own chunk x streamed chunk^T from pipeline stage `stage`.
template <class T, int stage, class Acc>
__device__ __forceinline__ void chunk_product(const Pipeline<T>& pipe, Acc& acc) {
  using C = Config<T>;
  Tensor sA = make_tensor(make_smem_ptr(pipe.own), typename C::OwnLayout{});
  Tensor sB = make_tensor(make_smem_ptr(pipe.streamed), typename C::StreamLayout{});
  shared_product<T, typename C::Op::LoadK>(sA(_, _, stage), sB(_, _, stage), acc);
}

// out += weights (in shared memory) x the out chunk of stage `stage`, read transposed.
template <class T, int stage, class Acc>
__device__ __forceinline__ void weight_product(const Pipeline<T>& pipe, Acc& acc) {
  using C = Config<T>;
  Tensor sW = make_tensor(make_smem_ptr(pipe.weights), typename C::WeightLayout{});
  Tensor sO = make_tensor(make_smem_ptr(pipe.out), typename C::OutTransposed{});
  shared_product<T, typename C::Op::LoadMN>(sW, sO(_, _, stage), acc);
}

template <class T, Walk kWalk, bool kGroups>
__global__ void __launch_bounds__(kThreads, 1) walk_kernel(const TileProblem p, const WalkOutputs out) {
  using C = Config<T>;
  using Smem = typename C::Smem;
  constexpr bool kLse = kWalk == Walk::kLsePlain;
  constexpr bool kColumns = kWalk == Walk::kGradColumns;
  extern __shared__ __align__(128) char shared[];
  Pipeline<T> pipe(shared);

  const int64_t row0 = int64_t(blockIdx.x) * kBlockM;
  const int64_t tiles = (p.streamed.rows + kBlockN - 1) / kBlockN;
  const tm::TileRange range =
      kLse ? tm::split_range(tiles, out.num_splits, blockIdx.y) : tm::TileRange{0, tiles};
  const int64_t d0 = kLse ? 0 : int64_t(blockIdx.y) * kBlockOut;
  const int chunks = int((p.d + C::kBlockK - 1) / C::kBlockK);
  const int64_t steps = (range.end - range.begin) * chunks;

  typename C::TiledMma mma;
  auto thr = mma.get_slice(threadIdx.x);
  Tensor acc = partition_fragment_C(mma, Shape<Int<kBlockM>, Int<kBlockN>>{});
  Tensor grad = partition_fragment_C(mma, Shape<Int<kBlockM>, Int<kBlockOut>>{});
  clear(grad);
  // (row, column) of every accumulator element, and both seen as (rows, columns).
  Tensor coords = thr.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{}));
  Tensor acc_rc = make_tensor(acc.data(), sm80_rows_columns(acc.layout()));
  Tensor coords_rc = make_tensor(coords.data(), sm80_rows_columns(coords.layout()));
  constexpr int kRows = size<0>(decltype(acc_rc.layout()){});
  constexpr int kCols = size<1>(decltype(acc_rc.layout()){});

  // Per own row: its terms, its group ids, and for the forward its running log-sum-exp.
  RowTerms own[kRows];
  RowGroup<kGroups> own_group[kRows];
  tm::RunningLse2 running[kRows];
  CUTE_UNROLL
  for (int r = 0; r < kRows; ++r) {
    const int64_t row = row0 + get<0>(coords_rc(r, 0));
    own[r] = row < p.own.rows ? p.own_terms[row] : RowTerms{0.f, INFINITY, 0.f, 0.f};
    own_group[r] = RowGroup<kGroups>::load(p.own_groups, row);
  }

  const RowMatrix& out_rows = p.streamed;
  if (steps > 0) {
    // Chunks alternate stages by step, a tile's terms and out chunk by the tile's parity: a split
    // that starts at an odd tile must put its first tile's into slot 1.
    const int first_parity = int(range.begin & 1);
    pipe.load(p, row0, range.begin * kBlockN, 0, 0);
    pipe.load_terms(p.streamed_terms, range.begin * kBlockN, pipe.streamed_terms, first_parity);
    if (!kLse) pipe.load_out(out_rows, p.d, range.begin * kBlockN, d0, first_parity);
  }
  cp_async_fence();
  for (int64_t step = 0; step < steps; ++step) {
    const int64_t tile = range.begin + step / chunks;
    const int kc = int(step % chunks);
    if (step + 1 < steps) {  // prefetch the next chunk into the other stage
      const int64_t next_tile = range.begin + (step + 1) / chunks;
      const int next_kc = int((step + 1) % chunks);
      pipe.load(p, row0, next_tile * kBlockN, next_kc, int((step + 1) & 1));
      if (next_kc == 0) {
        pipe.load_terms(p.streamed_terms, next_tile * kBlockN, pipe.streamed_terms, int(next_tile & 1));
        if (!kLse) pipe.load_out(out_rows, p.d, next_tile * kBlockN, d0, int(next_tile & 1));
      }
    }
    cp_async_fence();
    cp_async_wait<1>();
    __syncthreads();
    if (kc == 0) clear(acc);
    if (step & 1) chunk_product<T, 1>(pipe, acc); else chunk_product<T, 0>(pipe, acc);
    if (kc == chunks - 1) {
      // The tile is complete: logits, weights or sums.
      const int64_t c0 = tile * kBlockN;
      const bool masked = walk_tile_holds_self_column<kWalk>(row0, kBlockM, c0, kBlockN, p.self_offset);
      const int parity = int(tile & 1);
      const GroupMask<kGroups, kRows, kCols> group_masked(
          own_group, p.streamed_groups, [&](int c) { return c0 + get<1>(coords_rc(0, c)); });
      tile_epilogue<kWalk, kRows, kCols>(
          acc_rc, coords_rc, [&](int r) { return own[r]; },
          [&](int c) { return shared_terms(pipe.streamed_terms + parity * kBlockN + c); },
          [&](int r, int c) {
            const int64_t row = row0 + get<0>(coords_rc(r, c)), col = c0 + get<1>(coords_rc(r, c));
            return masked && (kColumns ? row == col + p.self_offset : col == row + p.self_offset);
          },
          group_masked, running);
      if constexpr (!kLse) {
        store_tile_shared(pipe.weights, typename C::WeightLayout{}, acc, coords);
        __syncthreads();
        if (tile & 1) weight_product<T, 1>(pipe, grad); else weight_product<T, 0>(pipe, grad);
      }
    }
    __syncthreads();  // the stage just read is the next prefetch's target
  }
  cp_async_wait<0>();

  if constexpr (kLse) {
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      const int64_t row = row0 + get<0>(coords_rc(r, 0));
      if (row < p.own.rows && (threadIdx.x & 3) == 0) {
        out.part_max[int64_t(blockIdx.y) * p.own.rows + row] = running[r].max;
        out.part_sum[int64_t(blockIdx.y) * p.own.rows + row] = running[r].sum;
      }
    }
  } else {
    Tensor out_coords = thr.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockOut>>{}));
    Tensor grad_rc = make_tensor(grad.data(), sm80_rows_columns(grad.layout()));
    Tensor out_rc = make_tensor(out_coords.data(), sm80_rows_columns(out_coords.layout()));
    CUTE_UNROLL
    for (int r = 0; r < size<0>(grad_rc); ++r) {
      const int64_t row = row0 + get<0>(out_rc(r, 0));
      if (row >= p.own.rows) continue;
      // Plain rows: the anchor's coef g_i / t, applied once here.
      const float scale = kWalk == Walk::kGradRowsPlain ? own[r].w : 1.f;
      CUTE_UNROLL
      for (int c = 0; c < size<1>(grad_rc); ++c) {
        const int64_t col = d0 + get<1>(out_rc(r, c));
        if (col < out.grad_columns) out.grad[row * out.grad_columns + col] = grad_rc(r, c) * scale;
      }
    }
  }
}

// The symmetric forward over the upper triangle of Z Z^T (docs/MATH.md section 4), tiles
// transposed: a tile's rows are column block J (streamed), its columns row block I, so the sums
// of J are row sums within quads, flushed by atomics every tile, and the sums of I add up
// element-wise in registers until the program moves to its second row block or ends.
template <class T, bool kGroups>
__global__ void __launch_bounds__(kThreads, 1)
    lse_symmetric_kernel(const TileProblem p, float* row_sum, int num_splits) {
  static_assert(kBlockM == kBlockN);
  using C = Config<T>;
  extern __shared__ __align__(128) char shared[];
  Pipeline<T> pipe(shared);
  const int64_t nb = (p.streamed.rows + kBlockN - 1) / kBlockN;
  const tm::TileRange range = tm::split_range(nb + 1, num_splits, blockIdx.y);
  const int chunks = int((p.d + C::kBlockK - 1) / C::kBlockK);

  typename C::TiledMma mma;
  auto thr = mma.get_slice(threadIdx.x);
  Tensor acc = partition_fragment_C(mma, Shape<Int<kBlockM>, Int<kBlockN>>{});
  Tensor sums_i = partition_fragment_C(mma, Shape<Int<kBlockM>, Int<kBlockN>>{});
  clear(sums_i);
  Tensor coords = thr.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{}));
  Tensor acc_rc = make_tensor(acc.data(), sm80_rows_columns(acc.layout()));
  Tensor sums_rc = make_tensor(sums_i.data(), sm80_rows_columns(sums_i.layout()));
  Tensor coords_rc = make_tensor(coords.data(), sm80_rows_columns(coords.layout()));
  constexpr int kRows = size<0>(decltype(acc_rc.layout()){});
  constexpr int kCols = size<1>(decltype(acc_rc.layout()){});

  auto flush_i = [&](int64_t i0) {  // column sums of block I: one atomic per register
    CUTE_UNROLL
    for (int c = 0; c < kCols; ++c) {
      float s = 0.f;
      CUTE_UNROLL
      for (int r = 0; r < kRows; ++r) s += sums_rc(r, c);
      atomicAdd(row_sum + i0 + get<1>(coords_rc(0, c)), s);
    }
    clear(sums_i);
  };

  // Tile t of this program: the tile's J block streams as "own" (MMA rows), I as "streamed".
  auto tile_at = [&](int64_t t) { return tm::paired_triangle_tile(nb, blockIdx.x, t); };
  int64_t tiles = 0;
  while (range.begin + tiles < range.end && tile_at(range.begin + tiles).valid) ++tiles;
  const int64_t steps = tiles * chunks;
  auto load_tile_terms = [&](const tm::TriangleTile& t, int parity) {
    pipe.load_terms(p.streamed_terms, t.column_block * kBlockN, pipe.own_terms, parity);
    pipe.load_terms(p.streamed_terms, t.row_block * kBlockN, pipe.streamed_terms, parity);
  };
  if (steps > 0) {
    const tm::TriangleTile t0 = tile_at(range.begin);
    pipe.load(p, t0.column_block * kBlockN, t0.row_block * kBlockN, 0, 0);
    load_tile_terms(t0, 0);
  }
  cp_async_fence();
  for (int64_t step = 0; step < steps; ++step) {
    const tm::TriangleTile tile = tile_at(range.begin + step / chunks);
    const int kc = int(step % chunks);
    if (step + 1 < steps) {
      const tm::TriangleTile next = tile_at(range.begin + (step + 1) / chunks);
      pipe.load(p, next.column_block * kBlockN, next.row_block * kBlockN,
                int((step + 1) % chunks), int((step + 1) & 1));
      if ((step + 1) % chunks == 0) load_tile_terms(next, int(((step + 1) / chunks) & 1));
    }
    cp_async_fence();
    cp_async_wait<1>();
    __syncthreads();
    if (kc == 0) clear(acc);
    if (step & 1) chunk_product<T, 1>(pipe, acc); else chunk_product<T, 0>(pipe, acc);
    if (kc == chunks - 1) {
      const int64_t j0 = tile.column_block * kBlockN, i0 = tile.row_block * kBlockN;
      const bool diagonal = j0 == i0;
      const int parity = int((step / chunks) & 1);
      RowGroup<kGroups> group_j[kRows];
      CUTE_UNROLL
      for (int r = 0; r < kRows; ++r) group_j[r] = RowGroup<kGroups>::load(p.own_groups, j0 + get<0>(coords_rc(r, 0)));
      const GroupMask<kGroups, kRows, kCols> group_masked(
          group_j, p.streamed_groups, [&](int c) { return i0 + get<1>(coords_rc(0, c)); });
      CUTE_UNROLL
      for (int r = 0; r < kRows; ++r) {
        const int64_t j = j0 + get<0>(coords_rc(r, 0));
        const auto row_j = ContrastTerms::of(shared_terms(pipe.own_terms + parity * kBlockN + get<0>(coords_rc(r, 0))));
        float sum_j = 0.f;
        CUTE_UNROLL
        for (int c = 0; c < kCols; ++c) {
          const int64_t i = i0 + get<1>(coords_rc(r, c));
          const auto row_i = ContrastTerms::of(shared_terms(pipe.streamed_terms + parity * kBlockN + get<1>(coords_rc(r, c))));
          float s2 = WalkTerms<Walk::kLseSymmetric>::logit2(acc_rc(r, c), row_i, row_j);
          if (diagonal && i == j) s2 = -INFINITY;
          if (group_masked(r, c)) s2 = -INFINITY;
          const float e = tm::exp2_approx(s2);
          sums_rc(r, c) += e;
          sum_j += e;
        }
        sum_j = quad_sum(sum_j);
        // The diagonal tile's rows are block I's own: its column sums already count them.
        if (!diagonal && (threadIdx.x & 3) == 0) atomicAdd(row_sum + j, sum_j);
      }
      const bool last = step + 1 == steps;
      if (last || tile_at(range.begin + (step + 1) / chunks).row_block != tile.row_block) flush_i(i0);
    }
    __syncthreads();
  }
  cp_async_wait<0>();
}

}  // namespace scl::cuda::sm80

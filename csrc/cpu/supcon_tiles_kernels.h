// The tile kernels' bodies, compiled once per instruction set: a supcon_tiles_<isa>.cpp file
// defines CPU_CAPABILITY (and ATen's CPU_CAPABILITY_<ISA> macro), raises the compiler's target,
// then includes this file. Everything defined here lives in namespace scl::cpu::CPU_CAPABILITY,
// and ATen's vector types in at::vec::CPU_CAPABILITY, so the copies never meet at link time; what
// they share (std::, c10::, tile_schedule.h, blas.h) comes from tile_kernel_baseline.h, compiled
// at the baseline.
#pragma once

#ifndef CPU_CAPABILITY
#error "supcon_tiles_kernels.h is included by a supcon_tiles_<isa>.cpp file that names the ISA"
#endif

#include "tile_kernel_baseline.h"  // already included by the .cpp file, before the target rose

#include "sleef_declarations.h"  // before ATen's vector headers include sleef.h

#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

namespace scl::cpu::CPU_CAPABILITY {
namespace {

using at::vec::Vectorized;

// Rows and columns of one tile: 128 while the batch is small (more tiles than threads x rounds),
// 256 from 8,192 rows on, where operand blocks stop fitting in cache and the larger tile halves the
// memory traffic per FLOP (bench/decisions/2026-11-21-cpu-backend.md: 18.5 s -> 14.8 s at
// N = 65,536).
// Below 512 rows, a quarter of the rows rounded up to 16: four blocks a side give every round of
// the schedules at least two tiles to run side by side (a tile's BLAS calls are single-threaded),
// and a fine-tuning batch of 16 need not fill and scan a 128 x 128 tile. The rule depends on the
// shape alone, so results stay independent of the thread count.
int64_t tile_block(int64_t rows) {
  return rows >= 8192 ? 256 : std::clamp<int64_t>((rows / 4 + 15) / 16 * 16, 16, 128);
}
// Tasks the plain forward aims for when row blocks are few: enough for a many-core machine.
constexpr int64_t kMinTasks = 64;

template <typename T>
constexpr T kNegInf = -std::numeric_limits<T>::infinity();

// fp32 exp with a 5th-order polynomial on AVX2 / AVX-512: ~1e-7 relative error, well inside fp32
// tolerances, and several times cheaper than the correctly rounded one (which the default path
// computes, element by element).
inline Vectorized<float> vexp(const Vectorized<float>& x) { return x.exp_u20(); }
inline Vectorized<double> vexp(const Vectorized<double>& x) { return x.exp(); }

template <typename T>
T horizontal_sum(const Vectorized<T>& v) {
  return at::vec::vec_reduce_all<T>([](Vectorized<T>& a, Vectorized<T>& b) { return a + b; }, v);
}

template <typename T>
T horizontal_max(const Vectorized<T>& v) {
  return at::vec::vec_reduce_all<T>(
      [](Vectorized<T>& a, Vectorized<T>& b) { return at::vec::maximum(a, b); }, v);
}

int64_t num_blocks(int64_t rows, int64_t block) { return (rows + block - 1) / block; }

// Where a tile sits: rows [i0, i0 + rows) of the anchors, columns [j0, j0 + cols).
struct TileSpan {
  int64_t i0, j0, rows, cols;

  TileSpan(const TilePair& blocks, int64_t block, int64_t m, int64_t n)
      : i0(blocks.first * block), j0(blocks.second * block),
        rows(std::min(block, m - i0)), cols(std::min(block, n - j0)) {}
};

// One thread's scratch tile. Its row stride is padded to the SIMD width and the padding holds
// -inf, which exp turns into 0, so the vector loops never need a scalar tail.
template <typename T>
struct TileScratch {
  static constexpr int64_t kLanes = Vectorized<T>::size();
  const int64_t stride;
  std::vector<T> s;
  std::vector<T> col_sums;  // per-column accumulator of the symmetric forward

  explicit TileScratch(int64_t block)
      : stride((block + kLanes - 1) / kLanes * kLanes), s(block * stride, kNegInf<T>),
        col_sums(stride) {}

  T* row(int64_t i) { return s.data() + i * stride; }

  // -inf on the pairs of one group that are not positive pairs (TileProblem's group mask).
  void mask_group_pairs(const TileProblem<T>& p, const TileSpan& span) {
    if (p.words > 0) return mask_group_pairs_by_words(p, span);
    const int32_t* column_group = p.z_group + span.j0;
    const int32_t* column_class = p.z_pair_class + span.j0;
    for (int64_t i = 0; i < span.rows; ++i) {
      const int32_t group = p.q_group[span.i0 + i];
      if (group < 0) continue;
      const int32_t pair_class = p.q_pair_class[span.i0 + i];
      T* srow = row(i);
      // Branch-free, so that the compiler vectorises it: a compare and a blend per lane.
      for (int64_t j = 0; j < span.cols; ++j) {
        const bool masked = (column_group[j] == group) & (column_class[j] != pair_class);
        srow[j] = masked ? kNegInf<T> : srow[j];
      }
    }
  }

  // mask_group_pairs for multi-hot rows: a pair of one group that shares no class.
  void mask_group_pairs_by_words(const TileProblem<T>& p, const TileSpan& span) {
    const int64_t words = p.words;
    for (int64_t i = 0; i < span.rows; ++i) {
      const int32_t group = p.q_group[span.i0 + i];
      if (group < 0) continue;
      const uint64_t* anchor = p.q_words + (span.i0 + i) * words;
      T* srow = row(i);
      for (int64_t j = 0; j < span.cols; ++j) {
        if (p.z_group[span.j0 + j] != group) continue;
        const uint64_t* column = p.z_words + (span.j0 + j) * words;
        uint64_t shared = 0;
        for (int64_t w = 0; w < words; ++w) shared |= anchor[w] & column[w];
        if (shared == 0) srow[j] = kNegInf<T>;
      }
    }
  }

  // s = q[span rows] . z[span cols]^T, -inf on the padding of this tile's width, on the pairs
  // that the group mask takes out and, with self_offset >= 0, on anchor i's own column
  // self_offset + i where the tile holds it.
  void logits(const TileProblem<T>& p, const TileSpan& span) {
    const int64_t d = p.d, self_offset = p.self_offset;
    gemm_row_major<T>(false, true, span.rows, span.cols, d, T(1), p.q + span.i0 * d, d,
                      p.z + span.j0 * d, d, T(0), s.data(), stride);
    for (int64_t i = 0; i < span.rows; ++i) {
      std::fill(row(i) + span.cols, row(i) + stride, kNegInf<T>);
    }
    if (p.q_group != nullptr) mask_group_pairs(p, span);
    if (self_offset < 0) return;
    const int64_t first = std::max(span.i0, span.j0 - self_offset);
    const int64_t last = std::min(span.i0 + span.rows, span.j0 + span.cols - self_offset);
    for (int64_t i = first; i < last; ++i) row(i - span.i0)[i + self_offset - span.j0] = kNegInf<T>;
  }
};

// The number of vector steps that cover `cols` columns of a padded tile row.
template <typename T>
int64_t padded_cols(int64_t cols) {
  constexpr int64_t lanes = Vectorized<T>::size();
  return (cols + lanes - 1) / lanes * lanes;
}

template <typename T>
void run_rounds(const std::vector<std::vector<TilePair>>& rounds, int64_t block,
                const std::function<void(TileScratch<T>&, const TilePair&)>& tile_fn) {
  for (const auto& round : rounds) {
    at::parallel_for(0, static_cast<int64_t>(round.size()), 1, [&](int64_t begin, int64_t end) {
      TileScratch<T> scratch(block);
      for (int64_t t = begin; t < end; ++t) tile_fn(scratch, round[t]);
    });
  }
}

template <typename T>
void lse_symmetric(const TileProblem<T>& p, double* lse) {
  using Vec = Vectorized<T>;
  constexpr int64_t lanes = Vec::size();
  const int64_t n = p.n;
  const T inv_t = p.inv_t;
  const int64_t block = tile_block(n), nb = num_blocks(n, block);
  // Row sums of exp(s - 1/t); double, as they gather up to n terms each.
  std::vector<double> sums(n, 0.0);
  const Vec scale(inv_t), shift(-inv_t);

  run_rounds<T>(round_robin_rounds(nb), block, [&](TileScratch<T>& tile, const TilePair& blocks) {
    const TileSpan span(blocks, block, n, n);
    const auto [i0, j0, rows, cols] = span;
    tile.logits(p, span);
    const bool diagonal = i0 == j0;
    T* col_sums = tile.col_sums.data();
    std::fill(tile.col_sums.begin(), tile.col_sums.end(), T(0));
    const int64_t width = padded_cols<T>(cols);
    for (int64_t i = 0; i < rows; ++i) {
      const T* srow = tile.row(i);
      Vec row_acc(T(0));
      for (int64_t j = 0; j < width; j += lanes) {
        const Vec e = vexp(at::vec::fmadd(Vec::loadu(srow + j), scale, shift));
        row_acc = row_acc + e;
        if (!diagonal) (Vec::loadu(col_sums + j) + e).store(col_sums + j);
      }
      sums[i0 + i] += static_cast<double>(horizontal_sum(row_acc));
    }
    if (!diagonal) {
      for (int64_t j = 0; j < cols; ++j) sums[j0 + j] += static_cast<double>(col_sums[j]);
    }
  });
  for (int64_t i = 0; i < n; ++i) lse[i] = static_cast<double>(inv_t) + std::log(sums[i]);
}

template <typename T>
void grad_symmetric(const TileProblem<T>& p, const T* row_coef, T* dz) {
  using Vec = Vectorized<T>;
  constexpr int64_t lanes = Vec::size();
  const T* z = p.z;
  const int64_t n = p.n, d = p.d;
  const T inv_t = p.inv_t;
  const int64_t block = tile_block(n), nb = num_blocks(n, block);
  // p_ij = exp(s_ij - 1/t) * exp(1/t - lse_i), so one exp per element serves G_ij and G_ji.
  // Zero padding keeps the padded lanes of a tile's last vector finite.
  std::vector<T> coef(nb * block + lanes, T(0));
  std::copy(row_coef, row_coef + n, coef.begin());
  const Vec scale(inv_t), shift(-inv_t);

  run_rounds<T>(round_robin_rounds(nb), block, [&](TileScratch<T>& tile, const TilePair& blocks) {
    const TileSpan span(blocks, block, n, n);
    const auto [i0, j0, rows, cols] = span;
    tile.logits(p, span);
    const bool diagonal = i0 == j0;
    // H_ij = E_ij (coef_i + coef_j): the tile's share of both G_ij and G_ji.
    const int64_t width = padded_cols<T>(cols);
    for (int64_t i = 0; i < rows; ++i) {
      T* srow = tile.row(i);
      const Vec ci(coef[i0 + i]);
      for (int64_t j = 0; j < width; j += lanes) {
        const Vec e = vexp(at::vec::fmadd(Vec::loadu(srow + j), scale, shift));
        (e * (ci + Vec::loadu(coef.data() + j0 + j))).store(srow + j);
      }
    }
    const int64_t ld = tile.stride;
    gemm_row_major<T>(false, false, rows, d, cols, T(1), tile.row(0), ld, z + j0 * d, d, T(1),
                      dz + i0 * d, d);
    if (!diagonal) {
      gemm_row_major<T>(true, false, cols, d, rows, T(1), tile.row(0), ld, z + i0 * d, d, T(1),
                        dz + j0 * d, d);
    }
  });
}

template <typename T>
void lse_plain(const TileProblem<T>& p, double* lse) {
  using Vec = Vectorized<T>;
  constexpr int64_t lanes = Vec::size();
  const int64_t block = tile_block(std::max(p.m, p.n));
  const int64_t mb = num_blocks(p.m, block), nb = num_blocks(p.n, block);
  // Few row blocks cannot occupy every thread: split the columns too, then merge the partial
  // (max, sum) pairs of each row. The split depends on the shape only, never on the thread
  // count, so the summation order (and the result, to the bit) does not either.
  const int64_t splits =
      std::min<int64_t>(nb, std::max<int64_t>(1, (kMinTasks + mb - 1) / mb));
  const int64_t blocks_per_split = (nb + splits - 1) / splits;
  std::vector<T> part_max(splits * p.m, kNegInf<T>);
  std::vector<double> part_sum(splits * p.m, 0.0);
  const Vec scale(p.inv_t);

  at::parallel_for(0, mb * splits, 1, [&](int64_t begin, int64_t end) {
    TileScratch<T> tile(block);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t bi = task / splits, split = task % splits;
      const int64_t i0 = bi * block, rows = std::min(block, p.m - i0);
      T* run_max = part_max.data() + split * p.m + i0;
      double* run_sum = part_sum.data() + split * p.m + i0;
      const int64_t bj_end = std::min(nb, (split + 1) * blocks_per_split);
      for (int64_t bj = split * blocks_per_split; bj < bj_end; ++bj) {
        const TileSpan span({bi, bj}, block, p.m, p.n);
        tile.logits(p, span);
        const int64_t width = padded_cols<T>(span.cols);
        for (int64_t i = 0; i < rows; ++i) {
          const T* srow = tile.row(i);
          Vec vmax(kNegInf<T>);
          for (int64_t j = 0; j < width; j += lanes) vmax = at::vec::maximum(vmax, Vec::loadu(srow + j));
          const T tile_max = horizontal_max(vmax) * p.inv_t;
          if (tile_max == kNegInf<T>) continue;  // every column of this tile masked
          const T new_max = std::max(run_max[i], tile_max);
          const Vec shift(-new_max);
          Vec acc(T(0));
          // The logit rounded before the shift, as its maximum was: a fused multiply-add would
          // exceed the maximum by up to half its ulp, which overflows exp for large logits.
          for (int64_t j = 0; j < width; j += lanes) {
            acc = acc + vexp(Vec::loadu(srow + j) * scale + shift);
          }
          run_sum[i] = run_sum[i] * std::exp(static_cast<double>(run_max[i] - new_max)) +
                       static_cast<double>(horizontal_sum(acc));
          run_max[i] = new_max;
        }
      }
    }
  });
  for (int64_t i = 0; i < p.m; ++i) {
    T row_max = kNegInf<T>;
    for (int64_t s = 0; s < splits; ++s) row_max = std::max(row_max, part_max[s * p.m + i]);
    if (row_max == kNegInf<T>) {  // no column at all: an empty sum
      lse[i] = -std::numeric_limits<double>::infinity();
      continue;
    }
    double total = 0.0;
    for (int64_t s = 0; s < splits; ++s) {
      const T mx = part_max[s * p.m + i];
      if (mx != kNegInf<T>) total += part_sum[s * p.m + i] * std::exp(static_cast<double>(mx - row_max));
    }
    // In float64: for large logits a float32 lse could not hold log(total) next to row_max.
    lse[i] = static_cast<double>(row_max) + std::log(total);
  }
}

template <typename T>
void grad_plain(const TileProblem<T>& p, const T* coef, const T* lse_hi, const T* lse_lo, T* dq,
                T* dz) {
  using Vec = Vectorized<T>;
  constexpr int64_t lanes = Vec::size();
  const int64_t block = tile_block(std::max(p.m, p.n));
  const int64_t mb = num_blocks(p.m, block), nb = num_blocks(p.n, block);
  const Vec scale(p.inv_t);

  run_rounds<T>(diagonal_waves(mb, nb), block, [&](TileScratch<T>& tile, const TilePair& blocks) {
    const TileSpan span(blocks, block, p.m, p.n);
    const auto [i0, j0, rows, cols] = span;
    tile.logits(p, span);
    const int64_t width = padded_cols<T>(cols);
    for (int64_t i = 0; i < rows; ++i) {
      T* srow = tile.row(i);
      const T ci = coef[i0 + i];
      if (ci == T(0)) {  // also keeps an empty row's lse = -inf out of the exp
        std::fill(srow, srow + width, T(0));
        continue;
      }
      // s * inv_t rounded as the forward rounded it, and lse in two parts: a float32 lse alone
      // would be off by up to half an ulp of the largest logit.
      const Vec hi(-lse_hi[i0 + i]), lo(lse_lo[i0 + i]), vcoef(ci);
      for (int64_t j = 0; j < width; j += lanes) {
        const Vec shifted = (Vec::loadu(srow + j) * scale + hi) - lo;
        (vcoef * vexp(shifted)).store(srow + j);
      }
    }
    const int64_t ld = tile.stride;
    gemm_row_major<T>(false, false, rows, p.d, cols, T(1), tile.row(0), ld, p.z + j0 * p.d, p.d,
                      T(1), dq + i0 * p.d, p.d);
    gemm_row_major<T>(true, false, cols, p.d, rows, T(1), tile.row(0), ld, p.q + i0 * p.d, p.d,
                      T(1), dz + j0 * p.d, p.d);
  });
}

}  // namespace

template <typename T>
const TileKernelSet<T>& tile_kernels() {
  static constexpr TileKernelSet<T> kernels{lse_symmetric<T>, grad_symmetric<T>, lse_plain<T>,
                                          grad_plain<T>};
  return kernels;
}
template const TileKernelSet<float>& tile_kernels<float>();
template const TileKernelSet<double>& tile_kernels<double>();

}  // namespace scl::cpu::CPU_CAPABILITY

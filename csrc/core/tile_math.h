// The per-element and per-row arithmetic of the tiled SupCon kernels (docs/MATH.md sections 2-4),
// written once for the host and the device: torch-free, header-only, no CUDA headers needed.
// The CUDA kernels (csrc/cuda) call these on every tile; the CPU test suite runs the same
// functions on the host (python_tests/test_tile_math.py compiles csrc/tests/tile_math_check.cpp).
//
// Logits are in base 2: s2_ij = (x_i . x_j) r_i r_j log2(e) / t with r the inverse row norms, so
// that exp is exp2, the GPU's native exponential. A column's factor r_j log2(e) / t and the
// shift are per-column numbers, so one FMUL and one FFMA make a logit.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

#if defined(__CUDACC__)
#define SCL_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define SCL_HOST_DEVICE inline
#endif

namespace scl::tile_math {

constexpr double kLog2e = 1.4426950408889634074;
constexpr double kLn2 = 0.69314718055994530942;
// The smallest norm a row is divided by, as torch.nn.functional.normalize's eps.
constexpr double kNormEps = 1e-12;

SCL_HOST_DEVICE float exp2_approx(float x) {
#if defined(__CUDA_ARCH__)
  return exp2f(x);  // MUFU.EX2 under --use_fast_math; exp2(-inf) = 0
#else
  return std::exp2(x);
#endif
}

// The fixed shift (section 2): with unit rows every logit is at most 1/t, so 1/t can replace the
// running maximum when even the smallest term, exp(-2/t), is a normal number of the compute
// type, with a 5% margin. `min_normal_log` is log(smallest normal) of that type.
SCL_HOST_DEVICE bool fixed_shift_is_safe(double inv_t, double min_normal_log) {
  return 2 * inv_t < -min_normal_log * 0.95;
}
SCL_HOST_DEVICE bool fixed_shift_is_safe_fp32(double inv_t) {
  return fixed_shift_is_safe(inv_t, -87.336544750553102);  // log(2^-126)
}

// The base-2 logit of a tile element: dot * (r_j log2(e) / t) * r_i + bias_j, as an FMUL (the
// column's factor, rounded) and one FFMA (the row's factor and the bias, fused). Every pass over
// a tile forms its logits this same way, so a row's maximum and its later terms agree to the bit
// (docs/MATH.md section 6).
SCL_HOST_DEVICE float logit2(float dot, float row_scale, float column_scaled, float bias) {
  return fmaf(dot * column_scaled, row_scale, bias);
}

// Online base-2 log-sum-exp of one row: running maximum and the sum of 2^(s2 - max).
struct RunningLse2 {
  float max = -std::numeric_limits<float>::infinity();
  float sum = 0.0f;

  // The shift a tile's terms use once `tile_max` is seen: the new maximum, or 0 while every
  // column seen is masked (max still -inf), so that 2^(-inf - shift) is 0, never NaN.
  SCL_HOST_DEVICE float shift_for(float tile_max) const {
    const float m = fmaxf(max, tile_max);
    return m == -std::numeric_limits<float>::infinity() ? 0.0f : m;
  }
  // Moves to the shift returned by shift_for(tile_max) and adds the tile's terms, already
  // computed as 2^(s2 - shift).
  SCL_HOST_DEVICE void add(float tile_max, float tile_sum_at_shift) {
    const float shift = shift_for(tile_max);
    sum = sum * exp2_approx(max - shift) + tile_sum_at_shift;
    max = fmaxf(max, tile_max);
  }
  // Another part's (max, sum) over other columns (column splits).
  SCL_HOST_DEVICE void merge(float other_max, float other_sum) {
    const float m = fmaxf(max, other_max);
    if (m == -std::numeric_limits<float>::infinity()) return;
    sum = sum * exp2_approx(max - m) + other_sum * exp2_approx(other_max - m);
    max = m;
  }
  // The natural-log LSE in float64 (-inf for a row without columns); section 6 says why the
  // addition is done in float64.
  SCL_HOST_DEVICE double lse() const {
    if (sum == 0.0f) return -std::numeric_limits<double>::infinity();
    return (static_cast<double>(max) + std::log2(static_cast<double>(sum))) * kLn2;
  }
};

// The symmetric schedule's LSE from the fixed-shift row sum sum_j 2^(s2_ij - log2(e)/t).
SCL_HOST_DEVICE double symmetric_lse(double inv_t, float row_sum) {
  if (row_sum == 0.0f) return -std::numeric_limits<double>::infinity();
  return inv_t + std::log(static_cast<double>(row_sum));
}

// A float64 natural-log LSE as a base-2 float32 pair (hi, lo) with hi + lo = lse * log2(e) to
// float64 accuracy, so that (s2 - hi) - lo is exact near the row maximum (section 6).
struct Lse2Split {
  float hi, lo;
};
SCL_HOST_DEVICE Lse2Split split_lse2(double lse) {
  const double lse2 = lse * kLog2e;
  const float hi = static_cast<float>(lse2);
  const bool finite = lse2 > -std::numeric_limits<double>::infinity() &&
                      lse2 < std::numeric_limits<double>::infinity();
  return {hi, finite ? static_cast<float>(lse2 - static_cast<double>(hi)) : 0.0f};
}

// Plain backward: the softmax weight p_ij r_j of a tile element (the row's coef g_i / t is applied
// once per row at the end). A row that carries no gradient gets hi = +inf, so 0, whatever its
// logit.
SCL_HOST_DEVICE float plain_grad_weight(float s2, Lse2Split lse2, float column_scale) {
  return exp2_approx((s2 - lse2.hi) - lse2.lo) * column_scale;
}
SCL_HOST_DEVICE Lse2Split no_gradient_lse2() {
  return {std::numeric_limits<float>::infinity(), 0.0f};
}

// Symmetric backward: (G + G^T)_ij r_j for unit rows, E_ij (coef_i + coef_j) r_j with
// E = 2^(s2 - log2(e)/t) (s2 already shifted), coef_i = g_i e^(1/t - lse_i) / t. The column
// carries coef_j r_j; the row's coef_i meets r_j log2(e)/t, so it arrives divided by
// log2(e)/t: coef_row = coef_i t / log2(e).
SCL_HOST_DEVICE float symmetric_grad_weight(float shifted_s2, float coef_row,
                                            float column_scaled, float column_coef_scale) {
  return exp2_approx(shifted_s2) * fmaf(coef_row, column_scaled, column_coef_scale);
}

// coef_i of the symmetric backward from float64 g_i and lse_i; 0 where g_i = 0 (lse may be -inf).
SCL_HOST_DEVICE double symmetric_coef(double g, double lse, double inv_t) {
  return g == 0.0 ? 0.0 : g * std::exp(inv_t - lse) * inv_t;
}

// Whether column tile [c0, c0 + block_n) holds a self column of rows [r0, r0 + block_m), the
// self column of row i being i + self_offset (self_offset < 0: none): only those tiles mask.
SCL_HOST_DEVICE bool tile_holds_self_column(int64_t r0, int64_t block_m, int64_t c0,
                                            int64_t block_n, int64_t self_offset) {
  if (self_offset < 0) return false;
  const int64_t first = r0 + self_offset, last = first + block_m - 1;
  return first < c0 + block_n && last >= c0;
}

// A row's ids for the group mask (SupConProblem::anchor_group and the rest): its compact group
// (-1: none) and its pair class, equal for two rows exactly when they are a positive pair. 8
// bytes, so that a kernel reads a row's in one load.
struct alignas(8) GroupId {
  int32_t group, pair_class;
};
// Whether the group mask takes pair (i, j) out of the denominator, as the self column is
// (docs/MATH.md section 11): one group, not a positive pair. Symmetric in i and j, so the
// symmetric schedule's tile serves both of its sides.
SCL_HOST_DEVICE bool group_masks_pair(GroupId i, GroupId j) {
  return i.group >= 0 && i.group == j.group && i.pair_class != j.pair_class;
}

// [begin, end) of one split's share of `tiles` tiles (in whole tiles; end <= tiles).
struct TileRange {
  int64_t begin, end;
};
SCL_HOST_DEVICE TileRange split_range(int64_t tiles, int64_t num_splits, int64_t split) {
  const int64_t per = (tiles + num_splits - 1) / num_splits;
  const int64_t begin = split * per;
  const int64_t end = begin + per < tiles ? begin + per : tiles;
  return {begin < tiles ? begin : tiles, end};
}

// The symmetric forward's triangle, paired so that every program does nb + 1 tiles: program p
// takes row block p with column blocks p .. nb-1, then row block nb-1-p with column blocks
// nb-1-p .. nb-1. Tile t (0 <= t < nb + 1, or t < nb when nb is odd and p is the middle) of
// program p is (row block, column block); valid = false past the end.
struct TriangleTile {
  int64_t row_block, column_block;
  bool valid;
};
SCL_HOST_DEVICE TriangleTile paired_triangle_tile(int64_t nb, int64_t p, int64_t t) {
  const int64_t first = nb - p;  // tiles of row block p
  if (t < first) return {p, p + t, true};
  const int64_t partner = nb - 1 - p;
  const int64_t j = partner + (t - first);
  if (partner == p || j >= nb) return {partner, j, false};
  return {partner, j, true};
}
SCL_HOST_DEVICE int64_t triangle_pairs(int64_t nb) { return (nb + 1) / 2; }

// The symmetric backward's triangle (sm_90a), walked by cluster pairs of row blocks (2p, 2p + 1)
// that meet every column block J > 2p + 1 together, so that the two programs' partial gradients
// of J are added over distributed shared memory before one reduction into global memory. Row
// block I's tiles: t = 0 its diagonal block, t = 1 its partner's block (both its own rows' side
// only: the partner covers the mirror tile), then t >= 2 the column block 2p + t, both sides. A
// last odd block pairs with a block of padding and walks its diagonal only. Both programs of a
// pair walk the same number of tiles.
SCL_HOST_DEVICE int64_t pair_triangle_tiles(int64_t nb, int64_t row_block) {
  const int64_t first = row_block - row_block % 2;
  return first + 1 < nb ? nb - first : 1;
}
SCL_HOST_DEVICE int64_t pair_triangle_column_block(int64_t row_block, int64_t t) {
  return t == 0 ? row_block : t == 1 ? row_block ^ 1 : row_block - row_block % 2 + t;
}
// Whether tile t also adds the column block's side (the partner adds the other half of it).
SCL_HOST_DEVICE bool pair_triangle_has_column_side(int64_t t) { return t >= 2; }

}  // namespace scl::tile_math

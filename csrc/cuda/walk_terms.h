// What each walk's per-row terms hold, and the per-element arithmetic of a walk over them. The
// glue writes four fp32 slots per row (RowTerms: one 16-byte load; row_stages.h, row_terms); the
// kernels read them only through the views below, one type per kind of row, whose fields are
// named for what they hold and listed in slot order. A view takes its fields from registers
// already loaded, so it costs nothing in the machine code. Host code too: the dry run
// (csrc/cuda_dry_run) emulates the walks with these same views.
#pragma once

#include "../core/tile_math.h"
#include "tile_args.h"

namespace scl::cuda {

// The walks of an own row block over streamed tiles. kGradTriangle (sm_90a) is the symmetric
// backward over the upper triangle by cluster pairs: its tiles' weights are those of
// kGradRowsSymmetric, both sides of a tile are added. kGradTriangleAsync is the same walk and
// arithmetic (its terms are kGradTriangle's) with another exchange between the partners
// (sm90_epilogue_triangle.cuh); last, so that the others keep the values the profilers print.
enum class Walk {
  kLsePlain,
  kLseSymmetric,
  kGradRowsPlain,
  kGradRowsSymmetric,
  kGradColumns,
  kGradTriangle,
  kGradTriangleAsync
};

// A contrast row: the streamed side of the plain forward and of the plain rows walk, the own side
// of the columns walk, both sides of the symmetric forward.
struct ContrastTerms {
  float logit_scale;  // r_j log2(e) / t
  float bias;         // 0, or the fixed shift -log2(e) / t in the symmetric forward; -inf past the last row
  float inv_norm;     // r_j
  static SCL_HOST_DEVICE ContrastTerms of(const RowTerms& t) { return {t.x, t.y, t.z}; }
};

// An anchor of the plain forward (own side).
struct LseAnchorTerms {
  float inv_norm;  // r_i
  static SCL_HOST_DEVICE LseAnchorTerms of(const RowTerms& t) { return {t.x}; }
};

// An anchor of the plain backward, with its base-2 LSE as an fp32 pair (tile_math::Lse2Split;
// lse2_hi = +inf for an anchor without gradient, or past the last one): the own side of the rows
// walk, the streamed side of the columns walk.
struct AnchorGradTerms {
  float inv_norm;  // r_i
  float lse2_hi;
  float lse2_lo;
  // The rows walk applies the anchor's coef_i once per gradient row, at the end; the columns walk
  // scales every weight by coef_i r_i.
  float coef;
  static SCL_HOST_DEVICE AnchorGradTerms of(const RowTerms& t) { return {t.x, t.y, t.z, t.w}; }
};

// A row block's own side in the symmetric backward (both walks of it).
struct SymmetricGradOwnTerms {
  float inv_norm;  // r_i
  // coef_i t / log2(e): it meets a column's r_j log2(e) / t (tile_math::symmetric_grad_weight).
  float coef_per_logit_scale;
  static SCL_HOST_DEVICE SymmetricGradOwnTerms of(const RowTerms& t) { return {t.x, t.w}; }
};

// A streamed row of the symmetric backward.
struct SymmetricGradStreamedTerms {
  float logit_scale;  // r_j log2(e) / t
  float bias;         // the fixed shift -log2(e) / t; -inf past the last row
  float norm;         // 1 / r_j (0 past the last row): the triangle's column side divides by r_j
  float coef_times_inv_norm;  // coef_j r_j
  static SCL_HOST_DEVICE SymmetricGradStreamedTerms of(const RowTerms& t) { return {t.x, t.y, t.z, t.w}; }
};

// A walk's kinds of rows (Own, Streamed), its base-2 logit and, in the backward walks, a tile
// element's gradient weight from that logit (self column already masked to -inf).
template <Walk kWalk>
struct WalkTerms;

template <>
struct WalkTerms<Walk::kLsePlain> {
  using Own = LseAnchorTerms;
  using Streamed = ContrastTerms;
  static SCL_HOST_DEVICE float logit2(float dot, const Own& own, const Streamed& column) {
    return tile_math::logit2(dot, own.inv_norm, column.logit_scale, column.bias);
  }
};

// Own rows I, streamed rows J of one set (the sm_90a kernel computes the tile transposed).
template <>
struct WalkTerms<Walk::kLseSymmetric> {
  using Own = ContrastTerms;
  using Streamed = ContrastTerms;
  static SCL_HOST_DEVICE float logit2(float dot, const Own& row_i, const Streamed& row_j) {
    return tile_math::logit2(dot, row_i.inv_norm, row_j.logit_scale, row_j.bias);
  }
};

template <>
struct WalkTerms<Walk::kGradRowsPlain> {
  using Own = AnchorGradTerms;
  using Streamed = ContrastTerms;
  static SCL_HOST_DEVICE float logit2(float dot, const Own& anchor, const Streamed& column) {
    return tile_math::logit2(dot, anchor.inv_norm, column.logit_scale, column.bias);
  }
  static SCL_HOST_DEVICE float weight(float s2, const Own& anchor, const Streamed& column) {
    return tile_math::plain_grad_weight(s2, {anchor.lse2_hi, anchor.lse2_lo}, column.inv_norm);
  }
};

// The own rows are contrast rows, the streamed rows anchors: the same rounding as the rows walk's
// logit (the anchor's factor fused, the column's first), with no bias.
template <>
struct WalkTerms<Walk::kGradColumns> {
  using Own = ContrastTerms;
  using Streamed = AnchorGradTerms;
  static SCL_HOST_DEVICE float logit2(float dot, const Own& column, const Streamed& anchor) {
    return tile_math::logit2(dot, anchor.inv_norm, column.logit_scale, 0.f);
  }
  static SCL_HOST_DEVICE float weight(float s2, const Own&, const Streamed& anchor) {
    return tile_math::plain_grad_weight(s2, {anchor.lse2_hi, anchor.lse2_lo}, anchor.coef);
  }
};

template <>
struct WalkTerms<Walk::kGradRowsSymmetric> {
  using Own = SymmetricGradOwnTerms;
  using Streamed = SymmetricGradStreamedTerms;
  static SCL_HOST_DEVICE float logit2(float dot, const Own& own, const Streamed& streamed) {
    return tile_math::logit2(dot, own.inv_norm, streamed.logit_scale, streamed.bias);
  }
  static SCL_HOST_DEVICE float weight(float s2, const Own& own, const Streamed& streamed) {
    return tile_math::symmetric_grad_weight(s2, own.coef_per_logit_scale, streamed.logit_scale,
                                            streamed.coef_times_inv_norm);
  }
};

template <>
struct WalkTerms<Walk::kGradTriangle> : WalkTerms<Walk::kGradRowsSymmetric> {};

}  // namespace scl::cuda

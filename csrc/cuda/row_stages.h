// The CUDA backend's fused O(N*D) stages (scl::TileKernels::prepare_rows, anchor_losses,
// anchor_weights and assemble_backward; csrc/core/tile_kernels.h states what each computes), and
// the tiles' per-row terms and the forward's log-sum-exp merge: one kernel launch each. A stage
// that walks the D columns of a row gives the row to a warp (Lane below: lane l takes columns l,
// l + 32, ..., so a warp's loads are consecutive elements), in two parts: each lane's partial
// sums, then, with the row's totals, each lane's writes; the row terms and the merge take one
// thread per row. Each part is written once below for the host and the device: the CUDA kernels
// (row_stages.cu) run them on a warp, the dry run (csrc/cuda_dry_run) runs a row's 32 lanes one
// after another on the CPU, where python_tests/backends/test_cuda_dry_run.py checks them against
// the float64 reference.
//
// Torch-free: plain pointers and sizes, filled by the ATen glue (supcon_cuda.cpp). Class sums are
// added by atomics on the device (not bitwise reproducible: the core serves
// torch.use_deterministic_algorithms(True) with its ATen steps instead).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "../core/kernel_temperature.h"
#include "../core/tile_math.h"
#include "launch.h"
#include "tile_args.h"

namespace scl::cuda::row_stages {

SCL_HOST_DEVICE float bits_to_float(uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
#endif
}

// IEEE half to float, exactly (subnormals, infinities and NaN included).
SCL_HOST_DEVICE float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
  if (exponent == 0) {
    const float magnitude = float(mantissa) * 5.9604644775390625e-8f;  // mantissa * 2^-24
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 31) return bits_to_float(sign | 0x7f800000u | (mantissa << 13));
  return bits_to_float(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

SCL_HOST_DEVICE uint32_t float_to_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  return bits;
#endif
}

// float to bfloat16 bits, rounded to nearest even (NaN stays a quiet NaN), by integer arithmetic:
// the same bits on the host and the device, as torch's conversion gives.
SCL_HOST_DEVICE uint16_t float_to_bfloat16(float x) {
  const uint32_t bits = float_to_bits(x);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return uint16_t((bits >> 16) | 0x40u);
  return uint16_t((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

// float to IEEE half bits, rounded to nearest even (overflow to infinity, subnormals exact).
SCL_HOST_DEVICE uint16_t float_to_half(float x) {
  uint32_t bits = float_to_bits(x);
  const uint16_t sign = uint16_t((bits >> 16) & 0x8000u);
  bits &= 0x7fffffffu;
  if (bits > 0x7f800000u) return sign | 0x7e00u;               // NaN
  if (bits >= 0x47800000u) return sign | 0x7c00u;              // >= 2^16: infinity
  if (bits < 0x38800000u) {                                    // below 2^-14: a subnormal half
    // Adding 0.5 puts the half's 10 subnormal bits at the bottom of the float's mantissa,
    // rounded to nearest even by the float addition itself.
    return sign | uint16_t(float_to_bits(bits_to_float(bits) + 0.5f) - 0x3f000000u);
  }
  // Rebias the exponent, round the 13 dropped bits to nearest even (a carry may reach infinity).
  bits += (uint32_t(15 - 127) << 23) + 0xfffu + ((bits >> 13) & 1u);
  return sign | uint16_t(bits >> 13);
}

// A row-major matrix of the caller's rows, 16- or 32-bit (the glue never passes float64: the core
// takes its ATen steps for float64 inputs).
struct Rows {
  ElementType type;
  const void* data;
  int64_t stride;  // elements between rows

  SCL_HOST_DEVICE float at(int64_t row, int64_t column) const {
    const int64_t i = row * stride + column;
    switch (type) {
      case ElementType::kBFloat16:
        return bits_to_float(uint32_t(static_cast<const uint16_t*>(data)[i]) << 16);
      case ElementType::kFloat16: return half_to_float(static_cast<const uint16_t*>(data)[i]);
      default: return static_cast<const float*>(data)[i];
    }
  }
};

// An atomic add on the device (float or int32); the dry run's host loop runs one lane at a time.
template <class T>
SCL_HOST_DEVICE void add_to(T* target, T value) {
#if defined(__CUDA_ARCH__)
  atomicAdd(target, value);
#else
  *target += value;
#endif
}

SCL_HOST_DEVICE float divide_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

// 1 / max(||x||, eps), correctly rounded as the core's ATen norm and reciprocal are (the device's
// fast-math sqrt and division are not).
SCL_HOST_DEVICE float inverse_norm(float squares) {
  constexpr float eps = float(tile_math::kNormEps);
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(1.0f, fmaxf(__fsqrt_rn(squares), eps));
#else
  return 1.0f / std::fmax(std::sqrt(squares), eps);
#endif
}

SCL_HOST_DEVICE bool is_finite(float x) {
#if defined(__CUDA_ARCH__)
  return isfinite(x);
#else
  return std::isfinite(x);
#endif
}

// The first position in sorted[0, n) whose value is >= key (after: > key).
SCL_HOST_DEVICE int64_t search(const int64_t* sorted, int64_t n, int64_t key, bool after) {
  int64_t lo = 0, hi = n;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    const bool right = after ? sorted[mid] <= key : sorted[mid] < key;
    lo = right ? mid + 1 : lo;
    hi = right ? hi : mid;
  }
  return lo;
}

// The columns of a row that one lane of its warp takes: index, index + count, ...
struct Lane {
  int index, count;
  SCL_HOST_DEVICE bool leader() const { return index == 0; }
};
constexpr int kLanes = 32;

// What a row's lanes sum before its writes: two float sums (a count of non-finite values is
// exact in a float up to 2^24).
struct Partial {
  float first = 0.0f, second = 0.0f;
  SCL_HOST_DEVICE Partial operator+(const Partial& other) const {
    return {first + other.first, second + other.second};
  }
};

// sums[class] += rows[r] * scale over this lane's columns.
SCL_HOST_DEVICE void add_row_to_class(float* sums, int64_t class_id, const Rows& rows, int64_t r,
                                      int64_t d, float scale, Lane lane) {
  float* target = sums + class_id * d;
  for (int64_t k = lane.index; k < d; k += lane.count) add_to(target + k, rows.at(r, k) * scale);
}

// ---- prepare_rows ------------------------------------------------------------------------------

struct RowPreparation {
  Rows rows;
  int64_t count, d;
  const int64_t* labels;         // [count]
  const int64_t* sorted_labels;  // [n] the contrast rows' labels, ascending
  int64_t n;
  bool normalize, self_in_class;
  float* inv_norm;               // [count]
  int64_t* row_class;            // [count]
  int64_t* num_positives;        // [count]
  float* class_sums;             // [n, d] zeroed, or null: not asked for
  int32_t* non_finite;           // [1] zeroed, or null: not asked for
};

// The lane's share of the row's squared norm and of its count of NaN / inf values.
SCL_HOST_DEVICE Partial prepare_row_partial(const RowPreparation& a, int64_t r, Lane lane) {
  Partial p;
  for (int64_t k = lane.index; k < a.d; k += lane.count) {
    const float x = a.rows.at(r, k);
    p.first += x * x;
    p.second += is_finite(x) ? 0.0f : 1.0f;
  }
  return p;
}

SCL_HOST_DEVICE void prepare_row_finish(const RowPreparation& a, int64_t r, Lane lane, Partial row) {
  const int64_t label = a.labels[r];
  const int64_t lower = search(a.sorted_labels, a.n, label, false);
  const int64_t class_id = lower < a.n - 1 ? lower : a.n - 1;
  const float scale = a.normalize ? inverse_norm(row.first) : 1.0f;
  if (lane.leader()) {
    const int64_t upper = search(a.sorted_labels, a.n, label, true);
    a.row_class[r] = class_id;
    a.num_positives[r] = label >= 0 ? upper - lower - (a.self_in_class ? 1 : 0) : 0;
    a.inv_norm[r] = scale;
    if (a.non_finite != nullptr && row.second > 0.0f) add_to(a.non_finite, 1);
  }
  if (a.class_sums != nullptr) add_row_to_class(a.class_sums, class_id, a.rows, r, a.d, scale, lane);
}

// ---- anchor_losses -----------------------------------------------------------------------------

struct AnchorLosses {
  Rows q;
  int64_t count, d;
  const float* q_inv_norm;     // [count]
  const float* class_sums;     // [classes, d]
  const int64_t* anchor_class;
  const int64_t* num_positives;
  const double* lse;
  KernelTemperature temperature;
  bool single_set;
  float* loss;                 // [count], or with mean_sums the mean (one value)
  // The mean's accumulators, float64 zeroed: the losses' sum, the anchors with positives, the
  // programs done (anchor_mean); null: per-anchor losses.
  double* mean_sums;
};

// The lane's share of u_i . (C_{y_i} - [single set] u_i).
SCL_HOST_DEVICE Partial anchor_loss_partial(const AnchorLosses& a, int64_t i, Lane lane) {
  const float scale = a.q_inv_norm[i];
  const float* target = a.class_sums + a.anchor_class[i] * a.d;
  Partial p;
  for (int64_t k = lane.index; k < a.d; k += lane.count) {
    const float unit = a.q.at(i, k) * scale;
    p.first += unit * (a.single_set ? target[k] - unit : target[k]);
  }
  return p;
}

// l_i in float64 from the row's total of anchor_loss_partial.
SCL_HOST_DEVICE double anchor_loss_value(const AnchorLosses& a, int64_t i, Partial row) {
  const int64_t positives = a.num_positives[i];
  return positives > 0
             ? a.lse[i] - double(row.first) * a.temperature.inverse() / double(positives)
             : 0.0;
}

SCL_HOST_DEVICE void anchor_loss_finish(const AnchorLosses& a, int64_t i, Lane lane, Partial row) {
  if (lane.leader()) a.loss[i] = float(anchor_loss_value(a, i, row));
}

// The mean once every row's loss is in mean_sums (the last program's step).
SCL_HOST_DEVICE float anchor_mean_of(const double* mean_sums) {
  return float(mean_sums[0] / fmax(mean_sums[1], 1.0));
}

// ---- anchor_weights ----------------------------------------------------------------------------

struct AnchorWeightTerms {
  const float* grad_loss;
  int64_t grad_stride;  // 0 for a mean's gradient, one value expanded
  // The forward's count of anchors with positives that divides a mean's gradient; null: none.
  const double* anchors_with_positives;
  const double* lse;
  const int64_t* num_positives;
  Rows q;
  int64_t count, d;
  const float* q_inv_norm;
  const int64_t* anchor_class;
  KernelTemperature temperature;
  bool symmetric;
  float* weight;         // [count]
  float* weighted_sums;  // [classes, d] zeroed, or null: not asked for
  float* coef;           // [count]
  float* lse_hi;         // [count] (plain schedule only)
  float* lse_lo;
};

// Nothing to sum first: the anchor's scalars, then its weighted unit row into its class's sum.
SCL_HOST_DEVICE Partial anchor_weight_partial(const AnchorWeightTerms&, int64_t, Lane) { return {}; }

SCL_HOST_DEVICE void anchor_weight_finish(const AnchorWeightTerms& a, int64_t i, Lane lane, Partial) {
  const int64_t positives = a.num_positives[i];
  float g = positives > 0 ? a.grad_loss[i * a.grad_stride] : 0.0f;
  // As autograd divided the mean's gradient: in float32.
  if (a.anchors_with_positives != nullptr) {
    g = divide_rn(g, float(fmax(*a.anchors_with_positives, 1.0)));
  }
  const float w = divide_rn(g, float(positives > 1 ? positives : 1));
  if (lane.leader()) {
    a.weight[i] = w;
    const double g64 = g, lse = a.lse[i], inv_t = a.temperature.inverse();
    if (a.symmetric) {
      // A zero-gradient row never evaluates exp(1/t - lse): its lse may be -inf.
      a.coef[i] = g64 != 0 ? float(g64 * exp(inv_t - lse) * inv_t) : 0.0f;
    } else {
      a.coef[i] = float(g64 * inv_t);
      // A row without columns (lse -inf) has coef 0 and never reads its lse: lo 0 there.
      const double bounded = lse > -INFINITY ? lse : 0.0;
      a.lse_hi[i] = float(lse);
      a.lse_lo[i] = float(bounded - double(float(bounded)));
    }
  }
  if (w != 0.0f && a.weighted_sums != nullptr) {
    add_row_to_class(a.weighted_sums, a.anchor_class[i], a.q, i, a.d, a.q_inv_norm[i] * w, lane);
  }
}

// ---- assemble_backward -------------------------------------------------------------------------

struct BackwardAssemblyTerms {
  Rows rows;
  int64_t count, d;
  const float* inv_norm;
  const float* grads;          // [count, d] with row stride grads_stride
  int64_t grads_stride;
  const float* extra;          // [anchor_count, d] contiguous, or null
  int64_t anchor_offset, anchor_count;
  const float* anchor_weight;  // [anchor_count], or null: no anchor part
  const int64_t* anchor_class;
  const float* class_sums;     // [classes, d]
  bool self_in_class;
  const int64_t* row_class;    // [count], or null: no contrast part
  const float* weighted_sums;  // [classes, d]
  // W_{c_r} = w_r C_{c_r} (tile_kernels.h): the class sum counts twice in the anchor part.
  bool class_shares_weight;
  KernelTemperature temperature;  // 1/t rounded to float once per row (assembly_row)
  bool normalize;
  float max_inv_norm;
  ElementType grad_type;       // the caller's dtype
  void* grad;                  // [count, d] contiguous
  float* unit_dot;             // [count]
};

SCL_HOST_DEVICE void store(ElementType type, void* data, int64_t i, float value) {
  switch (type) {
    case ElementType::kBFloat16: static_cast<uint16_t*>(data)[i] = float_to_bfloat16(value); break;
    case ElementType::kFloat16: static_cast<uint16_t*>(data)[i] = float_to_half(value); break;
    default: static_cast<float*>(data)[i] = value;
  }
}

// Where row r is an anchor, its index among the anchors, its anchor-side scale and class; its
// contrast-side class; 1/t in float, formed once per row.
struct AssemblyRow {
  int64_t anchor;
  bool is_anchor;
  float anchor_scale;
  int64_t anchor_class, row_class;
  float inv_t;
};

SCL_HOST_DEVICE AssemblyRow assembly_row(const BackwardAssemblyTerms& a, int64_t r) {
  const int64_t anchor = r - a.anchor_offset;
  const bool is_anchor = anchor >= 0 && anchor < a.anchor_count;
  const bool weighted = is_anchor && a.anchor_weight != nullptr;
  const float inv_t = float(a.temperature.inverse());
  return {anchor,
          is_anchor,
          weighted ? a.anchor_weight[anchor] * inv_t : 0.0f,
          weighted ? a.anchor_class[anchor] : 0,
          a.row_class != nullptr ? a.row_class[r] : 0,
          inv_t};
}

// The gradient w.r.t. unit row r at column k, and that unit row's element.
struct UnitGrad {
  float unit, grad;
};

SCL_HOST_DEVICE UnitGrad unit_grad(const BackwardAssemblyTerms& a, int64_t r, int64_t k,
                                   const AssemblyRow& row) {
  const float unit = a.rows.at(r, k) * a.inv_norm[r];
  float d = a.grads[r * a.grads_stride + k];
  if (row.is_anchor && a.extra != nullptr) d += a.extra[row.anchor * a.d + k];
  if (row.is_anchor && a.anchor_weight != nullptr) {
    float target = a.class_sums[row.anchor_class * a.d + k];
    if (a.class_shares_weight) target *= 2;
    // the anchor's own row: out of its class sum, and its own share as a column
    if (a.self_in_class) target -= 2 * unit;
    d -= row.anchor_scale * target;
  }
  if (a.row_class != nullptr) d -= row.inv_t * a.weighted_sums[row.row_class * a.d + k];
  return {unit, d};
}

// The lane's share of u_r . d_r, which the projection needs.
SCL_HOST_DEVICE Partial assemble_row_partial(const BackwardAssemblyTerms& a, int64_t r, Lane lane) {
  const AssemblyRow row = assembly_row(a, r);
  Partial p;
  for (int64_t k = lane.index; k < a.d; k += lane.count) {
    const UnitGrad u = unit_grad(a, r, k, row);
    p.first += u.unit * u.grad;
  }
  return p;
}

SCL_HOST_DEVICE void assemble_row_finish(const BackwardAssemblyTerms& a, int64_t r, Lane lane,
                                         Partial total) {
  const AssemblyRow row = assembly_row(a, r);
  const float dot = total.first;
  if (lane.leader()) a.unit_dot[r] = dot;
  const float scale = a.inv_norm[r];
  // Rows shorter than eps are divided by eps, a constant: scaled, not projected.
  const float radial = scale < a.max_inv_norm ? dot : 0.0f;
  for (int64_t k = lane.index; k < a.d; k += lane.count) {
    const UnitGrad u = unit_grad(a, r, k, row);
    store(a.grad_type, a.grad, r * a.d + k, a.normalize ? (u.grad - u.unit * radial) * scale : u.grad);
  }
}

// ---- the tiles' per-row terms -------------------------------------------------------------------
// What each kind of row holds (walk_terms.h names the slots), from its inverse norm r, the
// logit scale c = log2(e) / t and, in the backward, its coefficient and log-sum-exp; padded rows
// (past `rows`, up to `padded`) get the values that make them contribute exact zeros.

enum class TermsKind {
  kContrast,               // {r c, bias, r, 0}           padded {0, -inf, 0, 0}
  kLseAnchor,              // {r, 0, 0, 0}                 padded {0, +inf, 0, 0}
  kSymmetricGradOwn,       // {r, 0, 0, coef / c}          padded {0, +inf, 0, 0}
  kSymmetricGradStreamed,  // {r c, -c, 1 / r, coef r}     padded {0, -inf, 0, 0}
  kAnchorGrad,             // {r, lse2 hi, lse2 lo, coef}  padded {0, +inf, 0, 0}
  kAnchorGradStreamed,     // {r, lse2 hi, lse2 lo, coef r} padded {0, +inf, 0, 0}
};

struct TermsArray {
  TermsKind kind;
  int64_t rows, padded;
  const float* inv_norm;  // [rows]
  const float* coef;      // [rows], the backward's kinds
  const float* lse_hi;    // [rows] natural-log lse = hi + lo, the anchor kinds
  const float* lse_lo;
  float bias;             // kContrast: 0, or the fixed shift -c
  RowTerms* out;          // [padded]
};

// One launch writes one or two arrays (a walk's own and streamed rows), over the longer, and
// sets `zeroed` to 0: the accumulator that the tile kernel launched next adds into, zeroed here
// instead of by a launch of its own (thread j takes elements j, j + threads, ...: coalesced).
struct RowTermsArgs {
  KernelTemperature temperature;  // c = float(log2(e) / t), formed once per thread (logit_scale)
  TermsArray first, second;  // second.out null: one array
  float* zeroed = nullptr;   // [zeroed_count]
  int64_t zeroed_count = 0;
  int64_t launch_rows() const {
    return second.out != nullptr && second.padded > first.padded ? second.padded : first.padded;
  }
};

SCL_HOST_DEVICE RowTerms terms_of(const TermsArray& a, float c, int64_t j) {
  constexpr float inf = INFINITY;
  const bool past = j >= a.rows;
  switch (a.kind) {
    case TermsKind::kContrast: {
      if (past) return {0.0f, -inf, 0.0f, 0.0f};
      const float r = a.inv_norm[j];
      return {r * c, a.bias, r, 0.0f};
    }
    case TermsKind::kLseAnchor: return past ? RowTerms{0.0f, inf, 0.0f, 0.0f} : RowTerms{a.inv_norm[j], 0.0f, 0.0f, 0.0f};
    case TermsKind::kSymmetricGradOwn:
      if (past) return {0.0f, inf, 0.0f, 0.0f};
      return {a.inv_norm[j], 0.0f, 0.0f, divide_rn(a.coef[j], c)};
    case TermsKind::kSymmetricGradStreamed: {
      if (past) return {0.0f, -inf, 0.0f, 0.0f};
      const float r = a.inv_norm[j];
      return {r * c, -c, divide_rn(1.0f, r), a.coef[j] * r};
    }
    default: {  // the plain backward's anchors
      if (past) return {0.0f, inf, 0.0f, 0.0f};
      const float r = a.inv_norm[j], coef = a.coef[j];
      // The base-2 lse as a float pair; a row without gradient gets hi = +inf (weight 0).
      const tile_math::Lse2Split lse2 =
          tile_math::split_lse2(double(a.lse_hi[j]) + double(a.lse_lo[j]));
      return {r, coef != 0.0f ? lse2.hi : inf, lse2.lo,
              a.kind == TermsKind::kAnchorGrad ? coef : coef * r};
    }
  }
}

// c = log2(e) / t rounded to float, as the tile kernels take it (supcon_cuda.cpp's logit_scale
// for the host's own uses of c).
SCL_HOST_DEVICE float logit_scale(KernelTemperature temperature) {
  return float(temperature.inverse() * tile_math::kLog2e);
}

SCL_HOST_DEVICE void write_terms(const RowTermsArgs& a, int64_t j) {
  const float c = logit_scale(a.temperature);
  if (j < a.first.padded) a.first.out[j] = terms_of(a.first, c, j);
  if (a.second.out != nullptr && j < a.second.padded) a.second.out[j] = terms_of(a.second, c, j);
  const int64_t threads = a.launch_rows();
  for (int64_t e = j; e < a.zeroed_count; e += threads) a.zeroed[e] = 0.0f;
}

// ---- the forward's log-sum-exp -----------------------------------------------------------------
// From the tiles' base-2 partial sums, in float64 (docs/MATH.md section 6): the plain schedule's
// column splits ([splits, rows] running maxima and sums, rescaled to the largest), or the
// symmetric schedule's one sum per row under the fixed shift 1/t.

struct LseMerge {
  const float* part_max;  // [splits, rows]; null: the symmetric schedule
  const float* part_sum;  // [splits, rows], or the symmetric row sums [rows]
  int64_t rows;
  int splits;
  KernelTemperature temperature;
  double* lse;            // [rows]
};

SCL_HOST_DEVICE void merge_lse(const LseMerge& a, int64_t i) {
  if (a.part_max == nullptr) {
    // log(0) = -inf: a row without columns
    a.lse[i] = log(double(a.part_sum[i])) + a.temperature.inverse();
    return;
  }
  double top = -INFINITY;
  for (int s = 0; s < a.splits; ++s) top = fmax(top, double(a.part_max[s * a.rows + i]));
  const double shift = top > -INFINITY ? top : 0.0;
  double total = 0.0;
  for (int s = 0; s < a.splits; ++s) {
    total += double(a.part_sum[s * a.rows + i]) * exp2(double(a.part_max[s * a.rows + i]) - shift);
  }
  a.lse[i] = (shift + log2(total)) * tile_math::kLn2;
}

// ---- the stages as (partial, finish) pairs, for the warp kernel and the dry run ----------------

template <class A, Partial (*kPartial)(const A&, int64_t, Lane),
          void (*kFinish)(const A&, int64_t, Lane, Partial)>
struct WarpStage {
  using Args = A;
  SCL_HOST_DEVICE static Partial partial(const A& a, int64_t r, Lane lane) { return kPartial(a, r, lane); }
  SCL_HOST_DEVICE static void finish(const A& a, int64_t r, Lane lane, Partial total) {
    kFinish(a, r, lane, total);
  }
};
using PrepareRowsStage = WarpStage<RowPreparation, prepare_row_partial, prepare_row_finish>;
using AnchorLossesStage = WarpStage<AnchorLosses, anchor_loss_partial, anchor_loss_finish>;
using AnchorWeightsStage = WarpStage<AnchorWeightTerms, anchor_weight_partial, anchor_weight_finish>;
using AssemblyStage = WarpStage<BackwardAssemblyTerms, assemble_row_partial, assemble_row_finish>;

// ---- launches (row_stages.cu; the dry run's in csrc/cuda_dry_run) ------------------------------
// Each runs its stage on every row (a warp or a thread per row) on device.stream; none
// synchronises with the host.

void prepare_rows(const RowPreparation& a, const Device& device);
// Per-anchor losses, or with a.mean_sums their mean: a warp's rows' sums per block, added by
// one atomic each, the last block to finish storing the mean.
void anchor_losses(const AnchorLosses& a, const Device& device);
void anchor_weights(const AnchorWeightTerms& a, const Device& device);
void assemble_backward(const BackwardAssemblyTerms& a, const Device& device);
void row_terms(const RowTermsArgs& a, const Device& device);
void lse_merge(const LseMerge& a, const Device& device);

}  // namespace scl::cuda::row_stages

// CPU kernel of scl::hard_pairs: per anchor, the least similar positive and the most similar
// negative (docs/MATH.md, "Hard pairs"). One pass over the similarity matrix in tiles of
// kAnchorBlock x kContrastBlock: a BLAS product of raw rows, scaled by both rows' inverse norms,
// then a scan that keeps each anchor's running extremes. No N x N buffer: one tile per thread.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <limits>
#include <optional>
#include <vector>

#include "../core/tile_math.h"
#include "blas.h"

namespace scl::cpu {
namespace {

constexpr int64_t kAnchorBlock = 256;
constexpr int64_t kContrastBlock = 2048;
using tile_math::kNormEps;

std::string dtype_name(const at::Tensor& t) { return std::string(c10::toString(t.scalar_type())); }

// Shapes, dtypes and devices (values are the front end's: scl_kernels.hard_pairs checks them).
void check_rows(const at::Tensor& x, const char* name) {
  TORCH_CHECK_TYPE(at::isFloatingType(x.scalar_type()), name,
                   " must be a floating-point tensor, got ", dtype_name(x));
  TORCH_CHECK_VALUE(x.dim() == 2 && x.size(0) >= 1 && x.size(1) >= 1, name,
                    " must have shape [rows, dim] with at least one of each, got ", x.sizes());
}

void check_labels(const at::Tensor& y, const char* name, const at::Tensor& rows,
                  const char* rows_name) {
  TORCH_CHECK_TYPE(at::isIntegralType(y.scalar_type(), /*includeBool=*/false), name,
                   " must be an integer tensor, got ", dtype_name(y));
  TORCH_CHECK_VALUE(y.dim() == 1 && y.size(0) == rows.size(0), name, " must have shape [",
                    rows.size(0), "] (one label per row of ", rows_name, "), got ", y.sizes());
  TORCH_CHECK_VALUE(y.device() == rows.device(), name, " is on ", y.device(), " but ", rows_name,
                    " is on ", rows.device());
}

// One side of the problem as the tiles read it: rows in the compute dtype, their inverse norms
// (empty without normalisation) and labels as int64.
template <typename T>
struct Side {
  at::Tensor rows, inv_norm, labels;
  const T* row_data() const { return rows.const_data_ptr<T>(); }
  const T* inv_norm_data() const { return inv_norm.defined() ? inv_norm.const_data_ptr<T>() : nullptr; }
  const int64_t* label_data() const { return labels.const_data_ptr<int64_t>(); }
};

template <typename T>
Side<T> prepare_side(const at::Tensor& x, const at::Tensor& labels, bool normalize) {
  const at::ScalarType ct = c10::CppTypeToScalarType<T>::value;
  Side<T> side;
  side.rows = x.to(ct).contiguous();  // no copy for contiguous float32 / float64 rows
  if (normalize) {
    side.inv_norm = at::linalg_vector_norm(side.rows, 2, {1}, false, ct)
                        .clamp_min_(kNormEps).reciprocal_().contiguous();
  }
  side.labels = labels.to(at::kLong).contiguous();
  return side;
}

// A running extreme of one anchor: index -1 until a candidate is seen.
template <typename T>
struct Extreme {
  T value = 0;
  int64_t index = -1;
};

struct Outputs {
  at::Tensor positive_index, positive_similarity, negative_index, negative_similarity;
};

// Scans one tile (anchors a0.., candidates c0..) into the anchors' running extremes. Candidates
// come in increasing index order, so a strict comparison keeps the lowest index of a tie.
template <typename T>
void scan_tile(const T* tile, int64_t rows, int64_t cols, int64_t a0, int64_t c0,
               const Side<T>& q, const Side<T>& z, bool single_set, Extreme<T>* positive,
               Extreme<T>* negative) {
  const T* q_scale = q.inv_norm_data();
  const T* z_scale = z.inv_norm_data();
  const int64_t* q_label = q.label_data();
  const int64_t* z_label = z.label_data() + c0;
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t anchor = a0 + i;
    const int64_t label = q_label[anchor];
    const T row_scale = q_scale ? q_scale[anchor] : T(1);
    const T* dots = tile + i * cols;
    Extreme<T>& pos = positive[i];
    Extreme<T>& neg = negative[i];
    for (int64_t j = 0; j < cols; ++j) {
      const int64_t candidate = c0 + j;
      if (single_set && candidate == anchor) continue;
      const T similarity = z_scale ? dots[j] * row_scale * z_scale[candidate] : dots[j];
      if (label >= 0 && z_label[j] == label) {
        if (pos.index < 0 || similarity < pos.value) pos = {similarity, candidate};
      } else if (neg.index < 0 || similarity > neg.value) {
        neg = {similarity, candidate};
      }
    }
  }
}

template <typename T>
void write_extremes(const std::vector<Extreme<T>>& extremes, int64_t a0, at::Tensor& index,
                    at::Tensor& similarity) {
  int64_t* index_out = index.data_ptr<int64_t>() + a0;
  T* similarity_out = similarity.data_ptr<T>() + a0;
  for (size_t i = 0; i < extremes.size(); ++i) {
    index_out[i] = extremes[i].index;
    similarity_out[i] =
        extremes[i].index < 0 ? std::numeric_limits<T>::quiet_NaN() : extremes[i].value;
  }
}

template <typename T>
Outputs hard_pairs_typed(const at::Tensor& features, const at::Tensor& labels,
                         const std::optional<at::Tensor>& contrast,
                         const std::optional<at::Tensor>& contrast_labels, bool normalize) {
  TORCH_CHECK(blas_available(), "scl: this PyTorch build exports no BLAS; use backend='reference'");
  const bool single_set = !contrast.has_value();
  const Side<T> q = prepare_side<T>(features, labels, normalize);
  const Side<T> z = single_set ? q : prepare_side<T>(*contrast, *contrast_labels, normalize);
  const int64_t m = q.rows.size(0), n = z.rows.size(0), d = q.rows.size(1);
  const at::TensorOptions similarity_options = q.rows.options();
  Outputs out{at::empty({m}, similarity_options.dtype(at::kLong)), at::empty({m}, similarity_options),
              at::empty({m}, similarity_options.dtype(at::kLong)), at::empty({m}, similarity_options)};
  const int64_t anchor_blocks = (m + kAnchorBlock - 1) / kAnchorBlock;
  // Each anchor block belongs to one thread and its candidates are scanned in index order, so
  // the result does not depend on the thread count.
  at::parallel_for(0, anchor_blocks, 1, [&](int64_t begin, int64_t end) {
    std::vector<T> tile(kAnchorBlock * std::min(kContrastBlock, n));
    for (int64_t block = begin; block < end; ++block) {
      const int64_t a0 = block * kAnchorBlock, rows = std::min(kAnchorBlock, m - a0);
      std::vector<Extreme<T>> positive(rows), negative(rows);
      for (int64_t c0 = 0; c0 < n; c0 += kContrastBlock) {
        const int64_t cols = std::min(kContrastBlock, n - c0);
        gemm_row_major<T>(false, true, rows, cols, d, T(1), q.row_data() + a0 * d, d,
                          z.row_data() + c0 * d, d, T(0), tile.data(), cols);
        scan_tile(tile.data(), rows, cols, a0, c0, q, z, single_set, positive.data(),
                  negative.data());
      }
      write_extremes(positive, a0, out.positive_index, out.positive_similarity);
      write_extremes(negative, a0, out.negative_index, out.negative_similarity);
    }
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> hard_pairs(
    const at::Tensor& features, const at::Tensor& labels, const std::optional<at::Tensor>& contrast,
    const std::optional<at::Tensor>& contrast_labels, bool normalize) {
  check_rows(features, "features");
  check_labels(labels, "labels", features, "features");
  TORCH_CHECK_VALUE(contrast.has_value() == contrast_labels.has_value(),
                    "contrast and contrast_labels must be given together");
  if (contrast.has_value()) {
    check_rows(*contrast, "contrast");
    TORCH_CHECK_VALUE(contrast->device() == features.device(), "contrast is on ",
                      contrast->device(), " but features is on ", features.device());
    TORCH_CHECK_TYPE(contrast->scalar_type() == features.scalar_type(), "contrast has dtype ",
                     dtype_name(*contrast), " but features has ", dtype_name(features));
    TORCH_CHECK_VALUE(contrast->size(1) == features.size(1), "contrast has dimension ",
                      contrast->size(1), " but features has ", features.size(1));
    check_labels(*contrast_labels, "contrast_labels", *contrast, "contrast");
  }
  // 16-bit inputs compute in float32, float64 in float64.
  const Outputs out = features.scalar_type() == at::kDouble
      ? hard_pairs_typed<double>(features, labels, contrast, contrast_labels, normalize)
      : hard_pairs_typed<float>(features, labels, contrast, contrast_labels, normalize);
  return {out.positive_index, out.positive_similarity, out.negative_index,
          out.negative_similarity};
}

}  // namespace

TORCH_LIBRARY_IMPL(scl, CPU, m) { m.impl("hard_pairs", &hard_pairs); }

}  // namespace scl::cpu

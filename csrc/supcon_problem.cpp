#include "supcon_problem.h"

#include <c10/util/Exception.h>

#include <cmath>
#include <string>

namespace scl {
namespace {

constexpr double kNormEps = 1e-12;  // as torch.nn.functional.normalize

std::string dtype_name(const at::Tensor& t) { return std::string(c10::toString(t.scalar_type())); }

void check_features(const at::Tensor& x, const char* name) {
  TORCH_CHECK_TYPE(at::isFloatingType(x.scalar_type()),
                   name, " must be a floating-point tensor, got ", dtype_name(x));
  TORCH_CHECK_VALUE(x.dim() == 2, name, " must have shape [rows, dim], got ", x.dim(),
                    " dimensions");
  TORCH_CHECK_VALUE(x.size(0) >= 1, name, " must have at least one row");
  TORCH_CHECK_VALUE(x.size(1) >= 1, name, " must have at least one column");
}

void check_labels(const at::Tensor& y, const char* name, const at::Tensor& rows_of,
                  const char* rows_name) {
  TORCH_CHECK_TYPE(at::isIntegralType(y.scalar_type(), /*includeBool=*/false),
                   name, " must be an integer tensor, got ", dtype_name(y));
  TORCH_CHECK_VALUE(y.dim() == 1, name, " must be one-dimensional, got ", y.dim(), " dimensions");
  TORCH_CHECK_VALUE(y.size(0) == rows_of.size(0), name, " has ", y.size(0), " entries but ",
                    rows_name, " has ", rows_of.size(0), " rows");
  TORCH_CHECK_VALUE(y.device() == rows_of.device(), name, " is on ", y.device(), " but ",
                    rows_name, " is on ", rows_of.device());
}

void check_finite(const at::Tensor& x, const char* name) {
  TORCH_CHECK_VALUE(at::isfinite(x).all().item<bool>(), name, " contains NaN or inf");
}

// Rows, normalised or not, with the divisor used for each.
std::pair<at::Tensor, at::Tensor> unit_rows(const at::Tensor& x, at::ScalarType ct, bool normalize) {
  at::Tensor rows = x.to(ct).contiguous();
  if (!normalize) return {rows, at::ones({rows.size(0)}, rows.options())};
  at::Tensor scale = at::linalg_vector_norm(rows, 2, {1}).clamp_min(kNormEps);
  return {(rows / scale.unsqueeze(1)).contiguous(), scale};
}

}  // namespace

at::Tensor SupConProblem::positive_dots() const {
  at::Tensor targets = class_sums.index_select(0, anchor_class);
  if (single_set) targets = targets - self_positive.unsqueeze(1).to(targets.scalar_type()) * q;
  return (q * targets).sum(1);
}

SupConProblem prepare_problem(const at::Tensor& features, const at::Tensor& labels,
                              const std::optional<at::Tensor>& contrast,
                              const std::optional<at::Tensor>& contrast_labels,
                              const at::Tensor& temperature, int64_t num_anchors, bool normalize,
                              bool check_values) {
  check_features(features, "features");
  check_labels(labels, "labels", features, "features");
  TORCH_CHECK_VALUE(contrast.has_value() == contrast_labels.has_value(),
                    "contrast and contrast_labels must be given together");
  if (contrast.has_value()) {
    check_features(*contrast, "contrast");
    TORCH_CHECK_VALUE(contrast->device() == features.device(), "contrast is on ",
                      contrast->device(), " but features is on ", features.device());
    TORCH_CHECK_TYPE(contrast->scalar_type() == features.scalar_type(), "contrast has dtype ",
                     dtype_name(*contrast), " but features has ", dtype_name(features));
    TORCH_CHECK_VALUE(contrast->size(1) == features.size(1), "contrast has dimension ",
                      contrast->size(1), " but features has ", features.size(1));
    check_labels(*contrast_labels, "contrast_labels", *contrast, "contrast");
    TORCH_CHECK_VALUE(num_anchors == features.size(0),
                      "num_anchors must equal the number of feature rows with a contrast set");
  } else {
    TORCH_CHECK_VALUE(num_anchors >= 1 && num_anchors <= features.size(0),
                      "num_anchors must lie in [1, ", features.size(0), "], got ", num_anchors);
  }
  TORCH_CHECK_TYPE(at::isFloatingType(temperature.scalar_type()),
                   "temperature must be a floating-point tensor, got ", dtype_name(temperature));
  TORCH_CHECK_VALUE(temperature.numel() == 1, "temperature must hold one value, got ",
                    temperature.numel());
  const double t = temperature.item<double>();
  TORCH_CHECK_VALUE(std::isfinite(t) && t > 0, "temperature must be positive and finite, got ", t);
  if (check_values) {
    check_finite(features, "features");
    if (contrast.has_value()) check_finite(*contrast, "contrast");
  }

  SupConProblem p;
  p.single_set = !contrast.has_value();
  p.normalize = normalize;
  p.temperature = t;
  p.d = features.size(1);
  const at::ScalarType ct =
      features.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  std::tie(p.z, p.z_scale) = unit_rows(p.single_set ? features : *contrast, ct, normalize);
  p.n = p.z.size(0);
  if (p.single_set) {
    p.m = num_anchors;
    p.q = p.z.narrow(0, 0, p.m);
    p.q_scale = p.z_scale.narrow(0, 0, p.m);
  } else {
    std::tie(p.q, p.q_scale) = unit_rows(features, ct, normalize);
    p.m = p.q.size(0);
  }

  // Compact class ids so that class sums need only as many rows as there are distinct labels.
  at::Tensor all_labels = p.single_set ? labels.to(at::kLong)
                                       : at::cat({labels.to(at::kLong), contrast_labels->to(at::kLong)});
  at::Tensor ids = std::get<1>(at::_unique(all_labels.clamp_min(-1), /*sorted=*/true,
                                           /*return_inverse=*/true));
  at::Tensor valid = all_labels >= 0;
  const int64_t contrast_offset = p.single_set ? 0 : p.m;
  p.anchor_class = ids.narrow(0, 0, p.m);
  p.anchor_valid = valid.narrow(0, 0, p.m);
  p.contrast_class = ids.narrow(0, contrast_offset, p.n);
  p.contrast_valid = valid.narrow(0, contrast_offset, p.n);

  const int64_t classes = ids.numel() == 0 ? 0 : ids.max().item<int64_t>() + 1;
  at::Tensor counts = at::zeros({classes}, ids.options())
                          .index_add_(0, p.contrast_class, p.contrast_valid.to(at::kLong));
  p.class_sums = at::zeros({classes, p.d}, p.z.options())
                     .index_add_(0, p.contrast_class, p.z * p.contrast_valid.unsqueeze(1).to(ct));
  p.self_positive = p.single_set ? p.anchor_valid : at::zeros({p.m}, valid.options());
  p.num_positives = at::where(p.anchor_valid,
                              counts.index_select(0, p.anchor_class) - p.self_positive.to(at::kLong),
                              at::zeros({}, counts.options()));
  return p;
}

at::Tensor anchor_losses(const SupConProblem& p, const at::Tensor& lse) {
  at::Tensor has_positive = p.num_positives > 0;
  at::Tensor mean_positive =
      p.positive_dots() / (p.temperature * p.num_positives.clamp_min(1).to(lse.scalar_type()));
  return at::where(has_positive, lse - mean_positive, at::zeros({}, lse.options()));
}

at::Tensor effective_anchor_grads(const SupConProblem& p, const at::Tensor& grad_loss) {
  TORCH_CHECK_VALUE(grad_loss.dim() == 1 && grad_loss.size(0) == p.m,
                    "grad_loss must have shape [", p.m, "], got ", grad_loss.sizes());
  at::Tensor g = grad_loss.to(p.z.scalar_type());
  return at::where(p.num_positives > 0, g, at::zeros({}, g.options())).contiguous();
}

void add_positive_grads(const SupConProblem& p, const at::Tensor& g, at::Tensor& dq, at::Tensor& dz) {
  const double inv_t = 1.0 / p.temperature;
  at::Tensor w = (g / p.num_positives.clamp_min(1).to(g.scalar_type())).unsqueeze(1);
  at::Tensor row_targets = p.class_sums.index_select(0, p.anchor_class);
  if (p.single_set) row_targets = row_targets - p.self_positive.unsqueeze(1).to(g.scalar_type()) * p.q;
  dq.sub_(w * row_targets, inv_t);

  at::Tensor weighted_anchors = at::zeros_like(p.class_sums).index_add_(0, p.anchor_class, w * p.q);
  dz.sub_(weighted_anchors.index_select(0, p.contrast_class) *
              p.contrast_valid.unsqueeze(1).to(g.scalar_type()),
          inv_t);
  if (p.single_set) {
    dz.narrow(0, 0, p.m).add_(w * p.self_positive.unsqueeze(1).to(g.scalar_type()) * p.q, inv_t);
  }
}

at::Tensor normalize_backward(const SupConProblem& p, const at::Tensor& z, const at::Tensor& scale,
                              const at::Tensor& dz, at::ScalarType out_dtype) {
  if (!p.normalize) return dz.to(out_dtype);
  // Below eps the divisor is a constant and the gradient is no projection.
  at::Tensor radial = at::where(scale > kNormEps, (z * dz).sum(1), at::zeros({}, dz.options()));
  return ((dz - z * radial.unsqueeze(1)) / scale.unsqueeze(1)).to(out_dtype);
}

at::Tensor temperature_grad(const SupConProblem& p, const at::Tensor& anchor_dot,
                            const at::Tensor& temperature) {
  return (anchor_dot * (-1.0 / p.temperature)).to(temperature.scalar_type()).reshape(temperature.sizes()).to(temperature.device());
}

}  // namespace scl

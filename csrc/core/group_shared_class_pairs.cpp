#include "group_shared_class_pairs.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <limits>

#include "class_overlap_products.h"
#include "supcon_problem.h"

namespace scl::group_shared_class_pairs {
namespace {

constexpr double kMinusInf = -std::numeric_limits<double>::infinity();

// The unit rows in float32, as the blocks' products take them.
std::pair<at::Tensor, at::Tensor> unit_rows(const SupConProblem& p) {
  return {p.unit(Rows::kAnchors, 0, p.m).to(at::kFloat),
          p.unit(Rows::kContrast, 0, p.n).to(at::kFloat)};
}

// visit(i0, rows, j0, cols, logits, in_g) for each block of pairs: s_ij / t in float64 (from
// the unit rows u, v) and whether j is in G(i) (one group, a shared class, not the anchor's own
// row).
template <typename Visit>
void for_each_block(const SupConProblem& p, const at::Tensor& u, const at::Tensor& v,
                    Visit&& visit) {
  class_overlaps::for_each_weight_block(
      p, [&](int64_t i0, int64_t rows, int64_t j0, int64_t cols, const at::Tensor& w) {
        const at::Tensor anchor_group = p.anchor_group.narrow(0, i0, rows).unsqueeze(1);
        const at::Tensor contrast_group = p.contrast_group.narrow(0, j0, cols).unsqueeze(0);
        const at::Tensor in_g = (w > 0)
                                    .logical_and_(anchor_group >= 0)
                                    .logical_and_(anchor_group == contrast_group);
        at::Tensor logits =
            at::mm(u.narrow(0, i0, rows), v.narrow(0, j0, cols).t()).to(at::kDouble);
        visit(i0, rows, j0, cols, p.temperature.divide(logits), in_g);
      });
}

}  // namespace

bool apply(const SupConProblem& p) {
  return p.multi_label != MultiLabelRule::kNone && p.anchor_group.defined();
}

std::pair<at::Tensor, at::Tensor> own_pair_classes(const SupConProblem& p) {
  const at::TensorOptions options = p.z.options().dtype(at::kInt);
  const at::Tensor contrast = -2 - at::arange(p.n, options) - (p.single_set ? 0 : p.m);
  const at::Tensor anchors = p.single_set ? contrast.narrow(0, p.anchor_offset, p.m)
                                          : -2 - at::arange(p.m, options);
  return {anchors, contrast};
}

at::Tensor add_to_lse(const SupConProblem& p, const at::Tensor& lse) {
  const auto [u, v] = unit_rows(p);
  at::Tensor added = at::full({p.m}, kMinusInf, lse.options());
  for_each_block(p, u, v, [&](int64_t i0, int64_t rows, int64_t, int64_t, at::Tensor& logits,
                              const at::Tensor& in_g) {
    const at::Tensor block = at::logsumexp(logits.masked_fill_(in_g.logical_not(), kMinusInf), 1);
    at::Tensor part = added.narrow(0, i0, rows);
    part.copy_(at::logaddexp(part, block));
  });
  return at::logaddexp(lse, added);
}

std::pair<at::Tensor, at::Tensor> softmax_grads(const SupConProblem& p, const at::Tensor& lse,
                                                const at::Tensor& g) {
  const auto [u, v] = unit_rows(p);
  const at::TensorOptions f64 = lse.options();
  at::Tensor dq = at::zeros({p.m, p.d}, f64), dz = at::zeros({p.n, p.d}, f64);
  for_each_block(p, u, v, [&](int64_t i0, int64_t rows, int64_t j0, int64_t cols,
                              at::Tensor& logits, const at::Tensor& in_g) {
    // g_i p_ij on G(i), 0 elsewhere: float32 products, as the tiles'
    const at::Tensor weights =
        at::where(in_g, (logits - lse.narrow(0, i0, rows).unsqueeze(1)).exp_(), 0.0)
            .mul_(g.narrow(0, i0, rows).unsqueeze(1))
            .to(at::kFloat);
    dq.narrow(0, i0, rows).add_(at::mm(weights, v.narrow(0, j0, cols)));
    dz.narrow(0, j0, cols).add_(at::mm(weights.t(), u.narrow(0, i0, rows)));
  });
  return {p.temperature.divide(dq), p.temperature.divide(dz)};
}

}  // namespace scl::group_shared_class_pairs

#include "weight_product_walk.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "supcon_problem.h"

namespace scl {

PositiveWalkOutputs walk_by_weight_products(const SupConProblem& p, const PositiveWalkInputs& walk,
                                            const WeightProducts& products) {
  TORCH_CHECK(walk.gamma == 0, "walk_by_weight_products: the focal loss's terms are per pair");
  const at::ScalarType ct = walk.lse_hi.scalar_type();
  const at::Tensor u = p.unit(Rows::kAnchors, 0, p.m).to(at::kDouble);
  const at::Tensor v = p.unit(Rows::kContrast, 0, p.n).to(at::kDouble);
  const at::Tensor walked = (walk.anchor_class >= 0).unsqueeze(1);
  const at::Tensor none = at::empty({0}, walk.lse_hi.options());
  const bool backward = walk.grad_weight.numel() != 0;
  // a_i, 0 where not walked, and a_i u_i: the anchors as the transpose product weighs them
  at::Tensor a, weighted;
  if (backward) {
    a = at::where(walked, walk.grad_weight.to(at::kDouble).unsqueeze(1), 0.0);
    weighted = u * a;
  }
  auto [positive_sums, transposed] = products(v, weighted);
  positive_sums.masked_fill_(walked.logical_not(), 0.0);
  if (!backward) {
    // sum_p w_ip (lse_i - s_ip) = W_i lse_i - (1/t) u_i . sum_p w_ip u_p
    at::Tensor dots = (u * positive_sums).sum(1);
    const at::Tensor lse = walk.lse_hi.to(at::kDouble) + walk.lse_lo.to(at::kDouble);
    const at::Tensor loss = p.positive_weight * lse - p.temperature.divide(dots);
    return {at::where(walked.squeeze(1), loss, 0.0).to(ct), none, none, none};
  }
  at::Tensor dq = positive_sums.mul_(a).neg_();
  at::Tensor dz = transposed.neg_();
  const at::Tensor hterm = at::where(walked.squeeze(1), p.positive_weight, 0.0);
  return {none, hterm.to(ct), p.temperature.divide(dq).to(ct), p.temperature.divide(dz).to(ct)};
}

}  // namespace scl

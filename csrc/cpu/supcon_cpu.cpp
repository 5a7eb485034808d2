// CPU backend of scl::supcon: the device-generic O(N*D) terms of supcon_problem.cpp plus the
// fused tile kernels of supcon_tiles.cpp.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <tuple>

#include "../supcon_problem.h"
#include "blas.h"
#include "supcon_tiles.h"

namespace scl::cpu {
namespace {

template <typename T>
TileProblem<T> tile_problem(const SupConProblem& p) {
  return {p.q.data_ptr<T>(), p.m, p.z.data_ptr<T>(), p.n, p.d, p.single_set,
          static_cast<T>(1.0 / p.temperature)};
}

// Single set with every row an anchor is symmetric (S = S^T); the fixed shift 1/t it needs is
// exact only for unit rows and a temperature inside the exp range.
template <typename T>
bool use_symmetric(const SupConProblem& p) {
  return p.single_set && p.m == p.n && p.normalize &&
         fixed_shift_is_safe(static_cast<T>(1.0 / p.temperature));
}

void check_cpu(const at::Tensor& features) {
  TORCH_CHECK(blas_available(), "scl: this PyTorch build exports no BLAS; use backend='reference'");
  TORCH_CHECK_VALUE(features.device().is_cpu(), "the CPU kernel got features on ", features.device());
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> supcon_cpu(
    const at::Tensor& features, const at::Tensor& labels, const std::optional<at::Tensor>& contrast,
    const std::optional<at::Tensor>& contrast_labels, const at::Tensor& temperature,
    int64_t num_anchors, bool normalize) {
  check_cpu(features);
  const SupConProblem p = prepare_problem(features, labels, contrast, contrast_labels, temperature,
                                          num_anchors, normalize, /*check_values=*/true);
  at::Tensor lse = at::empty({p.m}, p.z.options());
  AT_DISPATCH_FLOATING_TYPES(p.z.scalar_type(), "supcon_cpu", [&] {
    if (use_symmetric<scalar_t>(p)) {
      lse_symmetric<scalar_t>(p.z.data_ptr<scalar_t>(), p.n, p.d,
                              static_cast<scalar_t>(1.0 / p.temperature), lse.data_ptr<scalar_t>());
    } else {
      lse_plain<scalar_t>(tile_problem<scalar_t>(p), lse.data_ptr<scalar_t>());
    }
  });
  return {anchor_losses(p, lse), lse, p.num_positives};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> supcon_backward_cpu(
    const at::Tensor& grad_loss, const at::Tensor& features, const at::Tensor& labels,
    const std::optional<at::Tensor>& contrast, const std::optional<at::Tensor>& contrast_labels,
    const at::Tensor& temperature, int64_t num_anchors, bool normalize, const at::Tensor& lse) {
  check_cpu(features);
  const SupConProblem p = prepare_problem(features, labels, contrast, contrast_labels, temperature,
                                          num_anchors, normalize, /*check_values=*/false);
  TORCH_CHECK_VALUE(lse.dim() == 1 && lse.size(0) == p.m, "lse must have shape [", p.m, "]");
  const at::Tensor g = effective_anchor_grads(p, grad_loss);
  const at::Tensor lse_c = lse.to(p.z.scalar_type()).contiguous();
  at::Tensor dz = at::zeros({p.n, p.d}, p.z.options());
  at::Tensor dq;
  at::Tensor anchor_dot;
  AT_DISPATCH_FLOATING_TYPES(p.z.scalar_type(), "supcon_backward_cpu", [&] {
    const auto inv_t = static_cast<scalar_t>(1.0 / p.temperature);
    if (use_symmetric<scalar_t>(p)) {
      grad_symmetric<scalar_t>(p.z.data_ptr<scalar_t>(), p.n, p.d, inv_t, lse_c.data_ptr<scalar_t>(),
                               g.data_ptr<scalar_t>(), dz.data_ptr<scalar_t>());
      dq = dz;  // both sides already summed into one buffer
      add_positive_grads(p, g, dq, dz);
      // sum_i z_i . dz_i counts every G_ij s_ij twice, once per side (S is symmetric).
      anchor_dot = (p.z * dz).sum() * 0.5;
    } else {
      dq = at::zeros({p.m, p.d}, p.z.options());
      grad_plain<scalar_t>(tile_problem<scalar_t>(p), lse_c.data_ptr<scalar_t>(),
                           g.data_ptr<scalar_t>(), dq.data_ptr<scalar_t>(), dz.data_ptr<scalar_t>());
      add_positive_grads(p, g, dq, dz);
      anchor_dot = (p.q * dq).sum();
      if (p.single_set) dz.narrow(0, 0, p.m).add_(dq);
    }
  });
  const at::Tensor grad_t = temperature_grad(p, anchor_dot, temperature);
  if (p.single_set) {
    return {normalize_backward(p, p.z, p.z_scale, dz, features.scalar_type()),
            at::empty({0, p.d}, features.options()), grad_t};
  }
  return {normalize_backward(p, p.q, p.q_scale, dq, features.scalar_type()),
          normalize_backward(p, p.z, p.z_scale, dz, contrast->scalar_type()), grad_t};
}

}  // namespace

TORCH_LIBRARY_IMPL(scl, CPU, m) {
  m.impl("supcon", &supcon_cpu);
  m.impl("supcon_backward", &supcon_backward_cpu);
}

}  // namespace scl::cpu

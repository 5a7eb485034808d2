// Device-generic ATen half of the op: argument checks, normalisation, labels, and every O(N*D)
// term of the loss and its gradient (positives through class sums, KERNEL_MATH.md section 1;
// normalisation and temperature gradients, section 3). A backend only adds the tiled
// log-sum-exp and its gradient.
#pragma once

#include <ATen/ATen.h>

#include <optional>

namespace scl {

// The loss of one call, in the compute dtype (float32 for 16-bit inputs) and laid out for the
// tile kernels: anchors q[m, d] against contrast rows z[n, d].
struct SupConProblem {
  bool single_set;   // contrast is the features themselves; anchor i's self column is i
  bool normalize;
  double temperature;
  int64_t m, n, d;
  at::Tensor q, z;                        // contiguous rows after normalisation; q aliases z in single set
  at::Tensor q_scale, z_scale;            // max(||x||, eps) per row (ones without normalisation)
  at::Tensor anchor_class, contrast_class;  // compact class ids, valid where the *_valid masks say
  at::Tensor anchor_valid, contrast_valid;  // label >= 0: the row belongs to a class
  at::Tensor class_sums;                  // [classes, d] sums of contrast rows per class
  at::Tensor self_positive;               // [m] the self column would be a positive (excluded)
  at::Tensor num_positives;               // [m] int64, |P(i)|

  // Raw dot q_i . (C_{y_i} - [self] z_i): the sum of anchor i's positive logits times t.
  at::Tensor positive_dots() const;
};

// Validates the op's arguments (TypeError / ValueError naming the argument) and prepares them.
// The scan for NaN / inf reads every input once: forward does it, backward (same inputs) skips it.
SupConProblem prepare_problem(const at::Tensor& features, const at::Tensor& labels,
                              const std::optional<at::Tensor>& contrast,
                              const std::optional<at::Tensor>& contrast_labels,
                              const at::Tensor& temperature, int64_t num_anchors, bool normalize,
                              bool check_values);

// Per-anchor loss l_i from the log-sum-exp: float32 (float64 for float64 inputs), 0 without positives.
at::Tensor anchor_losses(const SupConProblem& p, const at::Tensor& lse);

// g_i masked to anchors that carry a loss, in the compute dtype.
at::Tensor effective_anchor_grads(const SupConProblem& p, const at::Tensor& grad_loss);

// Adds the positive-pair part of the gradient: dq[m, d] and dz[n, d] are the gradients w.r.t.
// the normalised anchors and contrast rows (the same buffer's rows in single set is fine).
void add_positive_grads(const SupConProblem& p, const at::Tensor& g, at::Tensor& dq, at::Tensor& dz);

// dx from dz through z = x / max(||x||, eps); identity without normalisation.
at::Tensor normalize_backward(const SupConProblem& p, const at::Tensor& z, const at::Tensor& scale,
                              const at::Tensor& dz, at::ScalarType out_dtype);

// dLoss/dt from sum_ij G_ij s_ij; `anchor_dot` is sum_i q_i . dq_i over the anchor-side gradient.
at::Tensor temperature_grad(const SupConProblem& p, const at::Tensor& anchor_dot,
                            const at::Tensor& temperature);

}  // namespace scl

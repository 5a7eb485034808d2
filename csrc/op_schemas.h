// The fused ops' schemas after their names, shared by the product library (scl_ops.cpp) and the
// test builds' ops (csrc/testing), which define ops of the same signatures under other names.
#pragma once

#include <string>

namespace scl {

// Per-anchor SupCon loss. Single set (contrast None): the anchors are rows
// [anchor_offset, anchor_offset + num_anchors) of features, the contrast set is every row, and
// anchor i never sees its own row. Cross set: the anchors are all feature rows, the contrast set
// is `contrast`, no self column (anchor_offset 0). Returns the loss per anchor (0 for anchors
// without positives), the float64 log-sum-exp per anchor that backward needs, and |P(i)|.
// focal_gamma > 0: the focal contrastive loss, (1/|P(i)|) sum_p (1 - pi_ip)^gamma (-log pi_ip)
// (docs/MATH.md, "Focal contrastive loss"); 0 is SupCon.
inline const std::string kForward =
    "(Tensor features, Tensor labels, Tensor? contrast, Tensor? contrast_labels, "
    "Tensor temperature, int num_anchors, bool normalize, int anchor_offset=0, "
    "float focal_gamma=0.0, bool mean=False) -> "
    "(Tensor loss, Tensor lse, Tensor num_positives)";
// Gradients w.r.t. features, contrast ([0, D] without a contrast set) and temperature (zeros
// when temperature_grad is false: autograd asks only when the temperature requires grad).
inline const std::string kBackward =
    "(Tensor grad_loss, Tensor features, Tensor labels, Tensor? contrast, "
    "Tensor? contrast_labels, Tensor temperature, int num_anchors, bool normalize, Tensor lse, "
    "int anchor_offset=0, bool temperature_grad=True, float focal_gamma=0.0, bool mean=False) -> "
    "(Tensor grad_features, Tensor grad_contrast, Tensor grad_temperature)";
// Per anchor (every feature row), its hardest positive (least similar row of its label) and
// hardest negative (most similar row of another label): index (-1 for none) and cosine
// similarity (dot product without normalize; NaN for none), ties to the lowest index. Single set:
// the candidates are the other feature rows; cross set: the contrast rows. No gradient; values
// are not checked here (scl_kernels.hard_pairs does). docs/MATH.md, "Hard pairs".
inline const std::string kHardPairs =
    "(Tensor features, Tensor labels, Tensor? contrast, Tensor? contrast_labels, "
    "bool normalize) -> (Tensor positive_index, Tensor positive_similarity, "
    "Tensor negative_index, Tensor negative_similarity)";
// The plan of a call (csrc/core/call_plan.h): the forward's arguments, its description.
inline const std::string kPlan =
    "(Tensor features, Tensor labels, Tensor? contrast, Tensor? contrast_labels, "
    "Tensor temperature, int num_anchors, bool normalize, int anchor_offset=0, "
    "float focal_gamma=0.0, bool mean=False) -> str";

}  // namespace scl

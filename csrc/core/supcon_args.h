// The op's arguments, as the schema in csrc/op_schemas.h names them.
#pragma once

#include <ATen/ATen.h>

#include <optional>

namespace scl {

struct SupConArgs {
  const at::Tensor& features;
  const at::Tensor& labels;
  const std::optional<at::Tensor>& contrast;
  const std::optional<at::Tensor>& contrast_labels;
  const at::Tensor& temperature;
  int64_t num_anchors;
  bool normalize;
  int64_t anchor_offset;
  double focal_gamma;  // 0: SupCon; > 0: the focal contrastive loss
  // The loss is the mean of l_i over the anchors with positives (0-dim), the caller's "mean"
  // reduction inside the op; backward then takes its 0-dim gradient.
  bool mean;
};

}  // namespace scl

// The walk over the positive pairs on the CPU, for the focal loss and multi-hot labels:
// TileKernels::positive_walk and TileKernels::multi_label_positives
// (csrc/core/tile_kernels.h; docs/MATH.md, "Focal contrastive loss").
#pragma once

#include "../core/tile_kernels.h"

namespace scl::cpu {

PositiveWalkOutputs positive_walk(const SupConProblem& p, const PositiveWalkInputs& walk);

MultiLabelPositives multi_label_positives(const SupConProblem& p);

}  // namespace scl::cpu

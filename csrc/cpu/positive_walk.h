// The focal loss's walk over the positive pairs on the CPU: TileKernels::positive_walk
// (csrc/core/tile_kernels.h; docs/MATH.md, "Focal contrastive loss").
#pragma once

#include "../core/tile_kernels.h"

namespace scl::cpu {

PositiveWalkOutputs positive_walk(const SupConProblem& p, const PositiveWalkInputs& walk);

}  // namespace scl::cpu

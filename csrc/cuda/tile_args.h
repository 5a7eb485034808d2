// What the CUDA tile kernels read and write: plain pointers and sizes, no torch, no CUDA headers
// (the ATen glue, supcon_cuda.cpp, fills them; the kernels, *.cu, read them).
//
// Every kernel walks one block of "own" rows against tiles of "streamed" rows, forming base-2
// logits s2 = dot(own, streamed) * r_i * (r_j log2(e) / t) + bias (csrc/core/tile_math.h) whose
// factors and bias are per-row terms (RowTerms below); the glue pads the streamed
// terms to a whole tile with values that make the padded rows contribute exact zeros, so the
// kernels load them without masks.
#pragma once

#include <cstdint>

#include "../core/tile_math.h"

namespace scl::cuda {

enum class ElementType { kBFloat16, kFloat16, kFloat32 };

// Four per-row numbers, 16 bytes, one vector load. What they hold depends on the walk and the
// side: walk_terms.h names them per kind of row (the views' fields are in slot order x, y, z,
// w) and is what the glue's columns must follow.
struct RowTerms {
  float x, y, z, w;
};

// Row-major [rows, width] rows of the input dtype: width is D rounded up to 16 bytes, the columns
// past D are zero, the base is 16-byte aligned (the glue pads when the caller's rows are not).
struct RowMatrix {
  const void* data;
  int64_t rows;
  int64_t stride;  // elements between rows (a multiple of 16 bytes)
};

struct TileProblem {
  ElementType type;
  int64_t d;           // columns that count (D rounded up to 16 bytes; the rest is zero)
  RowMatrix own;       // the program's rows
  RowMatrix streamed;  // the tiles' rows
  const RowTerms* own_terms;
  const RowTerms* streamed_terms;  // padded to a multiple of kTermsPadding rows
  // Anchor i's self column is column i + self_offset (masked); < 0: none. Own rows are the
  // anchors, except in grad_cols, whose own rows are columns and whose streamed rows are anchors.
  int64_t self_offset;
  // The group mask's ids of the own and streamed rows (tile_math::GroupId), padded like the
  // terms with rows of no group; both null for a call without groups, whose kernels are the ones
  // compiled without the mask.
  const tile_math::GroupId* own_groups;
  const tile_math::GroupId* streamed_groups;
};

// Two 128-row blocks: the symmetric backward's cluster pairs an odd last block with a block of
// padding rows (tile_math::pair_triangle_tiles), whose terms it loads like any other.
constexpr int64_t kTermsPadding = 256;

// What a walk writes; each walk uses some of these and the rest are null.
struct WalkOutputs {
  float* part_max;  // lse_plain: [num_splits, own rows] base-2 running max and sum
  float* part_sum;
  float* row_sum;   // lse_symmetric (the sm_90a walk): row sums, added by atomics
  float* grad;      // grad walks: [own rows, grad_columns] fp32; the triangle adds into
                    // [own rows rounded up to kTermsPadding, 128]
  int64_t grad_columns;
  int num_splits;   // the lse walks' and the triangle's splits of the streamed tiles (grid.y)
};

}  // namespace scl::cuda

// Chooses the kernel family and the column splits for a launch (launch.h).
#include "launch.h"

#include <algorithm>

#include "families.h"

namespace scl::cuda {
namespace {

int64_t blocks(int64_t rows, int64_t block) { return (rows + block - 1) / block; }

// Splits of the column tiles so that about two programs per SM run: few row blocks (small N, or
// few anchors) would otherwise leave most of the GPU idle. At most one split per column tile.
int splits_for(int64_t programs, int64_t column_tiles, const Device& device) {
  const int64_t wanted = blocks(2 * int64_t(device.sm_count), std::max<int64_t>(programs, 1));
  return int(std::clamp<int64_t>(wanted, 1, std::max<int64_t>(column_tiles, 1)));
}

}  // namespace

int lse_plain_splits(const TileProblem& p, const Device& device) {
  const bool wide = sm90::supports(p, device);
  const int64_t rows = wide ? sm90::kLseBlockRows : sm80::kLseBlockRows;
  return splits_for(blocks(p.own.rows, rows), blocks(p.streamed.rows, rows), device);
}

void lse_plain(const TileProblem& p, float* part_max, float* part_sum, int num_splits,
               const Device& device) {
  if (sm90::supports(p, device)) {
    sm90::lse_plain(p, part_max, part_sum, num_splits, device.stream);
  } else {
    sm80::lse_plain(p, part_max, part_sum, num_splits, device.stream);
  }
}

void lse_symmetric(const TileProblem& p, float* row_sum, const Device& device) {
  if (sm90::supports(p, device)) {
    // One program per row block I, walking J = I .. nb - 1.
    const int64_t nb = blocks(p.streamed.rows, sm90::kLseBlockRows);
    sm90::lse_symmetric(p, row_sum, splits_for(nb, nb, device), device.stream);
  } else {
    // Paired row blocks: (nb + 1) / 2 programs of nb + 1 tiles.
    const int64_t nb = blocks(p.streamed.rows, sm80::kLseBlockRows);
    sm80::lse_symmetric(p, row_sum, splits_for((nb + 1) / 2, nb + 1, device), device.stream);
  }
}

void grad(GradWalk walk, const TileProblem& p, float* grad, int64_t grad_columns,
          const Device& device) {
  if (sm90::supports(p, device)) {
    sm90::grad(walk, p, grad, grad_columns, device.stream);
  } else {
    sm80::grad(walk, p, grad, grad_columns, device.stream);
  }
}

bool symmetric_triangle_supported(const TileProblem& p, const Device& device) {
  return sm90::supports(p, device) && sm90::supports_triangle(p);
}

void grad_symmetric_triangle(TriangleExchange exchange, const TileProblem& p, float* grad,
                             const Device& device) {
  // Cluster pairs of row blocks; pair p walks nb - 2p tiles, so few blocks split their walks.
  const int64_t nb = blocks(p.streamed.rows, sm90::kLseBlockRows);
  sm90::grad_triangle(exchange, p, grad, splits_for(nb + nb % 2, nb, device), device.stream);
}

}  // namespace scl::cuda

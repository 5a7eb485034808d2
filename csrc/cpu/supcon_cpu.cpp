// CPU backend of scl::supcon: the shared core (csrc/core) with the fused tile kernels of
// supcon_tiles.h, in the instruction set this CPU runs. The tiles multiply through BLAS, so they
// read float32 / float64 unit rows: this file makes that copy (16-bit inputs compute in float32).
#include <ATen/ATen.h>
#include <torch/library.h>

#include "../core/supcon_orchestration.h"
#include "../core/supcon_problem.h"
#include "../core/test_hooks.h"
#include "blas.h"
#include "positive_walk.h"
#include "supcon_tiles.h"

namespace scl::cpu {
namespace {

at::ScalarType compute_type(at::ScalarType input) {
  return input == at::kDouble ? at::kDouble : at::kFloat;
}

// The tiles' operands: unit rows in the compute dtype, q a view of z's rows in single set, and
// the class words of multi-hot rows, contiguous, where the group mask compares them.
struct UnitRows {
  at::Tensor q, z;
  at::Tensor q_words, z_words;
};

UnitRows unit_rows(const SupConProblem& p) {
  const at::ScalarType ct = compute_type(p.z.scalar_type());
  auto unit = [&](const at::Tensor& rows, const at::Tensor& inv_norm) {
    return (rows.to(ct) * inv_norm.to(ct).unsqueeze(1)).contiguous();
  };
  UnitRows u;
  // The core keeps them, in this same precision, for small batches.
  if (p.z_unit.defined()) {
    u.q = p.q_unit.contiguous();
    u.z = p.z_unit;
  } else {
    u.z = unit(p.z, p.z_inv_norm);
    u.q = p.single_set ? u.z.narrow(0, p.anchor_offset, p.q.size(0)) : unit(p.q, p.q_inv_norm);
  }
  if (p.anchor_group.defined() && p.multi_label != MultiLabelRule::kNone) {
    u.q_words = p.anchor_words.contiguous();
    u.z_words = p.contrast_words.contiguous();
  }
  return u;
}

// The tiles' problem: the unit rows, the temperature and the group mask where the call has one.
template <typename T>
TileProblem<T> tile_problem(const UnitRows& u, const SupConProblem& p) {
  TileProblem<T> tiles{u.q.data_ptr<T>(), u.q.size(0), u.z.data_ptr<T>(), u.z.size(0),
                       u.z.size(1), p.self_offset(), static_cast<T>(p.temperature.inv_t())};
  if (!p.anchor_group.defined()) return tiles;
  tiles.q_group = p.anchor_group.const_data_ptr<int32_t>();
  tiles.z_group = p.contrast_group.const_data_ptr<int32_t>();
  if (p.multi_label == MultiLabelRule::kNone) {
    tiles.q_pair_class = p.anchor_pair_class.const_data_ptr<int32_t>();
    tiles.z_pair_class = p.contrast_pair_class.const_data_ptr<int32_t>();
  } else {
    tiles.q_words = reinterpret_cast<const uint64_t*>(u.q_words.const_data_ptr<int64_t>());
    tiles.z_words = reinterpret_cast<const uint64_t*>(u.z_words.const_data_ptr<int64_t>());
    tiles.words = u.q_words.size(1);
  }
  return tiles;
}

at::Tensor lse_tiles(const SupConProblem& p, Schedule schedule) {
  const UnitRows u = unit_rows(p);
  at::Tensor lse = at::empty({u.q.size(0)}, u.z.options().dtype(at::kDouble));
  const CpuCapability capability = cpu_capability();
  AT_DISPATCH_FLOATING_TYPES(u.z.scalar_type(), "scl_lse_tiles_cpu", [&] {
    const TileKernelSet<scalar_t>& kernels = tile_kernels_for<scalar_t>(capability);
    const TileProblem<scalar_t> tiles = tile_problem<scalar_t>(u, p);
    if (schedule == Schedule::kSymmetric) {
      kernels.lse_symmetric(tiles, lse.data_ptr<double>());
    } else {
      kernels.lse_plain(tiles, lse.data_ptr<double>());
    }
  });
  return lse;
}

TileGrads grad_tiles(const SupConProblem& p, Schedule schedule, const GradCoefficients& c) {
  const UnitRows u = unit_rows(p);
  TileGrads out;
  out.dz = at::zeros_like(u.z);
  const at::Tensor coef = c.coef.contiguous();
  const CpuCapability capability = cpu_capability();
  AT_DISPATCH_FLOATING_TYPES(u.z.scalar_type(), "scl_grad_tiles_cpu", [&] {
    const TileKernelSet<scalar_t>& kernels = tile_kernels_for<scalar_t>(capability);
    const TileProblem<scalar_t> tiles = tile_problem<scalar_t>(u, p);
    if (schedule == Schedule::kSymmetric) {
      kernels.grad_symmetric(tiles, coef.data_ptr<scalar_t>(), out.dz.data_ptr<scalar_t>());
    } else {
      out.dq = at::zeros_like(u.q);
      const at::Tensor hi = c.lse_hi.contiguous(), lo = c.lse_lo.contiguous();
      kernels.grad_plain(tiles, coef.data_ptr<scalar_t>(),
                         hi.data_ptr<scalar_t>(), lo.data_ptr<scalar_t>(),
                         out.dq.data_ptr<scalar_t>(), out.dz.data_ptr<scalar_t>());
    }
  });
  return out;
}

// The tiles and the positive walk multiply through BLAS: without it the plan refuses the call.
bool blas_missing() { return !blas_available() || test_hooks().blas_missing; }

TileKernels make_cpu_kernels() {
  // One symmetric backward walk (the upper triangle of tiles), no limit on the rows.
  TileKernels kernels{compute_type,
                                   /*symmetric_forward_is_deterministic=*/true,
                                   /*reads_temperature=*/false,
                                   /*walks_triangle=*/false,
                                   /*masks_groups=*/true,
                                   /*max_rows_elements=*/0,
                                   blas_missing,
                                   lse_tiles,
                                   grad_tiles,
                                   /*host_may_wait=*/{},
                                   positive_walk};
  kernels.multi_label_positives = multi_label_positives;
  return kernels;
}

const TileKernels& cpu_kernels() {
  static const TileKernels kernels = make_cpu_kernels();
  return kernels;
}

}  // namespace

TORCH_LIBRARY_IMPL(scl, CPU, m) {
  m.impl("supcon", &FusedOpKernels<cpu_kernels>::forward);
  m.impl("supcon_backward", &FusedOpKernels<cpu_kernels>::backward);
  m.impl("supcon_plan", &FusedOpKernels<cpu_kernels>::plan);
}

}  // namespace scl::cpu

// CUDA backend of scl::supcon: the shared core (csrc/core) with the CUDA tile kernels
// (launch.h). This file is the only one that sees tensors: it brings rows to the kernels' form,
// builds the per-row terms (tile_args.h), launches on the current stream under a device guard,
// and merges the kernels' fp32 partial sums into the core's float64 log-sum-exp. No host
// synchronisation and nothing of size N x N; under CUDA graph capture the core reads nothing.
#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>

#include "../core/supcon_orchestration.h"
#include "../core/tile_math.h"
#include "launch.h"

namespace scl::cuda {
namespace {

namespace tm = scl::tile_math;

// The kernels compute in fp32 (float64 inputs are read as float32), like the Triton backend.
at::ScalarType compute_type(at::ScalarType) { return at::kFloat; }

ElementType element_type(at::ScalarType t) {
  switch (t) {
    case at::kBFloat16: return ElementType::kBFloat16;
    case at::kHalf: return ElementType::kFloat16;
    default: return ElementType::kFloat32;
  }
}

// Rows as the kernels read them (tile_args.h, RowMatrix): 16- or 32-bit, contiguous, a row
// stride of whole 16 bytes with zero columns past D, a 16-byte aligned base. O(N * D) copy only
// when the caller's rows are not already so.
at::Tensor kernel_rows(const at::Tensor& x) {
  const at::Tensor rows = x.scalar_type() == at::kDouble ? x.to(at::kFloat) : x;
  const int64_t per_16_bytes = 16 / rows.element_size();
  const int64_t d = rows.size(1);
  const int64_t width = (d + per_16_bytes - 1) / per_16_bytes * per_16_bytes;
  if (rows.is_contiguous() && width == d &&
      reinterpret_cast<uintptr_t>(rows.data_ptr()) % 16 == 0) {
    return rows;
  }
  at::Tensor padded = at::zeros({rows.size(0), width}, rows.options());
  padded.narrow(1, 0, d).copy_(rows);
  return padded;
}

RowMatrix row_matrix(const at::Tensor& rows) {
  return {rows.data_ptr(), rows.size(0), rows.stride(0)};
}

// [rows rounded up to kTermsPadding, 4] fp32 per-row terms (tile_args.h, RowTerms): the four
// given columns ([rows] tensors), then `pad` in every padded row.
at::Tensor row_terms(const std::array<at::Tensor, 4>& columns, const std::array<float, 4>& pad) {
  const int64_t rows = columns[0].size(0);
  const int64_t padded = (rows + kTermsPadding - 1) / kTermsPadding * kTermsPadding;
  const auto options = columns[0].options().dtype(at::kFloat);
  at::Tensor terms = at::empty({padded, 4}, options);
  terms.narrow(0, 0, rows).copy_(at::stack({columns[0], columns[1], columns[2], columns[3]}, 1));
  // The padding is filled on the device, term by term: a copy from a host tensor would block.
  for (int k = 0; k < 4 && padded > rows; ++k) terms.narrow(0, rows, padded - rows).select(1, k).fill_(pad[k]);
  return terms;
}

const RowTerms* terms_ptr(const at::Tensor& terms) {
  return reinterpret_cast<const RowTerms*>(terms.data_ptr<float>());
}

Device current_device(const at::Tensor& like) {
  const cudaDeviceProp* props = at::cuda::getCurrentDeviceProperties();
  return {props->major * 10 + props->minor, props->multiProcessorCount,
          at::cuda::getCurrentCUDAStream(like.device().index()).stream()};
}

constexpr float kInf = std::numeric_limits<float>::infinity();

// The operands of one call: rows in the kernels' form, the anchors a view of the contrast rows
// in the single set, and the inverse norms in fp32.
struct Operands {
  at::Tensor q, z, rq, rz;
  TileProblem problem(const at::Tensor& own, const at::Tensor& streamed, const at::Tensor& own_terms,
                      const at::Tensor& streamed_terms, int64_t self_offset) const {
    return {element_type(z.scalar_type()), z.size(1), row_matrix(own), row_matrix(streamed),
            terms_ptr(own_terms), terms_ptr(streamed_terms), self_offset};
  }
};

Operands operands(const TileInputs& in) {
  Operands o;
  o.z = kernel_rows(in.z);
  o.q = in.self_offset >= 0 ? o.z.narrow(0, in.self_offset, in.q.size(0)) : kernel_rows(in.q);
  o.rq = in.q_inv_norm.to(at::kFloat).contiguous();
  o.rz = in.z_inv_norm.to(at::kFloat).contiguous();
  return o;
}

at::Tensor lse_tiles(const TileInputs& in) {
  const c10::cuda::CUDAGuard guard(in.z.device());
  const int64_t m = in.q.size(0), n = in.z.size(0);
  if (m == 0) return at::empty({0}, in.z.options().dtype(at::kDouble));
  const Operands o = operands(in);
  const Device device = current_device(in.z);
  const float scale2 = float(in.inv_t * tm::kLog2e);  // log2(e) / t
  const at::Tensor zeros_n = at::zeros({n}, o.rz.options());
  if (in.schedule == Schedule::kSymmetric) {
    const at::Tensor terms =
        row_terms({o.rz * scale2, at::full({n}, -scale2, o.rz.options()), o.rz, zeros_n},
                  {0.f, -kInf, 0.f, 0.f});
    at::Tensor row_sum = at::zeros({terms.size(0)}, o.rz.options());
    lse_symmetric(o.problem(o.z, o.z, terms, terms, 0), row_sum.data_ptr<float>(), device);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    // log(0) = -inf for a row without columns.
    return row_sum.narrow(0, 0, n).to(at::kDouble).log_().add_(in.inv_t);
  }
  const at::Tensor zeros_m = at::zeros({m}, o.rq.options());
  const at::Tensor own = row_terms({o.rq, zeros_m, zeros_m, zeros_m}, {0.f, kInf, 0.f, 0.f});
  const at::Tensor streamed = row_terms({o.rz * scale2, zeros_n, o.rz, zeros_n}, {0.f, -kInf, 0.f, 0.f});
  const TileProblem p = o.problem(o.q, o.z, own, streamed, in.self_offset);
  const int splits = lse_plain_splits(p, device);
  at::Tensor part_max = at::empty({splits, m}, o.rq.options());
  at::Tensor part_sum = at::empty({splits, m}, o.rq.options());
  lse_plain(p, part_max.data_ptr<float>(), part_sum.data_ptr<float>(), splits, device);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  // The splits' base-2 (max, sum) pairs merged in float64 (docs/MATH.md section 6).
  const at::Tensor maxima = part_max.to(at::kDouble), sums = part_sum.to(at::kDouble);
  const at::Tensor top = std::get<0>(maxima.max(0));
  const at::Tensor finite_top = at::where(at::isfinite(top), top, at::zeros_like(top));
  const at::Tensor total = (sums * at::exp2(maxima - finite_top)).sum(0);
  return ((finite_top + at::log2(total)) * tm::kLn2);
}

// The symmetric backward walks the upper triangle (sm_90a, D <= 128; atomics) unless
// reproducibility is asked for or SCL_CUDA_SYMMETRIC_BACKWARD=rows asks for the full-row walk
// (one program per row block over every column block; docs/CUDA_KERNELS.md), e.g. to compare.
bool symmetric_backward_by_triangle() {
  if (at::globalContext().deterministicAlgorithms()) return false;
  const char* walk = std::getenv("SCL_CUDA_SYMMETRIC_BACKWARD");
  const std::string chosen = walk == nullptr ? "triangle" : walk;
  TORCH_CHECK_VALUE(chosen == "triangle" || chosen == "rows",
                    "SCL_CUDA_SYMMETRIC_BACKWARD must be \"triangle\" or \"rows\", got \"", chosen, "\"");
  return chosen == "triangle";
}

TileGrads grad_tiles(const TileInputs& in, const GradCoefficients& c) {
  const c10::cuda::CUDAGuard guard(in.z.device());
  const int64_t m = in.q.size(0), n = in.z.size(0), d = in.z.size(1);
  const Operands o = operands(in);
  const Device device = current_device(in.z);
  const float scale2 = float(in.inv_t * tm::kLog2e);
  const at::Tensor coef = c.coef.to(at::kFloat);
  const auto fp32 = o.rz.options();
  TileGrads out;
  if (in.schedule == Schedule::kSymmetric) {
    // Own and streamed rows are the same set: coef_i t / log2(e) meets r_j log2(e) / t; the
    // triangle's column side scales by r_i / r_j.
    const at::Tensor own =
        row_terms({o.rz, at::zeros({n}, fp32), at::zeros({n}, fp32), coef / scale2}, {0.f, kInf, 0.f, 0.f});
    const at::Tensor streamed = row_terms(
        {o.rz * scale2, at::full({n}, -scale2, fp32), o.rz.reciprocal(), coef * o.rz}, {0.f, -kInf, 0.f, 0.f});
    const TileProblem problem = o.problem(o.z, o.z, own, streamed, 0);
    if (symmetric_backward_by_triangle() && symmetric_triangle_supported(problem, device)) {
      // The triangle adds whole 16-byte vectors into a padded buffer; the gradient is its view.
      const at::Tensor padded = at::zeros({own.size(0), kTriangleGradWidth}, fp32);
      grad_symmetric_triangle(problem, padded.data_ptr<float>(), device);
      out.dz = padded.narrow(0, 0, n).narrow(1, 0, d);
    } else {
      out.dz = at::empty({n, d}, fp32);
      grad(GradWalk::kRowsSymmetric, problem, out.dz.data_ptr<float>(), d, device);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
  }
  // lse in base 2 as an fp32 (hi, lo) pair; rows without gradient get hi = +inf (weight 0).
  const at::Tensor lse2 = (c.lse_hi.to(at::kDouble) + c.lse_lo.to(at::kDouble)) * tm::kLog2e;
  const at::Tensor hi64 = lse2.to(at::kFloat).to(at::kDouble);
  const at::Tensor lo = at::where(at::isfinite(lse2), lse2 - hi64, at::zeros_like(lse2)).to(at::kFloat);
  const at::Tensor hi = at::where(coef != 0, lse2.to(at::kFloat), at::full_like(coef, kInf));
  const at::Tensor zeros_n = at::zeros({n}, fp32);
  const at::Tensor anchors = row_terms({o.rq, hi, lo, coef}, {0.f, kInf, 0.f, 0.f});
  const at::Tensor columns = row_terms({o.rz * scale2, zeros_n, o.rz, zeros_n}, {0.f, -kInf, 0.f, 0.f});
  out.dq = at::empty({m, d}, fp32);
  if (m > 0) {
    grad(GradWalk::kRowsPlain, o.problem(o.q, o.z, anchors, columns, in.self_offset),
         out.dq.data_ptr<float>(), d, device);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  // The contrast side: column blocks own their rows and walk the anchors (no atomics).
  const at::Tensor anchors_streamed = row_terms({o.rq, hi, lo, coef * o.rq}, {0.f, kInf, 0.f, 0.f});
  out.dz = at::zeros({n, d}, fp32);
  if (m > 0) {
    grad(GradWalk::kColumns, o.problem(o.z, o.q, columns, anchors_streamed, in.self_offset),
         out.dz.data_ptr<float>(), d, device);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  return out;
}

// False while the current stream captures a CUDA graph: nothing may wait for the device then.
bool host_may_wait(const at::Tensor& like) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  C10_CUDA_CHECK(cudaStreamIsCapturing(
      at::cuda::getCurrentCUDAStream(like.device().index()).stream(), &status));
  return status == cudaStreamCaptureStatusNone;
}

const TileKernels& cuda_kernels() {
  // The symmetric forward adds a row's tiles by atomics: not reproducible. The symmetric
  // backward's triangle does too, so deterministic mode takes the full-row walk there
  // (symmetric_backward_by_triangle above); the other backward walks write every element once.
  static const TileKernels kernels{compute_type, /*symmetric_forward_is_deterministic=*/false,
                                   lse_tiles, grad_tiles, host_may_wait};
  return kernels;
}

}  // namespace

TORCH_LIBRARY_IMPL(scl, CUDA, m) {
  m.impl("supcon", &FusedOpKernels<cuda_kernels>::forward);
  m.impl("supcon_backward", &FusedOpKernels<cuda_kernels>::backward);
}

}  // namespace scl::cuda

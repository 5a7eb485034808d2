#include "supcon_orchestration.h"

#include "calling_thread.h"
#include "deferred_value_check.h"
#include "prepared_handoff.h"
#include "tile_math.h"

#include <ATen/record_function.h>
#include <c10/util/Exception.h>

#include <string>
#include <utility>
#include <vector>

namespace scl {
namespace {

void check_lse(const SupConProblem& p, const at::Tensor& lse) {
  TORCH_CHECK_VALUE(lse.dim() == 1 && lse.size(0) == p.m, "lse must have shape [", p.m,
                    "], got ", lse.sizes());
  TORCH_CHECK_TYPE(at::isFloatingType(lse.scalar_type()), "lse must be a floating-point tensor");
  TORCH_CHECK_VALUE(lse.device() == p.z.device(), "lse is on ", lse.device(),
                    " but features is on ", p.z.device());
}

// The float64 lse as hi + lo in the kernels' dtype (tile_kernels.h, GradCoefficients).
std::pair<at::Tensor, at::Tensor> split_lse(const at::Tensor& lse, at::ScalarType kernel_type) {
  const at::Tensor hi = lse.to(kernel_type);
  // -inf - -inf is NaN: rows without columns have coef 0 and never read their lse.
  const at::Tensor lo = at::where(at::isfinite(lse), lse - hi.to(at::kDouble), 0.0);
  return {hi, lo.to(kernel_type)};
}

// The per-anchor scalars of the backward tiles (tile_kernels.h), from float64 g and lse.
GradCoefficients grad_coefficients(const SupConProblem& p, Schedule schedule,
                                   const at::Tensor& g, const at::Tensor& lse,
                                   at::ScalarType kernel_type) {
  const at::Tensor g64 = g.to(at::kDouble);
  if (schedule == Schedule::kSymmetric) {
    // Zero-gradient rows must not evaluate exp(1/t - lse): lse may be -inf there.
    const at::Tensor coef = at::where(g64 != 0, g64 * (p.temperature.inv_t() - lse).exp_() * p.temperature.inv_t(), 0.0);
    return {coef.to(kernel_type), {}, {}};
  }
  auto [hi, lo] = split_lse(lse, kernel_type);
  return {(g64 * p.temperature.inv_t()).to(kernel_type), hi, lo};
}

// The walk's inputs: anchors without positives are left out (class -1); an undefined
// grad_weight asks for the forward only.
PositiveWalkInputs walk_inputs(const SupConProblem& p, const at::Tensor& lse,
                               at::ScalarType kernel_type, double gamma,
                               const at::Tensor& grad_weight) {
  auto [hi, lo] = split_lse(lse, kernel_type);
  const at::Tensor anchor_class = at::where(p.num_positives > 0, p.anchor_class, -1);
  return {anchor_class, p.contrast_class, hi, lo, gamma,
          grad_weight.defined() ? grad_weight : at::empty({0}, hi.options())};
}

// What the walk's sums are divided by per anchor, float64: W_i, the sum of the positive pairs'
// weights, which is |P(i)| for class ids; 1 where an anchor has no positive (its sums are 0).
at::Tensor positive_weight_sums(const SupConProblem& p) {
  const at::Tensor w = p.positive_weight.defined() ? p.positive_weight
                                                   : p.num_positives.to(at::kDouble);
  return at::where(p.num_positives > 0, w, 1.0);
}

// Per-anchor loss l_i = loss_sum_i / W_i from the positive walk (0 without positives), in the
// loss dtype: the focal loss, or the multi-label one (TileKernels::positive_walk).
at::Tensor walk_anchor_losses(const TileKernels& kernels, const CallThreads& threads,
                              const SupConProblem& p, const at::Tensor& lse, double gamma) {
  const PositiveWalkInputs walk_in =
      walk_inputs(p, lse, kernels.compute_type(p.z.scalar_type()), gamma, {});
  const PositiveWalkOutputs walk =
      threads.tiles([&] { return kernels.positive_walk(p, walk_in); });
  const at::Tensor mean = walk.loss_sum.to(at::kDouble) / positive_weight_sums(p);
  return at::where(p.num_positives > 0, mean, 0.0).to(p.compute_type);
}

// The call's problem (prepare_problem), with the positives of multi-hot labels counted and
// weighed by the backend's walk (TileKernels::multi_label_positives).
SupConProblem prepare_call(const TileKernels& kernels, const CallThreads& threads,
                           const SupConArgs& args, const CallPlan& plan,
                           DeferredValueChecks* value_checks) {
  SupConProblem p = prepare_problem(args, plan, value_checks, kernels.prepare_rows);
  if (p.multi_label != MultiLabelRule::kNone) {
    MultiLabelPositives positives =
        threads.tiles([&] { return kernels.multi_label_positives(p); });
    p.num_positives = std::move(positives.num_positives);
    p.positive_weight = std::move(positives.weight_sum);
  }
  return p;
}

// The temperature's gradient when autograd does not ask for it. A float's temperature is a
// host tensor beside device rows, and its zeros launch nothing on the device: the named scope
// says so to bench/launch_count.py, which sees every tensor on the CPU.
at::Tensor zero_temperature_grad(const at::Tensor& t) {
  if (!t.is_cpu()) return at::zeros_like(t);
  RECORD_FUNCTION("scl::host_temperature_grad", std::vector<c10::IValue>());
  return at::zeros_like(t);
}

// Whether every anchor of a class gets the same weight w = g / |P|, so that the weighted class
// sums are the class sums scaled (BackwardAssemblyInputs::class_shares_weight): every row an
// anchor of its own set, and one upstream gradient for all (a mean's, 0-dim, or a sum's,
// expanded with stride 0).
bool class_shares_weight(const SupConProblem& p, const SupConArgs& args,
                         const at::Tensor& grad_loss) {
  return p.single_set && p.m == p.n &&
         (args.mean || (grad_loss.dim() == 1 && grad_loss.stride(0) == 0));
}

// The backward's outputs from the fused assembly of each (TileKernels::assemble_backward or
// weights_grads_and_assembly): the temperature's gradient from the rows' unit dots (half their
// sum: tile_kernels.h).
std::tuple<at::Tensor, at::Tensor, at::Tensor> finish_backward(const SupConProblem& p,
                                                               const SupConArgs& args,
                                                               const BackwardAssembly& features,
                                                               const BackwardAssembly& contrast,
                                                               bool temperature_grad) {
  const at::Tensor& t = args.temperature;
  at::Tensor grad_t;
  if (temperature_grad) {
    at::Tensor dots = features.unit_dot.sum(0, false, at::kDouble);
    if (contrast.unit_dot.defined()) dots.add_(contrast.unit_dot.sum(0, false, at::kDouble));
    // A temperature left unread scales on the device: (-0.5 / t) from its tensor.
    dots = p.temperature.is_in_memory()
               ? dots.mul_(p.temperature.tensor().reciprocal().mul_(-0.5).squeeze(0))
               : dots.mul_(-0.5 * p.temperature.inv_t());
    grad_t = dots.to(t.scalar_type()).reshape(t.sizes()).to(t.device());
  } else {
    grad_t = zero_temperature_grad(t);
  }
  return {features.grad,
          p.single_set ? at::empty({0, p.d}, args.features.options()) : contrast.grad, grad_t};
}

// The backward's assembly by the backend's fused step (TileKernels::assemble_backward): one
// call per output, from the anchors' positive weights w and the weighted class sums.
std::tuple<at::Tensor, at::Tensor, at::Tensor> assemble_backward(
    const TileKernels& kernels, const SupConProblem& p, const SupConArgs& args,
    const at::Tensor& w, const at::Tensor& weighted, const TileGrads& tiles, Schedule schedule,
    bool temperature_grad) {
  // Undefined weighted sums: the anchors of a class share their weight (class_shares_weight).
  const bool shared = !weighted.defined();
  const auto side = [&](const at::Tensor& rows, const at::Tensor& inv_norm,
                        const at::Tensor& grads, const at::Tensor& extra, bool anchors,
                        bool contrast, at::ScalarType out_dtype) {
    return kernels.assemble_backward(
        p, {rows, inv_norm, grads, extra, anchors ? w : at::Tensor(),
            contrast && !shared ? p.contrast_class : at::Tensor(), weighted, shared, out_dtype});
  };
  BackwardAssembly features, contrast;
  if (p.single_set) {
    const at::Tensor extra = schedule == Schedule::kSymmetric ? at::Tensor() : tiles.dq;
    features = side(p.z, p.z_inv_norm, tiles.dz, extra, true, true,
                    args.features.scalar_type());
  } else {
    features = side(p.q, p.q_inv_norm, tiles.dq, at::Tensor(), true, false,
                    args.features.scalar_type());
    contrast = side(p.z, p.z_inv_norm, tiles.dz, at::Tensor(), false, true,
                    args.contrast->scalar_type());
  }
  return finish_backward(p, args, features, contrast, temperature_grad);
}

// A profiler range named after the call's plan, formed only while a profiler listens.
class PlanRange {
 public:
  PlanRange(const char* op, const CallPlan& plan) {
    if (range_.isActive()) {
      name_ = std::string(op) + " [" + plan.summary() + "]";
      range_.before(name_);
    }
  }

 private:
  at::RecordFunction range_{at::RecordScope::USER_SCOPE};
  std::string name_;
};

}  // namespace

std::string supcon_plan(const TileKernels& kernels, const SupConArgs& args) {
  return plan_call(kernels, args).describe();
}

OpOutputs supcon_forward(const TileKernels& kernels, const SupConArgs& args) {
  const CallPlan plan = plan_call(kernels, args);
  require_runnable(plan, args);
  const PlanRange range("scl::supcon_forward", plan);
  const CallThreads threads(plan.parallel_tiles);
  const bool check_values = plan.value_checks != ValueChecks::kSkipped;
  if (check_values) raise_earlier_failures(/*wait=*/false);
  DeferredValueChecks value_checks;
  SupConProblem p =
      prepare_call(kernels, threads, args, plan, check_values ? &value_checks : nullptr);
  const Schedule schedule = plan.forward_schedule;
  at::Tensor lse, losses;
  if (plan.forward_finish == ForwardFinish::kFusedLosses ||
      plan.forward_finish == ForwardFinish::kFusedLossesAndMean) {
    const bool fused_mean = plan.forward_finish == ForwardFinish::kFusedLossesAndMean;
    // The fused preparation zeroed the accumulators with its class sums; the ATen one did not.
    const at::Tensor mean_sums =
        !fused_mean             ? at::Tensor()
        : p.mean_sums.defined() ? p.mean_sums
                                : at::zeros({3}, p.q.options().dtype(at::kDouble));
    AnchorLossInputs finish{/*lse=*/{}, mean_sums};
    if (plan.grouped_forward) {
      LseAndLosses both =
          threads.tiles([&] { return kernels.lse_and_anchor_losses(p, schedule, finish); });
      lse = std::move(both.lse);
      losses = std::move(both.losses);
    } else {
      lse = finish.lse = threads.tiles([&] { return kernels.lse(p, schedule); });
      losses = kernels.anchor_losses(p, finish);
    }
    if (fused_mean) p.anchors_with_positives = mean_sums.select(0, 1);
  } else {
    lse = threads.tiles([&] { return kernels.lse(p, schedule); });
    losses = plan.forward_finish == ForwardFinish::kPositiveWalk
                 ? walk_anchor_losses(kernels, threads, p, lse, args.focal_gamma)
                 : anchor_losses(p, lse);
  }
  TORCH_INTERNAL_ASSERT(lse.scalar_type() == at::kDouble && lse.size(0) == p.m);
  if (args.mean && losses.dim() == 1) losses = mean_over_anchors_with_positives(p, losses);
  // Last, once all the work is queued (on the CPU the checks have already run).
  value_checks.finish_call();
  offer_prepared(p);
  return {std::move(losses), lse, p.num_positives};
}

OpOutputs supcon_backward(const TileKernels& kernels, const at::Tensor& grad_loss,
                          const SupConArgs& args, const at::Tensor& lse, bool temperature_grad) {
  // The forward's own problem when its autograd node kept it (prepared_handoff.h): the same
  // inputs, so the same terms.
  const SupConProblem* kept = prepared_for_backward();
  const CallPlan plan = plan_call(kernels, args, kept);
  require_runnable(plan, args);
  const PlanRange range("scl::supcon_backward", plan);
  const CallThreads threads(plan.parallel_tiles);
  if (plan.value_checks != ValueChecks::kSkipped) raise_earlier_failures(/*wait=*/false);
  SupConProblem p = kept != nullptr
                        ? *kept
                        : prepare_call(kernels, threads, args, plan, /*value_checks=*/nullptr);
  // A kept problem carries its forward's plan choices; the kernels follow this call's.
  p.deterministic = plan.deterministic;
  p.symmetric_backward_walk = plan.symmetric_backward_walk;
  check_lse(p, lse);
  check_grad_loss(p, grad_loss, args.mean);
  const Schedule schedule = plan.backward_schedule;
  const at::ScalarType kernel_type = kernels.compute_type(p.z.scalar_type());
  const at::Tensor lse64 = lse.to(at::kDouble);
  const bool walked = plan.backward_assembly == AssemblyPath::kPositiveWalk;
  if (plan.backward_assembly == AssemblyPath::kFusedWeightsAndAssembly) {
    // The mean's gradient: divided on the device by the forward's count where it kept one.
    const bool counted = args.mean && p.anchors_with_positives.defined();
    const bool shared = class_shares_weight(p, args, grad_loss);
    const AnchorWeightInputs weight_inputs{
        args.mean && !counted ? per_anchor_grad_of_mean(p, grad_loss) : grad_loss,
        counted ? p.anchors_with_positives : at::Tensor(), lse64,
        shared ? 0 : p.class_sums.size(0), schedule};
    if (plan.grouped_backward) {
      const WeightsGradsAndAssemblyInputs grouped{weight_inputs, shared};
      const AssembledGradients sides =
          threads.tiles([&] { return kernels.weights_grads_and_assembly(p, grouped); });
      return finish_backward(p, args, sides.features, sides.contrast, temperature_grad);
    }
    const AnchorWeights weights = kernels.anchor_weights(p, weight_inputs);
    const TileGrads tiles =
        threads.tiles([&] { return kernels.grad(p, schedule, weights.coefficients); });
    return assemble_backward(kernels, p, args, weights.weight,
                             shared ? at::Tensor() : weights.weighted_sums, tiles, schedule,
                             temperature_grad);
  }
  const at::Tensor g = effective_anchor_grads(
      p, args.mean ? per_anchor_grad_of_mean(p, grad_loss) : grad_loss);
  // The focal loss (docs/MATH.md, "Focal contrastive loss") and multi-hot labels (section 11):
  // one walk over the positive pairs gives their part of the gradient and H_i, the weighted
  // mean of hterm_ip, which scales the softmax part (1 for the multi-label SupCon loss).
  PositiveWalkOutputs walk;
  at::Tensor softmax_g = g;
  if (walked) {
    const at::Tensor positives = positive_weight_sums(p).to(g.scalar_type());
    const PositiveWalkInputs walk_in =
        walk_inputs(p, lse64, kernel_type, args.focal_gamma, (g / positives).to(kernel_type));
    walk = threads.tiles([&] { return kernels.positive_walk(p, walk_in); });
    softmax_g = g * walk.hterm_sum.to(g.scalar_type()) / positives;
  }
  const GradCoefficients coefficients =
      grad_coefficients(p, schedule, softmax_g, lse64, kernel_type);
  const TileGrads tiles =
      threads.tiles([&] { return kernels.grad(p, schedule, coefficients); });
  if (plan.backward_assembly == AssemblyPath::kFusedAssembly) {
    const at::Tensor w = positive_weights(p, g);
    return assemble_backward(kernels, p, args, w, weighted_class_sums(p, w), tiles, schedule,
                             temperature_grad);
  }
  const at::Tensor dz = tiles.dz.to(p.compute_type);
  const bool symmetric = schedule == Schedule::kSymmetric;
  // The symmetric kernels sum both sides into dz; dq is then the same buffer.
  const at::Tensor dq = symmetric ? dz : tiles.dq.to(p.compute_type);
  if (walked) {
    dq.add_(walk.dq);
    dz.add_(walk.dz);
  } else {
    add_positive_grads(p, g, dq, dz);
  }
  const at::Tensor& t = args.temperature;
  // Computed only when asked: a temperature on the host (a float's) would otherwise cost a read
  // of the device's result on every call.
  at::Tensor grad_t;
  if (temperature_grad) {
    // dLoss/dt = -(1/t) sum_ij G_ij s_ij = -(1/t) sum_i q_i . dq_i over the anchor side; the
    // symmetric dz holds both sides, which counts every term twice.
    const at::Tensor anchor_dot = symmetric ? unit_dot(p, Rows::kContrast, dz) * 0.5
                                            : unit_dot(p, Rows::kAnchors, dq);
    grad_t = (anchor_dot * -p.temperature.inv_t()).to(t.scalar_type()).reshape(t.sizes()).to(t.device());
  } else {
    grad_t = zero_temperature_grad(t);
  }
  if (p.single_set) {
    if (!symmetric) dz.narrow(0, p.anchor_offset, p.m).add_(dq);
    return {normalize_backward(p, Rows::kContrast, dz, args.features.scalar_type()),
            at::empty({0, p.d}, args.features.options()), grad_t};
  }
  return {normalize_backward(p, Rows::kAnchors, dq, args.features.scalar_type()),
          normalize_backward(p, Rows::kContrast, dz, args.contrast->scalar_type()), grad_t};
}

}  // namespace scl

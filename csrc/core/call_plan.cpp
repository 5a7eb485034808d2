#include "call_plan.h"

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <c10/util/ParallelGuard.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <sstream>
#include <string>
#include <strings.h>

#include "deferred_value_check.h"
#include "supcon_problem.h"
#include "test_hooks.h"
#include "tile_math.h"

namespace scl {
namespace {

// The grain: below this many multiply-adds in the tiles (N * N * D), their rounds cost thread
// wake-ups more than arithmetic, and they run on the calling thread like the rest of the call.
// Measured on 2 idle cores (python -m bench.cpu_grain, bench/decisions/2026-11-28-cpu-grain.md):
// a second thread saves nothing below 2^22 at any D and at most 8% up to 2^24, from 2^24 on 7-19%
// and more as N grows; on a loaded machine every parallel region can wait milliseconds for a
// core, so the grain sits at the top of the break-even range.
constexpr int64_t kSerialWork = int64_t{1} << 24;
// The grain where OpenMP's idle workers spin. Under libgomp's default wait policy a worker spins
// for milliseconds (about 300,000 pause loops) after every region before it sleeps: it holds a
// core that the calling thread's serial steps and other processes need, and beside another job
// every round's barrier waits for a thread the scheduler has put aside. N = 256, D = 768
// fwd + bwd (50 M) beside a 2-thread training job on a 2-core VM that other jobs shared too:
// 116-268 ms on 2 spinning threads, 25-68 ms on the calling thread, 16-25 ms on 2 passive threads
// (bench/PERFORMANCE.md, "Shared machines"). Quiet, a second thread saves a quarter at most up to
// here (0.75-0.93 from 2^24 to 50 M, bench/decisions/2026-11-28-cpu-grain.md).
constexpr int64_t kSerialWorkWhileSpinning = int64_t{1} << 26;

// Whether this process's OpenMP workers spin between regions: unless OMP_WAIT_POLICY is passive
// or GOMP_SPINCOUNT is 0 (which overrides the policy's spin count). libgomp reads both when it
// loads, at `import torch`; they are read here once, on the assumption that nobody changed them
// since.
bool openmp_workers_spin() {
  static const bool spin = [] {
    if (const char* spin_count = std::getenv("GOMP_SPINCOUNT")) {
      char* end = nullptr;
      const long long count = std::strtoll(spin_count, &end, 10);
      return end == spin_count || count != 0;  // "infinite" and the like spin
    }
    const char* policy = std::getenv("OMP_WAIT_POLICY");
    return policy == nullptr || strcasecmp(policy, "passive") != 0;
  }();
  return spin;
}

// True to give the tile kernels torch's threads (calling_thread.h): past the grain, and not
// inside a caller's own parallel region, whose threads are busy already.
bool tiles_in_parallel(const SupConArgs& a) {
  const at::Tensor& columns = a.contrast.has_value() ? *a.contrast : a.features;
  const int64_t work = a.features.numel() * (columns.dim() >= 1 ? columns.size(0) : 1);
  const int64_t grain = openmp_workers_spin() ? kSerialWorkWhileSpinning : kSerialWork;
  return work >= grain && !at::in_parallel_region() && !c10::ParallelGuard::is_enabled();
}

// Whether the backend has the fused per-anchor losses, alone or grouped with the tiles.
bool has_fused_losses(const TileKernels& kernels) {
  return kernels.anchor_losses || kernels.lse_and_anchor_losses;
}

// Whether it has the fused anchor weights, alone or grouped with the tiles and the assembly.
bool has_fused_weights(const TileKernels& kernels) {
  return kernels.anchor_weights || kernels.weights_grads_and_assembly;
}

bool host_may_wait(const TileKernels& kernels, const at::Tensor& like) {
  return !kernels.host_may_wait || kernels.host_may_wait(like);
}

// Whether the temperature stays in memory. A tensor on the GPU stays unread wherever the plan
// runs the fused stages that read it (the fused preparation, weights and assembly: float32
// compute, the SupCon loss, reproducible results not asked for), eager calls and captured ones
// alike, so that a warm-up takes the path a capture will; so does any tensor under
// TestHooks::temperature_in_memory, which lets CPU tests take that path. Elsewhere a GPU
// temperature is read, which a capture cannot do: `unreadable` then.
bool temperature_stays_in_memory(const TileKernels& kernels, const CallPlan& plan,
                                 const SupConArgs& a, bool host_may_wait_now, bool& unreadable) {
  unreadable = false;
  if (!kernels.reads_temperature) return false;  // a CPU backend: a host tensor, read in place
  const bool forced = test_hooks().temperature_in_memory;
  if (!forced && a.temperature.is_cpu()) return false;
  if (plan.fused_preparation &&
      plan.backward_assembly == AssemblyPath::kFusedWeightsAndAssembly) {
    return true;
  }
  unreadable = forced || !host_may_wait_now;
  return false;
}

// Single set with every row an anchor is symmetric (S = S^T); its fixed shift is exact only for
// unit rows and a temperature inside the exp range of the kernels' precision. The forward visits
// the triangle only where that is reproducible or reproducibility is not asked for. Every
// condition that fails is named (PlainBecause); the schedule is symmetric where none does.
unsigned plain_because(const CallPlan& plan, const TileKernels& kernels, const SupConArgs& a,
                       bool forward) {
  unsigned because = 0;
  if (a.contrast.has_value()) because |= kContrastRows;
  else if (a.num_anchors != a.features.size(0)) because |= kSomeAnchors;
  if (!a.normalize) because |= kNotNormalized;
  // A temperature left unread has no known range: the plain schedule serves any.
  if (!plan.temperature.is_on_host()) {
    because |= kTemperatureUnread;
  } else if (!fixed_shift_is_safe(plan.temperature.inv_t(), plan.compute_type)) {
    because |= kSmallTemperature;
  }
  if (forward && !kernels.symmetric_forward_is_deterministic && plan.deterministic) {
    because |= kReproducibleForward;
  }
  return because;
}

Schedule schedule_for(unsigned plain_because) {
  return plain_because == 0 ? Schedule::kSymmetric : Schedule::kPlain;
}

// The PlainBecause bits by name, in explain's order.
std::string plain_because_names(unsigned because) {
  if (because == 0) return "none";
  static const std::pair<PlainBecause, const char*> kNames[] = {
      {kContrastRows, "contrast rows"},        {kSomeAnchors, "some anchors"},
      {kNotNormalized, "not normalized"},      {kTemperatureUnread, "temperature unread"},
      {kSmallTemperature, "small temperature"}, {kReproducibleForward, "reproducible forward"}};
  std::string names;
  for (const auto& [bit, text] : kNames) {
    if (because & bit) names += (names.empty() ? "" : ", ") + std::string(text);
  }
  return names;
}

// The smallest temperature whose fixed shift is safe in `compute_type`, found by bisection on
// fixed_shift_is_safe itself, so that the number explain quotes is the rule's own.
double symmetric_temperature_floor(at::ScalarType compute_type) {
  double safe = 0, unsafe = 1;  // in 1/t
  while (fixed_shift_is_safe(unsafe, compute_type)) unsafe *= 2;
  for (int step = 0; step < 64; ++step) {
    const double mid = (safe + unsafe) / 2;
    (fixed_shift_is_safe(mid, compute_type) ? safe : unsafe) = mid;
  }
  return 1 / unsafe;
}

// torch's name of a rows' dtype (the plan's rows are floating-point: check_features).
const char* dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kDouble: return "float64";
    case at::kFloat: return "float32";
    case at::kHalf: return "float16";
    case at::kBFloat16: return "bfloat16";
    default: return c10::toString(t);
  }
}

const char* name(Schedule s) { return s == Schedule::kSymmetric ? "symmetric" : "plain"; }

const char* name(ForwardFinish f) {
  switch (f) {
    case ForwardFinish::kPositiveWalk: return "positive walk";
    case ForwardFinish::kFusedLosses: return "fused losses";
    case ForwardFinish::kFusedLossesAndMean: return "fused losses and mean";
    case ForwardFinish::kAtenLosses: return "aten losses";
  }
  return "";
}

const char* name(AssemblyPath b) {
  switch (b) {
    case AssemblyPath::kPositiveWalk: return "positive walk, aten assembly";
    case AssemblyPath::kFusedWeightsAndAssembly: return "fused weights and assembly";
    case AssemblyPath::kFusedAssembly: return "aten weights, fused assembly";
    case AssemblyPath::kAten: return "aten";
  }
  return "";
}

const char* name(MultiLabelRule r) {
  switch (r) {
    case MultiLabelRule::kNone: return "none";
    case MultiLabelRule::kAny: return "any";
    case MultiLabelRule::kJaccard: return "jaccard";
  }
  return "";
}

const char* grouped_stages_name(bool forward, bool backward) {
  if (forward && backward) return "forward and backward";
  if (forward) return "forward";
  return backward ? "backward" : "none";
}

const char* name(ValueChecks v) {
  switch (v) {
    case ValueChecks::kOnHost: return "on the host";
    case ValueChecks::kDeferred: return "deferred";
    case ValueChecks::kSkipped: return "skipped (graph capture)";
  }
  return "";
}

const char* name(Refusal r) {
  switch (r) {
    case Refusal::kNone: return "none";
    case Refusal::kNoBlas: return "no BLAS";
    case Refusal::kTooManyElements: return "too many elements";
    case Refusal::kNoFocalWalk: return "no focal walk";
    case Refusal::kNoGroupMask: return "no group mask";
    case Refusal::kNoPairWeights: return "no pair weights";
    case Refusal::kTemperatureUnreadable: return "temperature unreadable";
  }
  return "";
}

const char* name(SymmetricBackwardWalk w) {
  switch (w) {
    case SymmetricBackwardWalk::kNone: return "none";
    case SymmetricBackwardWalk::kTriangle: return "triangle";
    case SymmetricBackwardWalk::kTriangleAsync: return "triangle by st.async";
    case SymmetricBackwardWalk::kRows: return "full rows";
  }
  return "";
}

SymmetricBackwardWalk walk_named(const std::string& walk, const char* source) {
  if (walk.empty() || walk == "triangle") return SymmetricBackwardWalk::kTriangle;
  if (walk == "triangle-async") return SymmetricBackwardWalk::kTriangleAsync;
  TORCH_CHECK_VALUE(walk == "rows", source, " must be \"triangle\", \"triangle-async\" or ",
                    "\"rows\", got \"", walk, "\"");
  return SymmetricBackwardWalk::kRows;
}

// The process's choice: the variable read once, at the first call of the op.
SymmetricBackwardWalk process_walk() {
  const char* walk = std::getenv("SCL_CUDA_SYMMETRIC_BACKWARD");
  return walk_named(walk == nullptr ? "" : walk, "SCL_CUDA_SYMMETRIC_BACKWARD");
}

// The largest rows tensor of the call (the features or the contrast rows).
int64_t rows_elements(const SupConArgs& a) {
  return std::max(a.features.numel(), a.contrast.has_value() ? a.contrast->numel() : 0);
}

// The refusal the backend's own limits give, before the call's arguments are looked at.
Refusal backend_refusal(const TileKernels& kernels, const SupConArgs& a) {
  if (kernels.blas_missing && kernels.blas_missing()) return Refusal::kNoBlas;
  if (kernels.max_rows_elements > 0 && rows_elements(a) > kernels.max_rows_elements) {
    return Refusal::kTooManyElements;
  }
  if (a.focal_gamma > 0 && !(kernels.positive_walk && kernels.walks_focal)) {
    return Refusal::kNoFocalWalk;
  }
  if (a.groups.has_value() && !kernels.masks_groups) return Refusal::kNoGroupMask;
  if (a.labels.dim() == 2 && !kernels.multi_label_positives) return Refusal::kNoPairWeights;
  return Refusal::kNone;
}

// One line for a refused call: what was asked, the plan's line that refuses it, what to do, and
// the whole plan.
std::string refused(const CallPlan& plan, const std::string& asked, const std::string& remedy) {
  return asked + ": the plan's line 'cannot_run: " + name(plan.refusal) + "' refuses it; " +
         remedy + ". Plan: " + plan.summary();
}

}  // namespace

SymmetricBackwardWalk symmetric_backward_walk_setting() {
  static const SymmetricBackwardWalk chosen = process_walk();
  const std::string& hooked = test_hooks().symmetric_backward_walk;
  return hooked.empty() ? chosen : walk_named(hooked, "the test hook symmetric_backward_walk");
}

bool fixed_shift_is_safe(double inv_t, at::ScalarType compute_type) {
  // exp(s - 1/t) >= exp(-2/t) must stay a normal number of the compute type (tile_math.h).
  const double min_normal_log = compute_type == at::kDouble
                                    ? std::log(std::numeric_limits<double>::min())
                                    : std::log(static_cast<double>(std::numeric_limits<float>::min()));
  return tile_math::fixed_shift_is_safe(inv_t, min_normal_log);
}

CallPlan plan_call(const TileKernels& kernels, const SupConArgs& args, const SupConProblem* kept) {
  CallPlan plan{};
  plan.deterministic = at::globalContext().deterministicAlgorithms();
  TORCH_CHECK_VALUE(std::isfinite(args.focal_gamma) && args.focal_gamma >= 0,
                    "focal_gamma must be finite and >= 0, got ", args.focal_gamma);
  plan.focal = args.focal_gamma > 0;
  plan.multi_label = multi_label_rule(args);
  // Multi-hot labels have no class sums: their positives are weighed pair by pair in the walk.
  const bool walks_positives = plan.focal || plan.multi_label != MultiLabelRule::kNone;
  plan.rows_elements = rows_elements(args);
  plan.max_rows_elements = kernels.max_rows_elements;
  plan.refusal = backend_refusal(kernels, args);
  const bool float_compute = args.features.scalar_type() != at::kDouble;
  // The group mask is made by the core's ATen preparation (supcon_problem.cpp).
  plan.fused_preparation =
      kernels.prepare_rows && float_compute && !plan.deterministic && !args.groups.has_value() &&
      !walks_positives;
  plan.mean = args.mean;
  if (walks_positives) {
    plan.forward_finish = ForwardFinish::kPositiveWalk;
  } else if (has_fused_losses(kernels) && float_compute) {
    // The mean by the fused step adds by atomics: reproducible results take the ATen sum.
    plan.forward_finish = args.mean && !plan.deterministic ? ForwardFinish::kFusedLossesAndMean
                                                           : ForwardFinish::kFusedLosses;
  } else {
    plan.forward_finish = ForwardFinish::kAtenLosses;
  }
  const bool fused_assembly = !walks_positives && kernels.assemble_backward && float_compute;
  if (walks_positives) {
    plan.backward_assembly = AssemblyPath::kPositiveWalk;
  } else if (fused_assembly && has_fused_weights(kernels) && !plan.deterministic) {
    plan.backward_assembly = AssemblyPath::kFusedWeightsAndAssembly;
  } else if (fused_assembly) {
    plan.backward_assembly = AssemblyPath::kFusedAssembly;
  } else {
    plan.backward_assembly = AssemblyPath::kAten;
  }
  // While a CUDA graph is captured even asking whether an earlier call's verdict has landed (an
  // event query) is refused and ends the capture: the verdicts wait for the next eager call.
  const bool host_may_wait_now = host_may_wait(kernels, args.features);
  if (kept != nullptr) {  // what the forward decided and read
    plan.temperature = kept->temperature;
  } else {
    bool unreadable = false;
    const bool in_memory =
        temperature_stays_in_memory(kernels, plan, args, host_may_wait_now, unreadable);
    if (unreadable && plan.refusal == Refusal::kNone) {
      plan.refusal = Refusal::kTemperatureUnreadable;
    }
    check_arguments(args);
    // Unread (the default) where the call is refused for it: nothing runs with the plan.
    if (in_memory) {
      plan.temperature = Temperature::in_memory(
          args.temperature.to(args.features.device(), at::kDouble).reshape({1}).contiguous());
    } else if (!unreadable) {
      plan.temperature = Temperature::on_host(read_temperature(args));
    }
  }
  plan.host_reads = !prepare_without_host_reads(args.features);
  plan.rows_type = args.features.scalar_type();
  plan.compute_type = kernels.compute_type(plan.rows_type);
  plan.forward_plain_because = plain_because(plan, kernels, args, /*forward=*/true);
  plan.backward_plain_because = plain_because(plan, kernels, args, /*forward=*/false);
  plan.forward_schedule = schedule_for(plan.forward_plain_because);
  plan.backward_schedule = schedule_for(plan.backward_plain_because);
  // Read on every call, so that a misspelt SCL_CUDA_SYMMETRIC_BACKWARD is an error on any device.
  const SymmetricBackwardWalk walk = symmetric_backward_walk_setting();
  if (kernels.walks_triangle && plan.backward_schedule == Schedule::kSymmetric) {
    // The triangle adds by atomics: reproducible results take the full rows.
    plan.symmetric_backward_walk = plan.deterministic ? SymmetricBackwardWalk::kRows : walk;
  } else {
    plan.symmetric_backward_walk = SymmetricBackwardWalk::kNone;
  }
  plan.grouped_forward = kernels.lse_and_anchor_losses &&
                         (plan.forward_finish == ForwardFinish::kFusedLosses ||
                          plan.forward_finish == ForwardFinish::kFusedLossesAndMean);
  plan.grouped_backward = kernels.weights_grads_and_assembly &&
                          plan.backward_assembly == AssemblyPath::kFusedWeightsAndAssembly;
  plan.value_checks = !host_may_wait_now ? ValueChecks::kSkipped
                      : plan.host_reads  ? ValueChecks::kOnHost
                                         : ValueChecks::kDeferred;
  plan.parallel_tiles = tiles_in_parallel(args);
  verdict_timing();  // a misspelt SCL_VALUE_CHECKS is an error on any device, from the first call
  return plan;
}

std::string CallPlan::describe() const {
  std::ostringstream out;
  out << "temperature: "
      << (temperature.is_in_memory() ? "device memory" : "host value") << "\n"
      << "forward_schedule: " << name(forward_schedule) << "\n"
      << "backward_schedule: " << name(backward_schedule) << "\n"
      << "host_temperature: ";
  if (temperature.is_on_host()) {
    out << 1 / temperature.inv_t();
  } else {
    out << "unread";
  }
  out << "\n"
      << "forward_plain_because: " << plain_because_names(forward_plain_because) << "\n"
      << "backward_plain_because: " << plain_because_names(backward_plain_because) << "\n"
      << "symmetric_temperature_floor: " << symmetric_temperature_floor(compute_type) << "\n"
      << "rows_dtype: " << dtype_name(rows_type) << "\n"
      << "compute_dtype: " << dtype_name(compute_type) << "\n"
      << "preparation: " << (fused_preparation ? "fused" : "aten") << "\n"
      << "host_reads: " << (host_reads ? "yes" : "no") << "\n"
      << "multi_label: " << name(multi_label) << "\n"
      << "forward_finish: " << name(forward_finish) << "\n"
      << "mean: " << (mean ? "inside the op" : "none") << "\n"
      << "backward_assembly: " << name(backward_assembly) << "\n"
      << "grouped_stages: " << grouped_stages_name(grouped_forward, grouped_backward) << "\n"
      << "value_checks: " << name(value_checks) << "\n"
      << "threads: " << (parallel_tiles ? "parallel tiles" : "calling thread") << "\n"
      << "deterministic: " << (deterministic ? "yes" : "no") << "\n"
      << "symmetric_backward_walk: " << name(symmetric_backward_walk) << "\n"
      << "cannot_run: " << name(refusal);
  return out.str();
}

std::string CallPlan::summary() const {
  std::string line = describe();
  for (size_t at = line.find('\n'); at != std::string::npos; at = line.find('\n', at)) {
    line.replace(at, 1, "; ");
  }
  return line;
}

void require_runnable(const CallPlan& plan, const SupConArgs& args) {
  switch (plan.refusal) {
    case Refusal::kNone:
      return;
    case Refusal::kNoBlas:
      TORCH_CHECK(false, refused(plan, "this backend's tiles, which multiply through BLAS",
                                 "this PyTorch build exports no BLAS (sgemm_, dgemm_): use "
                                 "backend='reference', or a PyTorch build with MKL or OpenBLAS"));
    case Refusal::kTooManyElements:
      TORCH_CHECK_VALUE(false, refused(plan, "rows of " + std::to_string(plan.rows_elements) +
                                                 " elements",
                                       "this backend's kernels take at most " +
                                           std::to_string(plan.max_rows_elements) +
                                           " (2^31 - 1, int32 offsets) per rows tensor: split "
                                           "the batch, or use another backend"));
    case Refusal::kNoFocalWalk: {
      std::ostringstream asked;
      asked << "focal_gamma=" << args.focal_gamma << " (the focal contrastive loss)";
      TORCH_CHECK_NOT_IMPLEMENTED(
          false, refused(plan, asked.str(),
                         "this backend's kernels have no walk over the focal loss's per-pair "
                         "terms; "
                         "scl_kernels.backends.focal_backends() lists the backends that have it"));
    }
    case Refusal::kNoGroupMask:
      TORCH_CHECK_NOT_IMPLEMENTED(
          false, refused(plan, "groups= (known false negatives, docs/MATH.md section 11)",
                         "this backend's tiles have no group mask; "
                         "scl_kernels.backends.group_backends() lists the backends that have it"));
    case Refusal::kNoPairWeights:
      TORCH_CHECK_NOT_IMPLEMENTED(
          false, refused(plan, "multi-hot labels (multi-label positives, docs/MATH.md section 11)",
                         "this backend's positive walk has no pair weights; "
                         "scl_kernels.backends.multi_label_backends() lists the backends that "
                         "have them"));
    case Refusal::kTemperatureUnreadable:
      TORCH_CHECK_VALUE(
          false, refused(plan, "a temperature tensor on the GPU while a CUDA graph is captured",
                         "it cannot be read then, and this call cannot take it from memory "
                         "(that needs the triton or cuda backend, float32, float16 or bfloat16 "
                         "rows, focal_gamma 0 and no torch.use_deterministic_algorithms(True)): "
                         "pass the temperature as a float, or capture without it"));
  }
}

}  // namespace scl

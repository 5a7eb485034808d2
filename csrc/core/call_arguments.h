// The fused op's arguments, listed once. The op schemas (forward, backward, plan), the C++
// arguments struct (SupConArgs), the kernels' and the autograd's parameter lists and their
// dispatcher signatures are all generated from the two lists below; the Python side reads the
// schemas (python_tests/api/test_call_arguments.py holds it to them). Adding an argument: one row
// here, then the lines that read it (docs/BACKENDS.md, "Adding an argument").
//
// The arguments (docs/MATH.md has the maths), and which stages of a call read them (the plan:
// call_plan.h; the preparation, the tiles, the losses, the weights, the assembly and the focal
// walk: tile_kernels.h):
//   features, labels   the rows [N, D] and their integer labels [N] (a negative label: no class),
//       or multi-hot labels [N, C] (multi_label below).
//       Read by the plan (shapes, dtypes, sizes), the preparation, the tiles and the assembly.
//   contrast, contrast_labels   a cross set's rows [M, D] and labels, or None: single set, where
//       the anchors are rows [anchor_offset, anchor_offset + num_anchors) of features, the
//       contrast set is every row and anchor i never sees its own row. In a cross set the anchors
//       are all feature rows, no column is excluded and anchor_offset is 0. Read as features
//       and labels are; a cross set takes the plain schedule.
//   temperature   t, a [] or [1] floating tensor on the CPU or the rows' device. The plan reads
//       it on the host or leaves it in memory (temperature.h); the tiles, the losses, the
//       weights, the assembly and the focal walk read the plan's value; backward's
//       temperature_grad asks for its gradient.
//   num_anchors, normalize   how many anchors; whether rows are L2-normalised first. Read by
//       the plan (the symmetric schedule needs every row an anchor and unit rows), the
//       preparation and the assembly.
//   anchor_offset   the first anchor row in single set: the preparation, the tiles' self column
//       and the assembly.
//   focal_gamma   0: SupCon; > 0: the focal contrastive loss,
//       (1/|P(i)|) sum_p (1 - pi_ip)^gamma (-log pi_ip) (docs/MATH.md, "Focal contrastive
//       loss"). The plan refuses it where the backend has no focal walk; the walk reads it.
//   mean   the loss is the mean of l_i over the anchors with positives (0-dim), the caller's
//       "mean" reduction inside the op; backward then takes its 0-dim gradient. Read by the
//       preparation (the mean's accumulators), the losses and the weights.
//   groups, contrast_groups   integer group ids per feature row [N] and per contrast row [M]
//       (a negative id: no group), or None; a cross set takes both or neither. A pair of one
//       group that is not a positive leaves the denominator (docs/MATH.md section 11). The plan
//       refuses them where the tiles have no group mask; the preparation compacts them and the
//       tiles mask those pairs.
//   multi_label   the rule for multi-hot labels: "any" (a pair sharing a class is positive,
//       weight 1) or "jaccard" (weight |Y_i & Y_j| / |Y_i | Y_j|); labels (and contrast_labels)
//       are then [N, C] bool or 0/1 integer rows (docs/MATH.md section 11), and the rule is
//       unread with one-dimensional labels. The plan sends such a call to the backend's positive
//       walk, refusing it where the walk has no pair weights; the preparation packs the classes
//       into 64-bit words and the walk weighs the pairs.
//
// Each row is X(C++ parameter type, name, schema declaration); the rows without a schema default
// come first, because the backward's schema puts lse between the two lists.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <string>
#include <tuple>

#define SCL_REQUIRED_CALL_ARGUMENTS(FIRST, NEXT)                                      \
  FIRST(const at::Tensor&, features, "Tensor features")                               \
  NEXT(const at::Tensor&, labels, "Tensor labels")                                    \
  NEXT(const std::optional<at::Tensor>&, contrast, "Tensor? contrast")                \
  NEXT(const std::optional<at::Tensor>&, contrast_labels, "Tensor? contrast_labels")  \
  NEXT(const at::Tensor&, temperature, "Tensor temperature")                          \
  NEXT(int64_t, num_anchors, "int num_anchors")                                       \
  NEXT(bool, normalize, "bool normalize")

#define SCL_DEFAULTED_CALL_ARGUMENTS(X)                                                 \
  X(int64_t, anchor_offset, "int anchor_offset=0")                                      \
  X(double, focal_gamma, "float focal_gamma=0.0")                                       \
  X(bool, mean, "bool mean=False")                                                      \
  X(const std::optional<at::Tensor>&, groups, "Tensor? groups=None")                    \
  X(const std::optional<at::Tensor>&, contrast_groups, "Tensor? contrast_groups=None")        \
  X(c10::string_view, multi_label, "str multi_label=\"any\"")

#define SCL_CALL_ARGUMENTS(FIRST, NEXT) \
  SCL_REQUIRED_CALL_ARGUMENTS(FIRST, NEXT) SCL_DEFAULTED_CALL_ARGUMENTS(NEXT)

// The pieces a row becomes: a parameter, an argument, a type, a schema declaration; FIRST starts
// a comma-separated list, NEXT continues one.
#define SCL_PARAMETER_FIRST(type, name, schema) type name
#define SCL_PARAMETER_NEXT(type, name, schema) , type name
#define SCL_ARGUMENT_FIRST(type, name, schema) name
#define SCL_ARGUMENT_NEXT(type, name, schema) , name
#define SCL_TYPE_FIRST(type, name, schema) type
#define SCL_TYPE_NEXT(type, name, schema) , type
#define SCL_SCHEMA_FIRST(type, name, schema) schema
#define SCL_SCHEMA_NEXT(type, name, schema) ", " schema

// The forward's parameters and arguments, and the backward's: grad_loss, the forward's
// arguments with lse after the required ones, and temperature_grad.
#define SCL_FORWARD_PARAMETERS SCL_CALL_ARGUMENTS(SCL_PARAMETER_FIRST, SCL_PARAMETER_NEXT)
#define SCL_FORWARD_ARGUMENTS SCL_CALL_ARGUMENTS(SCL_ARGUMENT_FIRST, SCL_ARGUMENT_NEXT)
#define SCL_BACKWARD_PARAMETERS                                                      \
  const at::Tensor& grad_loss SCL_REQUIRED_CALL_ARGUMENTS(SCL_PARAMETER_NEXT,        \
                                                          SCL_PARAMETER_NEXT),       \
      const at::Tensor& lse SCL_DEFAULTED_CALL_ARGUMENTS(SCL_PARAMETER_NEXT),        \
      bool temperature_grad
#define SCL_BACKWARD_ARGUMENTS                                                          \
  grad_loss SCL_REQUIRED_CALL_ARGUMENTS(SCL_ARGUMENT_NEXT, SCL_ARGUMENT_NEXT), lse      \
      SCL_DEFAULTED_CALL_ARGUMENTS(SCL_ARGUMENT_NEXT),                                  \
      temperature_grad

namespace scl {

// One call's arguments, as the schema names them.
struct SupConArgs {
#define SCL_FIELD(type, name, schema) type name;
  SCL_CALL_ARGUMENTS(SCL_FIELD, SCL_FIELD)
#undef SCL_FIELD
};

// A schema's optional tensor (`Tensor?`) from a tensor that is undefined where it is absent.
inline std::optional<at::Tensor> present(const at::Tensor& t) {
  return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt;
}

using OpOutputs = std::tuple<at::Tensor, at::Tensor, at::Tensor>;
// The dispatcher signatures of the op's kernels (c10::TypedOperatorHandle).
using ForwardSignature = OpOutputs(SCL_CALL_ARGUMENTS(SCL_TYPE_FIRST, SCL_TYPE_NEXT));
using BackwardSignature = OpOutputs(
    const at::Tensor& SCL_REQUIRED_CALL_ARGUMENTS(SCL_TYPE_NEXT, SCL_TYPE_NEXT),
    const at::Tensor& SCL_DEFAULTED_CALL_ARGUMENTS(SCL_TYPE_NEXT), bool);

// The schemas after the op's name. Forward returns the loss per anchor (0 for anchors without
// positives; 0-dim with mean), the float64 log-sum-exp per anchor that backward needs, and
// |P(i)|. Backward returns the gradients w.r.t. features, contrast ([0, D] without a contrast
// set) and temperature (zeros when temperature_grad is false: autograd asks only when the
// temperature requires grad). The plan is the description of what the forward would do
// (csrc/core/call_plan.h).
inline const std::string kForwardSchema =
    "(" SCL_CALL_ARGUMENTS(SCL_SCHEMA_FIRST, SCL_SCHEMA_NEXT)
    ") -> (Tensor loss, Tensor lse, Tensor num_positives)";
inline const std::string kBackwardSchema =
    "(Tensor grad_loss" SCL_REQUIRED_CALL_ARGUMENTS(SCL_SCHEMA_NEXT, SCL_SCHEMA_NEXT)
    ", Tensor lse" SCL_DEFAULTED_CALL_ARGUMENTS(SCL_SCHEMA_NEXT)
    ", bool temperature_grad=True) -> "
    "(Tensor grad_features, Tensor grad_contrast, Tensor grad_temperature)";
inline const std::string kPlanSchema =
    "(" SCL_CALL_ARGUMENTS(SCL_SCHEMA_FIRST, SCL_SCHEMA_NEXT) ") -> str";

}  // namespace scl

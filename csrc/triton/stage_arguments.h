// The Triton stage ops' arguments, listed once per op: their schemas (csrc/scl_ops.cpp), the
// dispatcher signatures and the calls of supcon_triton.cpp are made from the lists below; the
// Python functions that implement the ops (scl_kernels/backends/triton, registration.STAGE_OPS)
// are held to the schemas by python_tests/backends/test_triton_stage_ops.py.
//
// Each row is X(C++ parameter type, name, schema declaration, the value supcon_triton.cpp passes);
// the value names that file's locals (`p`: the call's SupConProblem, csrc/core/supcon_problem.h;
// `schedule`; and the stage's own inputs, csrc/core/tile_kernels.h) and is read only there.
// Where a temperature is passed, `temperature` ([1] float64) holds t: in device memory, where the
// kernels read it, with temperature_in_memory; else the host value the call read and checked, on
// the CPU (scl::Temperature, csrc/core/temperature.h). The schemas have no optional tensor but where a
// row says so: a term left out is an empty tensor.
#pragma once

// The tiles' inputs, shared by the ops that walk the tiles; the group mask's ids where the call
// has groups (SupConProblem::anchor_group and the rest): the int32 group ids with the int32 pair
// classes or, for multi-hot labels, the rows' int64 class words in their place (given whenever
// the call has multi-hot labels, read only with groups).
#define SCL_TRITON_TILE_ARGUMENTS(FIRST, NEXT)                                                    \
  FIRST(const at::Tensor&, q, "Tensor q", p.q)                                                    \
  NEXT(const at::Tensor&, z, "Tensor z", p.z)                                                     \
  NEXT(const at::Tensor&, q_inv_norm, "Tensor q_inv_norm", p.q_inv_norm)                          \
  NEXT(const at::Tensor&, z_inv_norm, "Tensor z_inv_norm", p.z_inv_norm)                          \
  NEXT(const at::Tensor&, temperature, "Tensor temperature", p.temperature.tensor())              \
  NEXT(bool, temperature_in_memory, "bool temperature_in_memory",                                 \
       p.temperature.is_in_memory())                                                              \
  NEXT(int64_t, self_offset, "int self_offset", p.self_offset())                                  \
  NEXT(bool, symmetric, "bool symmetric", schedule == Schedule::kSymmetric)                      \
  NEXT(const std::optional<at::Tensor>&, anchor_group, "Tensor? anchor_group",                   \
       present(p.anchor_group))                                                                   \
  NEXT(const std::optional<at::Tensor>&, contrast_group, "Tensor? contrast_group",               \
       present(p.contrast_group))                                                                 \
  NEXT(const std::optional<at::Tensor>&, anchor_pair_class, "Tensor? anchor_pair_class",         \
       present(p.anchor_pair_class))                                                              \
  NEXT(const std::optional<at::Tensor>&, contrast_pair_class, "Tensor? contrast_pair_class",     \
       present(p.contrast_pair_class))                                                            \
  NEXT(const std::optional<at::Tensor>&, anchor_words, "Tensor? anchor_words",                   \
       present(p.anchor_words))                                                                   \
  NEXT(const std::optional<at::Tensor>&, contrast_words, "Tensor? contrast_words",               \
       present(p.contrast_words))

// The log-sum-exp per anchor -> Tensor lse.
#define SCL_TRITON_LSE_TILES_ARGUMENTS(FIRST, NEXT) SCL_TRITON_TILE_ARGUMENTS(FIRST, NEXT)

// The gradient tiles (scl::GradCoefficients `c`; the symmetric schedule's lse parts empty)
// -> (Tensor dq, Tensor dz); `deterministic` is the plan's (no atomics).
#define SCL_TRITON_GRAD_TILES_ARGUMENTS(FIRST, NEXT)                                              \
  SCL_TRITON_TILE_ARGUMENTS(FIRST, NEXT)                                                          \
  NEXT(bool, deterministic, "bool deterministic", p.deterministic)                                \
  NEXT(const at::Tensor&, coef, "Tensor coef", c.coef)                                            \
  NEXT(const at::Tensor&, lse_hi, "Tensor lse_hi", symmetric ? none : c.lse_hi)                   \
  NEXT(const at::Tensor&, lse_lo, "Tensor lse_lo", symmetric ? none : c.lse_lo)

// The walk over positive pairs of the focal loss and of multi-hot labels (scl::PositiveWalkInputs
// `walk`; an empty grad_weight asks for the forward only; the class words given for multi-hot
// labels, whose pairs `jaccard` weighs by that rule, else by "any") -> (Tensor loss_sum,
// Tensor hterm_sum, Tensor dq, Tensor dz). The walk reads t on the host.
#define SCL_TRITON_POSITIVE_WALK_ARGUMENTS(FIRST, NEXT)                                           \
  FIRST(const at::Tensor&, q, "Tensor q", p.q)                                                    \
  NEXT(const at::Tensor&, z, "Tensor z", p.z)                                                     \
  NEXT(const at::Tensor&, q_inv_norm, "Tensor q_inv_norm", p.q_inv_norm)                          \
  NEXT(const at::Tensor&, z_inv_norm, "Tensor z_inv_norm", p.z_inv_norm)                          \
  NEXT(double, inv_t, "float inv_t", p.temperature.inv_t())                                       \
  NEXT(int64_t, self_offset, "int self_offset", p.self_offset())                                  \
  NEXT(const at::Tensor&, anchor_class, "Tensor anchor_class", walk.anchor_class)                 \
  NEXT(const at::Tensor&, contrast_class, "Tensor contrast_class", walk.contrast_class)           \
  NEXT(const at::Tensor&, lse_hi, "Tensor lse_hi", walk.lse_hi)                                   \
  NEXT(const at::Tensor&, lse_lo, "Tensor lse_lo", walk.lse_lo)                                   \
  NEXT(double, gamma, "float gamma", walk.gamma)                                                  \
  NEXT(const at::Tensor&, grad_weight, "Tensor grad_weight", walk.grad_weight)                    \
  NEXT(const std::optional<at::Tensor>&, anchor_words, "Tensor? anchor_words",                   \
       present(p.anchor_words))                                                                   \
  NEXT(const std::optional<at::Tensor>&, contrast_words, "Tensor? contrast_words",               \
       present(p.contrast_words))                                                                 \
  NEXT(bool, jaccard, "bool jaccard", p.multi_label == MultiLabelRule::kJaccard)

// The positives of multi-hot labels (scl::MultiLabelPositives), from the pairs the walk above
// weighs -> (Tensor num_positives, Tensor weight_sum).
#define SCL_TRITON_MULTI_LABEL_POSITIVES_ARGUMENTS(FIRST, NEXT)                                   \
  FIRST(const at::Tensor&, anchor_words, "Tensor anchor_words", p.anchor_words)                   \
  NEXT(const at::Tensor&, contrast_words, "Tensor contrast_words", p.contrast_words)              \
  NEXT(int64_t, self_offset, "int self_offset", p.self_offset())                                  \
  NEXT(bool, jaccard, "bool jaccard", p.multi_label == MultiLabelRule::kJaccard)

// The forward's tiles and its per-anchor losses in one op (scl::AnchorLossInputs `finish`): the
// log-sum-exp as lse_tiles gives it, and the losses from it in one kernel, or, given the mean's
// zeroed accumulators (mean_sums), their mean, the accumulators left holding the totals
// -> (Tensor lse, Tensor loss).
#define SCL_TRITON_LSE_AND_LOSSES_ARGUMENTS(FIRST, NEXT)                                          \
  SCL_TRITON_TILE_ARGUMENTS(FIRST, NEXT)                                                          \
  NEXT(const at::Tensor&, class_sums, "Tensor class_sums", p.class_sums)                          \
  NEXT(const at::Tensor&, anchor_class, "Tensor anchor_class", p.anchor_class)                    \
  NEXT(const at::Tensor&, num_positives, "Tensor num_positives", p.num_positives)                 \
  NEXT(bool, single_set, "bool single_set", p.single_set)                                         \
  NEXT(const std::optional<at::Tensor>&, mean_sums, "Tensor(a!)? mean_sums",                      \
       present(finish.mean_sums))

// The backward's assembly for one output's rows in one kernel (scl::BackwardAssemblyInputs
// `side`; an empty extra, anchor_weight or row_class leaves its term out) -> (Tensor grad,
// Tensor unit_dot).
#define SCL_TRITON_ASSEMBLE_BACKWARD_ARGUMENTS(FIRST, NEXT)                                       \
  FIRST(const at::Tensor&, rows, "Tensor rows", side.rows)                                        \
  NEXT(const at::Tensor&, inv_norm, "Tensor inv_norm", side.inv_norm)                             \
  NEXT(const at::Tensor&, grads, "Tensor grads", side.grads)                                      \
  NEXT(const at::Tensor&, extra, "Tensor extra", given(side.extra))                               \
  NEXT(int64_t, anchor_offset, "int anchor_offset", p.anchor_row())                               \
  NEXT(const at::Tensor&, anchor_weight, "Tensor anchor_weight", given(side.anchor_weight))       \
  NEXT(const at::Tensor&, anchor_class, "Tensor anchor_class", p.anchor_class)                    \
  NEXT(const at::Tensor&, class_sums, "Tensor class_sums", p.class_sums)                          \
  NEXT(bool, self_in_class, "bool self_in_class", p.single_set)                                   \
  NEXT(const at::Tensor&, row_class, "Tensor row_class", given(side.row_class))                   \
  NEXT(const at::Tensor&, weighted_sums, "Tensor weighted_sums", given(side.weighted_sums))       \
  NEXT(bool, class_shares_weight, "bool class_shares_weight", side.class_shares_weight)           \
  NEXT(const at::Tensor&, temperature, "Tensor temperature", p.temperature.tensor())              \
  NEXT(bool, temperature_in_memory, "bool temperature_in_memory",                                 \
       p.temperature.is_in_memory())                                                              \
  NEXT(bool, normalize, "bool normalize", p.normalize)                                            \
  NEXT(double, max_inv_norm, "float max_inv_norm", 1.0 / kNormEps)                                \
  NEXT(at::ScalarType, out_dtype, "ScalarType out_dtype", side.out_dtype)

// The preparation of one set of rows in one kernel (scl::RowPreparationInputs `in`)
// -> (Tensor inv_norm, Tensor row_class, Tensor num_positives, Tensor class_sums,
// Tensor non_finite, Tensor mean_sums), the last three empty when not asked for.
#define SCL_TRITON_PREPARE_ROWS_ARGUMENTS(FIRST, NEXT)                                            \
  FIRST(const at::Tensor&, rows, "Tensor rows", in.rows)                                          \
  NEXT(const at::Tensor&, labels, "Tensor labels", in.labels)                                     \
  NEXT(const at::Tensor&, sorted_labels, "Tensor sorted_labels", in.sorted_labels)                \
  NEXT(bool, normalize, "bool normalize", in.normalize)                                           \
  NEXT(bool, self_in_class, "bool self_in_class", in.self_in_class)                               \
  NEXT(bool, class_sums, "bool class_sums", in.class_sums)                                        \
  NEXT(bool, check_values, "bool check_values", in.check_values)                                  \
  NEXT(bool, mean_sums, "bool mean_sums", in.mean_sums)

// The backward's per-anchor weights (scl::AnchorWeightInputs `w`), its gradient tiles and the
// assembly of each output (scl::WeightsGradsAndAssemblyInputs `stages`) in one op:
// anchors_with_positives is given where grad_loss is the mean's (0-dim); with
// class_shares_weight no weighted class sums are formed; the contrast's gradient and unit dots
// are empty in single set -> (Tensor grad_features, Tensor unit_dot_features,
// Tensor grad_contrast, Tensor unit_dot_contrast).
#define SCL_TRITON_WEIGHTS_GRADS_AND_ASSEMBLY_ARGUMENTS(FIRST, NEXT)                              \
  FIRST(const at::Tensor&, grad_loss, "Tensor grad_loss", w.grad_loss)                            \
  NEXT(const std::optional<at::Tensor>&, anchors_with_positives,                                  \
       "Tensor? anchors_with_positives", present(w.anchors_with_positives))                       \
  NEXT(const at::Tensor&, lse, "Tensor lse", w.lse)                                               \
  SCL_TRITON_TILE_ARGUMENTS(NEXT, NEXT)                                                           \
  NEXT(bool, deterministic, "bool deterministic", p.deterministic)                                \
  NEXT(const at::Tensor&, num_positives, "Tensor num_positives", p.num_positives)                 \
  NEXT(const at::Tensor&, anchor_class, "Tensor anchor_class", p.anchor_class)                    \
  NEXT(const at::Tensor&, contrast_class, "Tensor contrast_class", p.contrast_class)              \
  NEXT(const at::Tensor&, class_sums, "Tensor class_sums", p.class_sums)                          \
  NEXT(bool, single_set, "bool single_set", p.single_set)                                         \
  NEXT(int64_t, anchor_offset, "int anchor_offset", p.anchor_row())                               \
  NEXT(bool, class_shares_weight, "bool class_shares_weight", stages.class_shares_weight)         \
  NEXT(bool, normalize, "bool normalize", p.normalize)                                            \
  NEXT(double, max_inv_norm, "float max_inv_norm", 1.0 / kNormEps)                                \
  NEXT(at::ScalarType, features_dtype, "ScalarType features_dtype", p.q.scalar_type())            \
  NEXT(at::ScalarType, contrast_dtype, "ScalarType contrast_dtype", p.z.scalar_type())

// The pieces a row becomes (call_arguments.h's, with the value column): FIRST starts a
// comma-separated list, NEXT continues one.
#define SCL_STAGE_TYPE_FIRST(type, name, schema, value) type
#define SCL_STAGE_TYPE_NEXT(type, name, schema, value) , type
#define SCL_STAGE_SCHEMA_FIRST(type, name, schema, value) schema
#define SCL_STAGE_SCHEMA_NEXT(type, name, schema, value) ", " schema
#define SCL_STAGE_VALUE_FIRST(type, name, schema, value) value
#define SCL_STAGE_VALUE_NEXT(type, name, schema, value) , value

// A stage op's schema: its name, its arguments' list, its results.
#define SCL_STAGE_SCHEMA(op, ARGUMENTS, results)                                                  \
  op "(" ARGUMENTS(SCL_STAGE_SCHEMA_FIRST, SCL_STAGE_SCHEMA_NEXT) ") -> " results
// A stage op's parameter types and the values a call passes, from its arguments' list.
#define SCL_STAGE_TYPES(ARGUMENTS) ARGUMENTS(SCL_STAGE_TYPE_FIRST, SCL_STAGE_TYPE_NEXT)
#define SCL_STAGE_VALUES(ARGUMENTS) ARGUMENTS(SCL_STAGE_VALUE_FIRST, SCL_STAGE_VALUE_NEXT)

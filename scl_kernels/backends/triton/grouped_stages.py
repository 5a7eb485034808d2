"""The stages that run back to back, as one op each way (scl::TileKernels::lse_and_anchor_losses
and weights_grads_and_assembly, csrc/core/tile_kernels.h): every call of a Triton stage op is a
crossing from the shared core into Python, so a step crosses once for the forward's tiles and
losses and once for the backward's weights, tiles and assembly, and what passes between those
stages (the log-sum-exp's parts, the coefficients, the weights, the tiles' gradients) stays here.
The call plan takes these wherever the fused losses, or the fused weights and assembly, run.
"""
from .anchor_losses import anchor_losses
from .anchor_weights import anchor_weights
from .backward_assembly import assemble
from .launch import temperature_of
from .tiles import group_mask, tile_gradients, tile_lse


def lse_and_losses(q, z, q_inv_norm, z_inv_norm, temperature, temperature_in_memory,
                   self_offset, symmetric, anchor_group, contrast_group, anchor_pair_class,
                   contrast_pair_class, anchor_words, contrast_words, class_sums, anchor_class,
                   num_positives, single_set, mean_sums):
    """(lse, loss): lse_tiles's log-sum-exp, and the per-anchor losses from it, or with
    mean_sums (else None) their mean (anchor_losses.py); the arguments:
    csrc/triton/stage_arguments.h."""
    resolved = temperature_of(temperature, temperature_in_memory)  # once per op call
    lse = tile_lse(q, z, q_inv_norm, z_inv_norm, resolved, self_offset, symmetric,
                   group_mask(anchor_group, contrast_group, anchor_pair_class,
                              contrast_pair_class, anchor_words, contrast_words))
    return lse, anchor_losses(q, q_inv_norm, class_sums, anchor_class, num_positives, lse,
                              resolved, single_set, mean_sums)


def weights_grads_and_assembly(grad_loss, anchors_with_positives, lse, q, z, q_inv_norm,
                               z_inv_norm, temperature, temperature_in_memory, self_offset,
                               symmetric, anchor_group, contrast_group, anchor_pair_class,
                               contrast_pair_class, anchor_words, contrast_words, deterministic,
                               num_positives, anchor_class, contrast_class, class_sums,
                               single_set, anchor_offset, class_shares_weight, normalize,
                               max_inv_norm, features_dtype, contrast_dtype):
    """(grad_features, unit_dot_features, grad_contrast, unit_dot_contrast), the contrast's
    empty in single set: the anchor weights (anchor_weights.py), the gradient tiles from their
    coefficients (tiles.py) and each output's assembly (backward_assembly.py), as the shared
    core composes the separate stages; the arguments: csrc/triton/stage_arguments.h."""
    resolved = temperature_of(temperature, temperature_in_memory)  # once per op call
    classes = 0 if class_shares_weight else class_sums.shape[0]
    weight, weighted_sums, coef, lse_hi, lse_lo = anchor_weights(
        grad_loss, anchors_with_positives, lse, num_positives, q, q_inv_norm, anchor_class,
        classes, resolved, symmetric)
    dq, dz = tile_gradients(q, z, q_inv_norm, z_inv_norm, resolved, self_offset, symmetric,
                            group_mask(anchor_group, contrast_group, anchor_pair_class,
                                       contrast_pair_class, anchor_words, contrast_words),
                            deterministic, coef, lse_hi, lse_lo)
    if single_set:
        # One output, the contrast rows: the anchors' side is added at their rows, and the
        # contrast part by the weighted sums unless the class sums stand in for them.
        grad, dot = assemble(z, z_inv_norm, dz, dq, anchor_offset, weight, anchor_class,
                             class_sums, True, None if class_shares_weight else contrast_class,
                             weighted_sums, class_shares_weight, resolved, normalize, max_inv_norm,
                             features_dtype)
        absent = dot.new_empty((0,))
        return grad, dot, absent, absent
    features, features_dot = assemble(q, q_inv_norm, dq, None, 0, weight, anchor_class,
                                      class_sums, False, None, None, False, resolved, normalize,
                                      max_inv_norm, features_dtype)
    contrast, contrast_dot = assemble(z, z_inv_norm, dz, None, 0, None, anchor_class, class_sums,
                                      False, contrast_class, weighted_sums, False, resolved,
                                      normalize, max_inv_norm, contrast_dtype)
    return features, features_dot, contrast, contrast_dot

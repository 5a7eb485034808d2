"""The two tiled steps of the shared core (csrc/core/tile_kernels.h) on the Triton backend: the
ops scl::supcon_triton_lse_tiles (the log-sum-exp per anchor) and scl::supcon_triton_grad_tiles
(the softmax part of the gradient), which csrc/triton/supcon_triton.cpp calls, each choosing the
symmetric or the plain schedule's launchers (launch.py); grouped_stages.py runs them between the
fused stages around them in one op each way. The other O(N D) stages are the other modules'
(row_preparation.py, anchor_losses.py, anchor_weights.py, backward_assembly.py).
"""
import torch

from . import launch, multi_hot

KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def kernel_rows(x):
    """Rows as the kernels read them: contiguous, float64 as float32 (the kernels compute in fp32).
    The call plan has refused rows past the int32 offsets the kernels address them with
    (TileKernels::max_rows_elements)."""
    return (x if x.dtype in KERNEL_DTYPES else x.float()).contiguous()


def kernel_scale(inv_norm):
    """Inverse norms as the kernels read them: contiguous float32 (a dtype test in Python instead
    of a conversion call, since they mostly are)."""
    return (inv_norm if inv_norm.dtype == torch.float32 else inv_norm.float()).contiguous()


def _operands(q, z, q_inv_norm, z_inv_norm):
    return (kernel_rows(q), kernel_rows(z), kernel_scale(q_inv_norm),
            kernel_scale(z_inv_norm))


def group_mask(anchor_group, contrast_group, anchor_pair_class, contrast_pair_class,
               anchor_words, contrast_words):
    """The tiles' launch.GroupMask from the ops' optional tensors (csrc/triton/stage_arguments.h:
    the group ids with the pair classes, or with the class words of multi-hot labels, which
    become the classes numbered within each group, multi_hot.group_class_words), or None without
    groups."""
    if anchor_group is None:
        return None
    if anchor_words is not None:
        m = anchor_group.shape[0]
        local = multi_hot.group_class_words(torch.cat([anchor_group, contrast_group]),
                                            torch.cat([anchor_words, contrast_words]))
        return launch.GroupMask(anchor_group.contiguous(), contrast_group.contiguous(),
                                local[:m].contiguous(), local[m:].contiguous(), local.shape[1])
    return launch.GroupMask(anchor_group.contiguous(), contrast_group.contiguous(),
                            anchor_pair_class.contiguous(), contrast_pair_class.contiguous())


def lse_tiles(q, z, q_inv_norm, z_inv_norm, temperature, temperature_in_memory, self_offset,
              symmetric, anchor_group, contrast_group, anchor_pair_class, contrast_pair_class,
              anchor_words, contrast_words):
    """The op: the log-sum-exp per anchor (tile_lse), its temperature resolved once."""
    return tile_lse(q, z, q_inv_norm, z_inv_norm,
                    launch.temperature_of(temperature, temperature_in_memory), self_offset,
                    symmetric, group_mask(anchor_group, contrast_group, anchor_pair_class,
                                          contrast_pair_class, anchor_words, contrast_words))


def tile_lse(q, z, q_inv_norm, z_inv_norm, temperature, self_offset, symmetric, groups):
    """The log-sum-exp per anchor; `temperature`: the op call's launch.Temperature; `groups`: a
    launch.GroupMask, or None."""
    z, z_scale = kernel_rows(z), kernel_scale(z_inv_norm)
    if symmetric:  # the anchors are the rows of z
        return launch.lse_symmetric(z, z_scale, temperature, groups)
    q, q_scale = kernel_rows(q), kernel_scale(q_inv_norm)
    return launch.lse_plain(q, z, q_scale, z_scale, temperature, self_offset, groups)


def grad_tiles(q, z, q_inv_norm, z_inv_norm, temperature, temperature_in_memory, self_offset,
               symmetric, anchor_group, contrast_group, anchor_pair_class, contrast_pair_class,
               anchor_words, contrast_words, deterministic, coef, lse_hi, lse_lo):
    """The op: (dq, dz), dq empty for the symmetric schedule (whose dz holds both sides)."""
    dq, dz = tile_gradients(q, z, q_inv_norm, z_inv_norm,
                            launch.temperature_of(temperature, temperature_in_memory),
                            self_offset, symmetric,
                            group_mask(anchor_group, contrast_group, anchor_pair_class,
                                       contrast_pair_class, anchor_words, contrast_words),
                            deterministic, coef, lse_hi, lse_lo)
    return dz.new_empty((0,)) if dq is None else dq, dz


def tile_gradients(q, z, q_inv_norm, z_inv_norm, temperature, self_offset, symmetric, groups,
                   deterministic, coef, lse_hi, lse_lo):
    """(dq, dz) of the tiles, dq None for the symmetric schedule; lse_hi and lse_lo unread
    there. `temperature`: the op call's launch.Temperature; `groups`: a launch.GroupMask, or
    None; `deterministic`: the plan's (no atomics: the column split and the contrast side's
    adds are left out)."""
    z, z_scale = kernel_rows(z), kernel_scale(z_inv_norm)
    coef = kernel_scale(coef)
    if symmetric:  # the anchors are the rows of z
        return None, launch.grad_symmetric(z, z_scale, coef, temperature, deterministic, groups)
    q, q_scale = kernel_rows(q), kernel_scale(q_inv_norm)
    return launch.grad_plain(q, z, q_scale, z_scale, coef, lse_hi, lse_lo, temperature,
                             self_offset, deterministic, groups)

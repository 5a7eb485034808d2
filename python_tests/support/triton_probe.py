"""A probe of what Triton's interpreter can compute (backend_matrix.budget_for asks it once)."""
import torch
import triton
import triton.language as tl


@triton.jit
def _dot_kernel(a_ptr, b_ptr, out_ptr, BLOCK: tl.constexpr):
    r = tl.arange(0, BLOCK)
    a = tl.load(a_ptr + r[:, None] * BLOCK + r[None, :])
    b = tl.load(b_ptr + r[:, None] * BLOCK + r[None, :])
    tl.store(out_ptr + r[:, None] * BLOCK + r[None, :], tl.dot(a, b))


def bf16_dot(a, b):
    """a @ b of two 16 x 16 bfloat16 tensors, accumulated in float32 by one tl.dot."""
    out = torch.empty(16, 16, dtype=torch.float32, device=a.device)
    _dot_kernel[(1,)](a.contiguous(), b.contiguous(), out, BLOCK=16)
    return out

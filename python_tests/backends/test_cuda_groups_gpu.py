"""Known false negatives (groups=, docs/MATH.md section 11) on the real CUDA kernels, against the
float64 reference: the group mask in every walk of both families (mma.sync for fp32, wgmma on
sm_90a for 16-bit rows at D <= 256, both widths), both schedules, the symmetric backward's
triangle and full rows, sizes that end mid-tile. Skipped without a CUDA GPU and the CUDA
kernels; without one, the dry run checks the glue and the same per-pair test
(test_cuda_dry_run.py, test_groups*)."""
import pytest
import torch

from scl_kernels import backends
from scl_kernels._testing import test_hooks
from support import needs
from support.layouts import LAYOUTS, make_layout, with_groups
from support.reference64 import check_against_reference

gpu = pytest.mark.skipif(
    not (torch.cuda.is_available() and backends.cuda_kernels_built()),
    reason="needs a CUDA GPU and the library built with the CUDA kernels (SCL_BUILD_CUDA=1)")


@gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("d", [100, 200])  # 16-bit on sm_90a: the 128- and 256-wide kernels
@pytest.mark.parametrize("temperature", [0.02, 0.1])  # 0.1: the symmetric schedule where it runs
def test_layouts_against_reference(layout, dtype, d, temperature, cuda_randn, cuda_randint, gen):
    kw = with_groups(make_layout(layout, cuda_randn, cuda_randint, dtype=dtype, n=300, d=d),
                 cuda_randint, 6)
    check_against_reference("cuda", generator=gen, compute_dtype=torch.float32,
                            temperature=temperature, **kw)


@gpu
@needs.hooks
@pytest.mark.parametrize("walk", ["triangle", "triangle-async", "rows"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n,d", [(1, 5), (129, 64), (385, 100), (1000, 128)])
def test_symmetric_backward_walks(walk, dtype, n, d, cuda_randn, cuda_randint, gen):
    """The single set's symmetric schedule with groups, each backward walk (the triangle's
    weights serve both sides of a tile, masked once), odd row-block counts with a padding
    partner."""
    x = cuda_randn(n, d, dtype=dtype)
    labels, groups = cuda_randint(0, 7, (n,)), cuda_randint(-1, max(1, n // 20), (n,))
    with test_hooks(symmetric_backward_walk=walk):
        check_against_reference("cuda", x, labels, 0.1, generator=gen,
                                compute_dtype=torch.float32, groups=groups)


@gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_group_for_all(dtype, cuda_randn, cuda_randint, gen):
    """Every row in one group: each denominator is the anchor's positives; anchors without
    positives have no column left, no loss and finite gradients."""
    n = 260
    x, labels = cuda_randn(n, 64, dtype=dtype), cuda_randint(0, 40, (n,))
    check_against_reference("cuda", x, labels, 0.1, generator=gen, compute_dtype=torch.float32,
                            groups=torch.zeros(n, dtype=torch.long, device=x.device))

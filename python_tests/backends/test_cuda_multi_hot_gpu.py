"""Multi-hot labels (multi_label "any" / "jaccard", docs/MATH.md section 11) on the CUDA backend,
against the float64 reference: the sums over class subsets gathered on the GPU
(csrc/core/class_subset_gathers.cpp) for rows of few classes and the class overlaps in blocks of
pairs (csrc/core/class_overlap_products.cpp) for rows of many, beside the real tile kernels,
every layout, both rules, groups, both kernel families, reproducible results, a CUDA graph's
replays. Skipped without a CUDA GPU and the CUDA kernels; without one, the dry run checks the
same glue on CPU tensors (test_cuda_dry_run.py, test_multi_hot*)."""
import pytest
import torch

import scl_kernels
from scl_kernels import backends
from scl_kernels._testing import test_hooks
from support.cuda_graphs import capture
from support.layouts import (few_class_rows, make_layout, many_class_rows, with_groups,
                             with_multi_hot_rows)
from support.reference64 import check_against_reference

gpu = pytest.mark.skipif(
    not (torch.cuda.is_available() and backends.cuda_kernels_built()),
    reason="needs a CUDA GPU and the library built with the CUDA kernels (SCL_BUILD_CUDA=1)")
LABELLED = ["single_all", "multiview_all", "multiview_one", "cross_labels", "cross_multiview"]


@gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout", LABELLED)
@pytest.mark.parametrize("rule", ["any", "jaccard"])
@pytest.mark.parametrize("draw", [few_class_rows, many_class_rows], ids=["few", "many"])
def test_layouts_against_reference(layout, dtype, rule, draw, cuda_randn, cuda_randint, gen):
    kw = make_layout(layout, cuda_randn, cuda_randint, dtype=dtype, n=300, d=100)
    check_against_reference("cuda", generator=gen, compute_dtype=torch.float32,
                            multi_label=rule, **with_multi_hot_rows(kw, cuda_randint, 130, draw))


@gpu
@pytest.mark.parametrize("layout", ["single_all", "cross_labels"])
@pytest.mark.parametrize("rule", ["any", "jaccard"])
@pytest.mark.parametrize("draw", [few_class_rows, many_class_rows], ids=["few", "many"])
def test_groups_against_reference(layout, rule, draw, cuda_randn, cuda_randint, gen):
    """Groups: the tiles' mask of row ids, the pairs of one group that share a class put back
    (csrc/core/group_shared_class_pairs.cpp)."""
    kw = make_layout(layout, cuda_randn, cuda_randint, dtype=torch.bfloat16, n=300, d=100)
    kw = with_groups(with_multi_hot_rows(kw, cuda_randint, 130, draw), cuda_randint, 6)
    check_against_reference("cuda", generator=gen, compute_dtype=torch.float32,
                            multi_label=rule, **kw)


@gpu
@pytest.mark.parametrize("rule", ["any", "jaccard"])
def test_reproducible_in_deterministic_mode(rule, cuda_randn, cuda_randint):
    n = 4000
    x = cuda_randn(n, 128, dtype=torch.bfloat16).requires_grad_(True)
    hot = few_class_rows(cuda_randint, n, 40)
    runs = []
    torch.use_deterministic_algorithms(True)
    try:
        for _ in range(2):
            loss = scl_kernels.supcon_loss(x, hot, backend="cuda", multi_label=rule)
            runs.append((loss, torch.autograd.grad(loss, x)[0]))
    finally:
        torch.use_deterministic_algorithms(False)
    assert torch.equal(runs[0][0], runs[1][0]) and torch.equal(runs[0][1], runs[1][1])


@gpu
@pytest.mark.parametrize("groups", [False, True])
def test_cuda_graph_replays_multi_hot_calls(groups, cuda_randn, cuda_randint):
    """Captured, a multi-hot call takes the class overlaps in blocks of pairs (the sums over
    class subsets read sizes on the host): a whole forward + backward replays on new rows and
    labels and gives what an eager call (the sums, for these rows of few classes) gives."""
    n = 300
    group_ids = cuda_randint(-1, 5, (n,)) if groups else None
    with test_hooks(value_checks="next_call"):  # as test_host_reads.py's capture
        x = cuda_randn(n, 128, dtype=torch.bfloat16).requires_grad_()
        hot = few_class_rows(cuda_randint, n, 11)

        def step():
            x.grad = None
            loss = scl_kernels.supcon_loss(x, hot, 0.1, backend="cuda", multi_label="jaccard",
                                           groups=group_ids)
            loss.backward()
            return loss

        graph, captured = capture(step)
        assert scl_kernels.raise_deferred_value_errors() is None
        fresh_x, fresh_hot = cuda_randn(n, 128, dtype=torch.bfloat16), few_class_rows(
            cuda_randint, n, 11)
        with torch.no_grad():
            x.copy_(fresh_x)
            hot.copy_(fresh_hot)
        graph.replay()
        eager_x = fresh_x.clone().requires_grad_()
        eager = scl_kernels.supcon_loss(eager_x, fresh_hot, 0.1, backend="cuda",
                                        multi_label="jaccard", groups=group_ids)
        eager.backward()
        torch.cuda.synchronize()
        torch.testing.assert_close(captured, eager, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(x.grad.float(), eager_x.grad.float(), rtol=2e-2, atol=1e-3)

"""The conformance suite's own machinery (support/backend_matrix.py): which backends it runs, and
the subsets of a matrix that budgets and the quick marker select."""
import itertools

import pytest
import torch

import scl_kernels
from scl_kernels.backends import get_backend
from support.backend_matrix import BACKEND_CASES, DEVICES, OP_BACKEND_CASES, each_choice, pairwise


def test_every_available_backend_is_in_the_matrix():
    for device in DEVICES:
        names = [case.name for case in BACKEND_CASES if case.device == device and not case.variant]
        assert names == scl_kernels.available_backends(device)
    variants = [str(case) for case in BACKEND_CASES if case.variant]
    assert variants == (["cpu-cpu-device-prep"] if "cpu" in scl_kernels.available_backends("cpu")
                        else [])
    for case in BACKEND_CASES:
        has_ops = get_backend(case.name).forward_op is not None
        assert (case in OP_BACKEND_CASES) == has_ops


@pytest.mark.parametrize("sizes", [(9, 2, 3), (7, 4, 5), (5, 3, 5), (2, 2), (9, 3), (4,), (3, 3, 3, 3)])
def test_pairwise_covers_every_pair_and_each_choice(sizes):
    rows = pairwise(list(sizes))
    assert len(set(rows)) == len(rows)
    assert set(each_choice(list(sizes))) <= set(rows)
    for a, b in itertools.combinations(range(len(sizes)), 2):
        covered = {(row[a], row[b]) for row in rows}
        assert covered == set(itertools.product(range(sizes[a]), range(sizes[b])))
    for k, size in enumerate(sizes):
        assert {row[k] for row in rows} == set(range(size))
    full = 1
    for size in sizes:
        full *= size
    assert len(rows) <= full


def test_put_moves_nested_tensors():
    case = BACKEND_CASES[0]
    moved = case.put({"a": torch.zeros(2), "b": (torch.ones(1), None, 3)})
    assert moved["a"].device.type == case.device and moved["b"][1] is None and moved["b"][2] == 3

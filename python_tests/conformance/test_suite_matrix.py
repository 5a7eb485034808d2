"""The conformance suite's own machinery (support/backend_matrix.py): which backends it runs, and
the subsets of a matrix that budgets, tiers and the quick marker select."""
import itertools

import pytest
import torch

import scl_kernels
from scl_kernels.backends import get_backend
from support import backend_matrix
from support.backend_matrix import (BACKEND_CASES, DEVICES, FULL, OP_BACKEND_CASES, Budget,
                                    budget_for, each_choice, pairwise)


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


@pytest.mark.parametrize("full_tier, interpreter_each", [(False, False), (True, False), (True, True)])
def test_the_default_tier_runs_the_secondary_cases_pairwise(monkeypatch, full_tier, interpreter_each):
    monkeypatch.setattr(backend_matrix, "full_tier", full_tier)
    monkeypatch.setattr(backend_matrix, "interpreter_each", interpreter_each)
    assert budget_for("cpu", "cpu") == FULL
    for secondary in (budget_for("reference", "cpu"), budget_for("cpu", "cpu", "device-prep")):
        expected = "all" if full_tier else "pairs"
        assert secondary == Budget(FULL.max_rows, FULL.max_dim, combinations=expected)
    interpreted = budget_for("triton", "cpu")
    assert interpreted.combinations == ("pairs" if full_tier and not interpreter_each else "each")
    assert (interpreted.max_rows, interpreted.max_dim) == (70, 40)


def test_put_moves_nested_tensors():
    case = BACKEND_CASES[0]
    moved = case.put({"a": torch.zeros(2), "b": (torch.ones(1), None, 3)})
    assert moved["a"].device.type == case.device and moved["b"][1] is None and moved["b"][2] == 3


@pytest.mark.parametrize("full_tier", [False, True])
def test_only_the_full_tier_runs_the_slow_tests(monkeypatch, full_tier):
    monkeypatch.setattr(backend_matrix, "full_tier", full_tier)

    class Item:
        def __init__(self, slow):
            self.marks = [pytest.mark.slow.mark] if slow else []

        def get_closest_marker(self, name):
            return next((m for m in self.marks if m.name == name), None)

        def add_marker(self, marker):
            self.marks.append(marker.mark)

    slow, other = Item(True), Item(False)
    backend_matrix.pytest_collection_modifyitems(None, [slow, other])
    assert (slow.get_closest_marker("skip") is None) == full_tier
    assert other.get_closest_marker("skip") is None

"""ClassBalancedBatchSampler: every anchor has a positive, reproducibility, ranks, errors."""
import collections

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from scl_kernels.sampling import ClassBalancedBatchSampler


def class_counts(batch, labels):
    return collections.Counter(labels[i] for i in batch)


@pytest.mark.quick
@pytest.mark.parametrize("sizes, batch_size, per_class", [
    ((10, 3, 40), 8, 2),     # imbalanced, a class smaller than its share
    ((30, 30, 30, 30, 30), 12, 3),  # more classes than fit in a batch
    ((2000, 350), 16, 2),    # binary, 6:1
])
def test_every_example_of_a_batch_has_a_positive(sizes, batch_size, per_class):
    labels = [c for c, size in enumerate(sizes) for _ in range(size)]
    sampler = ClassBalancedBatchSampler(labels, batch_size, per_class, seed=3)
    batches = list(sampler)
    assert len(batches) == len(sampler) == len(labels) // batch_size
    for batch in batches:
        counts = class_counts(batch, labels)
        assert len(batch) == batch_size and len(set(batch)) == batch_size
        assert min(counts.values()) >= per_class
        assert len(counts) == min(batch_size // per_class, len(sizes))


def test_balanced_classes_give_every_example_once_per_epoch():
    labels = [c for c in range(4) for _ in range(8)]
    sampler = ClassBalancedBatchSampler(labels, 8, 2, seed=0)
    seen = [i for batch in sampler for i in batch]
    assert sorted(seen) == list(range(32))


def test_minority_class_is_oversampled_to_balance():
    labels = [0] * 900 + [1] * 100
    batches = list(ClassBalancedBatchSampler(labels, 20, 10, seed=1))
    counts = class_counts([i for b in batches for i in b], labels)
    assert counts[0] == counts[1] == 500


def test_few_shot_set_smaller_than_a_batch_is_one_batch_of_everything():
    labels = [0, 1, 2, 0, 1, 2, 0]
    batches = list(ClassBalancedBatchSampler(labels, 16, 2))
    assert len(batches) == 1 and sorted(batches[0]) == list(range(7))


def test_reproducible_by_seed_and_epoch():
    labels = torch.randint(0, 5, (300,), generator=torch.Generator().manual_seed(0))
    first = list(ClassBalancedBatchSampler(labels, 10, 2, seed=4))
    assert first == list(ClassBalancedBatchSampler(labels, 10, 2, seed=4))
    assert first != list(ClassBalancedBatchSampler(labels, 10, 2, seed=5))
    sampler = ClassBalancedBatchSampler(labels, 10, 2, seed=4)
    sampler.set_epoch(1)
    assert list(sampler) != first
    sampler.set_epoch(0)
    assert list(sampler) == first


def test_ranks_share_out_the_batches():
    labels = [c for c in range(3) for _ in range(40)]
    ranks = [list(ClassBalancedBatchSampler(labels, 6, 2, seed=2, num_replicas=4, rank=r)) for r in range(4)]
    assert {len(r) for r in ranks} == {120 // 24}
    single = list(ClassBalancedBatchSampler(labels, 6, 2, seed=2, num_replicas=1, rank=0))
    for step in range(len(ranks[0])):  # the ranks take turns over the same sequence of batches
        for rank in range(4):
            assert ranks[rank][step] == single[4 * step + rank]
        seen = [i for rank in range(4) for i in ranks[rank][step]]
        assert len(set(seen)) == len(seen)


def test_composes_with_a_data_loader():
    features = torch.arange(40.0)[:, None]
    labels = torch.arange(40) % 4
    sampler = ClassBalancedBatchSampler(labels, 8, 2, seed=0)
    loader = DataLoader(TensorDataset(features, labels), batch_sampler=sampler)
    batches = list(loader)
    assert len(batches) == 5
    for x, y in batches:
        assert x.shape == (8, 1) and torch.bincount(y, minlength=4).min() >= 2
        assert torch.equal(labels[x[:, 0].long()], y)


@pytest.mark.parametrize("kwargs, error, match", [
    ({"labels": [0, 0, 1]}, ValueError, "single example"),
    ({"labels": [1, 1, 1]}, ValueError, "at least 2 classes"),
    ({"labels": []}, ValueError, "non-empty"),
    ({"labels": [[0, 1]]}, ValueError, "1-D"),
    ({"labels": [0.5, 1.5]}, TypeError, "integers"),
    ({"samples_per_class": 1}, ValueError, "samples_per_class"),
    ({"batch_size": 1}, ValueError, "batch_size"),
    ({"batch_size": 4.0}, ValueError, "batch_size"),
    ({"seed": "a"}, TypeError, "seed"),
    ({"num_replicas": 2, "rank": 2}, ValueError, "rank"),
    ({"num_replicas": 0, "rank": 0}, ValueError, "num_replicas"),
])
def test_errors(kwargs, error, match):
    arguments = {"labels": [0, 0, 1, 1], "batch_size": 4, **kwargs}
    with pytest.raises(error, match=match):
        ClassBalancedBatchSampler(**arguments)


def test_string_labels_batch_as_their_integer_codes():
    names = ["pos", "neg", "pos", "neg", "mixed", "mixed", "pos", "neg"]
    codes = [{"mixed": 0, "neg": 1, "pos": 2}[name] for name in names]  # sorted names
    by_name = ClassBalancedBatchSampler(names, batch_size=4, samples_per_class=2, seed=3)
    by_code = ClassBalancedBatchSampler(codes, batch_size=4, samples_per_class=2, seed=3)
    assert list(by_name) == list(by_code)
    for batch in by_name:
        counts = collections.Counter(names[i] for i in batch)
        assert all(count >= 2 for count in counts.values())


def test_labels_that_are_not_class_names_are_rejected():
    with pytest.raises(TypeError, match="integers or other hashable"):
        ClassBalancedBatchSampler([0.5, 1.5, 0.5, 1.5], batch_size=4)
    with pytest.raises(TypeError, match="hashable"):
        ClassBalancedBatchSampler([{1}, {2}, {1}, {2}], batch_size=4)

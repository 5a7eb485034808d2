"""Class-balanced batches: every anchor of a batch has at least one positive."""
from typing import Hashable, Iterable, Iterator, List, Optional, Union

import torch
import torch.distributed as dist
from torch.utils.data import Sampler


def _positive_int(value: object, name: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


def _label_tensor(labels: Union[torch.Tensor, Iterable[Hashable]]) -> torch.Tensor:
    """The labels as an integer tensor: integer tensors and sequences as they are; any other
    hashable labels (strings, tuples, ...) as class codes in sorted order, or in order of first
    appearance where the labels do not sort (the same labels give the same codes in every
    process)."""
    tensor: Optional[torch.Tensor]
    try:
        tensor = torch.as_tensor(labels)
    except (TypeError, ValueError, RuntimeError):
        tensor = None
    if tensor is not None:
        not_integer = tensor.is_floating_point() or tensor.is_complex() or tensor.dtype == torch.bool
        if tensor.numel() and not_integer:  # an empty list is float32; its error comes later
            raise TypeError(f"labels must be integers or other hashable class names, got {tensor.dtype}")
        return tensor
    names: List[Hashable] = list(labels)
    try:
        first_seen = dict.fromkeys(names)
    except TypeError as error:
        raise TypeError(f"labels must be hashable class names or integers: {error}") from None
    classes: List[Hashable]
    try:
        classes = sorted(first_seen)  # type: ignore[type-var]  # TypeError where they do not sort
    except TypeError:  # mixed kinds of label: keep their first appearance
        classes = list(first_seen)
    codes = {label: code for code, label in enumerate(classes)}
    return torch.tensor([codes[label] for label in names], dtype=torch.long)


class _ClassStream:
    """The examples of one class in an endless shuffled order: one permutation after another."""

    def __init__(self, indices: torch.Tensor, generator: torch.Generator) -> None:
        self.indices = indices
        self.generator = generator
        self.order: List[int] = []

    def take(self, count: int) -> List[int]:
        """``count`` (<= the class size) distinct examples, the next ones in the order."""
        if len(self.order) < count:
            leftover = self.order
            fresh: List[int] = self.indices[
                torch.randperm(len(self.indices), generator=self.generator)].tolist()
            # The leftovers go last in the new permutation, so one take never repeats an example.
            held = set(leftover)
            self.order = leftover + [i for i in fresh if i not in held] + leftover
        taken, self.order = self.order[:count], self.order[count:]
        return taken


class ClassBalancedBatchSampler(Sampler[List[int]]):
    """Batches of several classes with at least ``samples_per_class`` examples each.

    A supervised contrastive loss learns only from anchors that have a positive (another example
    of their class in the batch); with random batches of 16 and a few examples per class most
    anchors have none. Each batch here takes ``min(batch_size // samples_per_class, classes)``
    classes drawn uniformly at random, and fills ``batch_size`` with as equal a share of each as
    its examples allow (never one example twice in a batch). Each class hands out its examples in
    a shuffled order, reshuffled when used up, so minority classes are oversampled and the
    majority's examples all come round over epochs.

    An epoch has ``max(1, len(labels) // (batch_size * num_replicas))`` batches per rank; a data
    set smaller than a batch gives one batch of all its examples. The batches depend only on
    ``(seed, epoch)``: call :meth:`set_epoch` at the start of each epoch for new ones. With
    ``num_replicas`` ranks, every rank draws the same sequence of batches and keeps every
    ``num_replicas``-th one from its ``rank`` on: the ranks' batches are disjoint and each is
    balanced on its own; every rank has the same number of batches.

    Use it as the ``batch_sampler`` of a DataLoader::

        sampler = ClassBalancedBatchSampler(train_labels, batch_size=64, samples_per_class=4, seed=0)
        loader = DataLoader(dataset, batch_sampler=sampler, collate_fn=collate)
        for epoch in range(epochs):
            sampler.set_epoch(epoch)
            for batch in loader: ...
    """

    def __init__(self, labels: Union[torch.Tensor, Iterable[Hashable]], batch_size: int,
                 samples_per_class: int = 2, *, seed: int = 0,
                 num_replicas: Optional[int] = None, rank: Optional[int] = None) -> None:
        """
        Args:
            labels: the class of every example of the data set, indexed as the data set is: an
                integer tensor or sequence, or any hashable class names (strings, ...).
            batch_size: examples per batch (per rank); at least ``samples_per_class``.
            samples_per_class: the fewest examples of a class a batch holds (>= 2, so every
                anchor has a positive). Every class needs at least 2 examples.
            seed: seed of the shuffles.
            num_replicas, rank: the data-parallel world: default the initialised default
                process group's size and rank, else 1 and 0. Pass ``num_replicas=1, rank=0``
                where something else deals the batches out to the processes (Hugging Face
                accelerate's ``prepare`` of a DataLoader, as in the Trainer): sharding twice
                would drop batches.

        Raises:
            ValueError: bad sizes, a class with a single example, or fewer than 2 classes.
        """
        label_tensor = _label_tensor(labels)
        if label_tensor.dim() != 1 or label_tensor.numel() == 0:
            raise ValueError(f"labels must be a non-empty 1-D sequence, got shape {tuple(label_tensor.shape)}")
        self.samples_per_class = _positive_int(samples_per_class, "samples_per_class", 2)
        self.batch_size = _positive_int(batch_size, "batch_size", self.samples_per_class)
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"seed must be an int, got {type(seed).__name__}")
        if num_replicas is None or rank is None:
            distributed = dist.is_available() and dist.is_initialized()
            num_replicas = num_replicas if num_replicas is not None else (
                dist.get_world_size() if distributed else 1)
            rank = rank if rank is not None else (dist.get_rank() if distributed else 0)
        self.num_replicas = _positive_int(num_replicas, "num_replicas")
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < self.num_replicas:
            raise ValueError(f"rank must be an int in [0, {self.num_replicas}), got {rank!r}")
        self.rank = rank
        self.seed = seed
        self.epoch = 0

        classes, counts = torch.unique(label_tensor, return_counts=True)
        if len(classes) < 2:
            raise ValueError(f"class-balanced batches need at least 2 classes, got {len(classes)}")
        single = classes[counts < 2].tolist()
        if single:
            raise ValueError(f"{len(single)} class(es) have a single example (e.g. label {single[0]}): "
                             "a supervised contrastive loss needs at least 2 examples of a class "
                             "for it to have positives; drop or merge them")
        self.class_indices = [torch.nonzero(label_tensor == c).flatten() for c in classes]
        self.num_examples = label_tensor.numel()

    def set_epoch(self, epoch: int) -> None:
        """Makes the next iteration draw the batches of ``epoch`` (as DistributedSampler's)."""
        self.epoch = epoch

    def __len__(self) -> int:
        return max(1, self.num_examples // (self.batch_size * self.num_replicas))

    def __iter__(self) -> Iterator[List[int]]:
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        streams = [_ClassStream(indices, generator) for indices in self.class_indices]
        classes_per_batch = min(self.batch_size // self.samples_per_class, len(streams))
        for batch_index in range(len(self) * self.num_replicas):
            chosen = torch.randperm(len(streams), generator=generator)[:classes_per_batch].tolist()
            share, extra = divmod(self.batch_size, classes_per_batch)
            batch: List[int] = []
            for position, c in enumerate(chosen):
                stream = streams[c]
                batch += stream.take(min(share + (position < extra), len(stream.indices)))
            # Every rank draws every batch, so the streams stay in step across ranks.
            if batch_index % self.num_replicas == self.rank:
                yield batch

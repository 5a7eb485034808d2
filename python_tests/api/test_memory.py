"""SupConMemory and the losses that contrast against it: a dense float64 formula with the
memory's rows as extra contrast (value and gradient), the ring's order, checkpoints, the
gradient cache, eval mode and the errors."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from scl_kernels import supcon_loss
from scl_kernels.grad_cache import GradientCache
from scl_kernels.nn import SupConCrossEntropyLoss, SupConLoss, SupConMemory
from scl_kernels.cross_batch_memory import supcon_loss_with_memory
from support import needs

BACKENDS = [pytest.param("cpu", marks=needs.library), "reference"]


def dense_memory_loss(rows, labels, memory_rows, memory_labels, temperature, num_anchors,
                      reduction="mean"):
    """float64 SupCon of anchors rows[:num_anchors] against rows ∪ memory_rows, every mask
    explicit: no self column, memory rows contrast only, a negative label is never a positive."""
    z = F.normalize(torch.cat([rows, memory_rows]).to(torch.float64), dim=1)
    all_labels = torch.cat([labels, memory_labels])
    anchors = torch.arange(num_anchors)
    logits = z[:num_anchors] @ z.T / temperature
    not_self = torch.ones_like(logits, dtype=torch.bool)
    not_self[anchors, anchors] = False
    log_prob = logits - torch.logsumexp(logits.masked_fill(~not_self, float("-inf")), dim=1,
                                        keepdim=True)
    anchor_labels = all_labels[:num_anchors, None]
    positive = (anchor_labels == all_labels[None, :]) & (anchor_labels >= 0) & not_self
    count = positive.sum(dim=1)
    per_anchor = -(log_prob * positive).sum(dim=1) / count.clamp_min(1)
    if reduction == "sum":
        return per_anchor.sum()
    return per_anchor.sum() / (count > 0).sum().clamp_min(1)


def filled_memory(size, dim, count, classes=3, seed=1, dtype=torch.float64):
    """A memory that has received ``count`` random rows (wrapped when count > size)."""
    generator = torch.Generator().manual_seed(seed)
    memory = SupConMemory(size, dim, dtype=dtype)
    memory.enqueue(torch.randn(count, dim, generator=generator, dtype=dtype),
                   torch.randint(-1, classes, (count,), generator=generator))
    return memory


@pytest.mark.quick
@pytest.mark.parametrize("loss_backend", BACKENDS)
@pytest.mark.parametrize("batch, size, held, dim", [(7, 11, 4, 5), (5, 13, 30, 33), (9, 3, 3, 2),
                                                    (6, 8, 0, 5), (1, 40, 17, 7)])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_loss_and_gradient_are_the_dense_formula(loss_backend, batch, size, held, dim, reduction):
    generator = torch.Generator().manual_seed(batch * 100 + size)
    features = torch.randn(batch, dim, generator=generator, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(-1, 3, (batch,), generator=generator)
    memory = filled_memory(size, dim, held)
    memory_rows, memory_labels = (t.clone() for t in memory.contrast())

    criterion = SupConLoss(0.3, reduction=reduction, backend=loss_backend, memory=memory)
    loss = criterion(features, labels)
    (grad,) = torch.autograd.grad(loss, features)

    expected = dense_memory_loss(features, labels, memory_rows, memory_labels, 0.3, batch,
                                 reduction)
    (expected_grad,) = torch.autograd.grad(expected, features)
    torch.testing.assert_close(loss, expected, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(grad, expected_grad, rtol=1e-9, atol=1e-12)
    assert len(memory) == min(held + batch, size)


@pytest.mark.parametrize("loss_backend", BACKENDS)
def test_views_contrast_mode_one_and_float32(loss_backend):
    generator = torch.Generator().manual_seed(5)
    features = torch.randn(6, 2, 7, generator=generator, requires_grad=True)  # float32
    labels = torch.randint(0, 2, (6,), generator=generator)
    memory = filled_memory(24, 7, 9, dtype=torch.float32)
    memory_rows, memory_labels = (t.clone() for t in memory.contrast())
    rows = features.transpose(0, 1).reshape(12, 7)

    for mode, anchors in (("all", 12), ("one", 6)):
        memory.load_state_dict(filled_memory(24, 7, 9, dtype=torch.float32).state_dict())
        loss = SupConLoss(0.2, contrast_mode=mode, backend=loss_backend, memory=memory)(features, labels)
        expected = dense_memory_loss(rows, labels.repeat(2), memory_rows, memory_labels, 0.2, anchors)
        got, want = (torch.autograd.grad(value, features)[0] for value in (loss, expected))
        torch.testing.assert_close(loss.double(), expected, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(got.double(), want.double(), rtol=1e-4, atol=1e-6)
        # every view's row is enqueued, with its sample's label
        held_rows, held_labels = memory.contrast()
        torch.testing.assert_close(held_rows[9:], rows.detach())
        assert torch.equal(held_labels[9:], labels.repeat(2))


def test_an_empty_memory_is_the_plain_loss_and_memory_rows_add_negatives():
    generator = torch.Generator().manual_seed(2)
    features = torch.randn(8, 4, generator=generator, dtype=torch.float64)
    labels = torch.tensor([0, 0, 1, 1, 2, 2, 0, 1])
    memory = SupConMemory(16, 4, dtype=torch.float64)
    torch.testing.assert_close(supcon_loss_with_memory(features, labels, memory, 0.5),
                               supcon_loss(features, labels, 0.5), rtol=1e-12, atol=0)
    # the batch is now the memory's content: the next call contrasts against it
    again = supcon_loss_with_memory(features, labels, memory, 0.5)
    expected = dense_memory_loss(features, labels, features, labels, 0.5, 8)
    torch.testing.assert_close(again, expected, rtol=1e-10, atol=1e-12)
    assert len(memory) == 16


def test_without_labels_memory_rows_are_negatives_only():
    generator = torch.Generator().manual_seed(3)
    views = torch.randn(5, 2, 6, generator=generator, dtype=torch.float64)
    memory = filled_memory(10, 6, 10, classes=5)  # labels 0..4 would collide with sample ids
    memory_rows = memory.contrast()[0].clone()
    loss = supcon_loss_with_memory(views, None, memory, 0.3, backend="reference")
    rows = views.transpose(0, 1).reshape(10, 6)
    ids = torch.arange(5).repeat(2)
    expected = dense_memory_loss(rows, ids, memory_rows, torch.full((10,), -1), 0.3, 10)
    torch.testing.assert_close(loss, expected, rtol=1e-12, atol=1e-12)
    assert torch.equal(memory.contrast()[1], torch.full((10,), -1))


@needs.library
def test_focal_with_memory_matches_the_reference_backend():
    generator = torch.Generator().manual_seed(4)
    features = torch.randn(9, 5, generator=generator, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, 2, (9,), generator=generator)
    results = []
    for backend in ("cpu", "reference"):
        memory = filled_memory(12, 5, 7, classes=2)
        loss = SupConLoss(0.3, focal_gamma=1.5, backend=backend, memory=memory)(features, labels)
        results.append((loss, torch.autograd.grad(loss, features)[0]))
    for got, want in zip(*results):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_fifo_order_and_wrap_around():
    memory = SupConMemory(5, 1, dtype=torch.float64)
    def rows(*values):
        return torch.tensor(values, dtype=torch.float64)[:, None]

    memory.enqueue(rows(0, 1, 2), torch.tensor([0, 1, 2]))
    assert len(memory) == 3 and memory.contrast()[0].flatten().tolist() == [0, 1, 2]
    memory.enqueue(rows(3, 4, 5, 6), torch.tensor([3, 4, 5, 6]))  # wraps: 5, 6 overwrite 0, 1
    held_rows, held_labels = memory.contrast()
    assert len(memory) == 5 and int(memory.next_slot) == 2
    assert held_rows.flatten().tolist() == [5, 6, 2, 3, 4]
    assert held_labels.tolist() == [5, 6, 2, 3, 4]
    memory.enqueue(rows(*range(10, 22)), torch.arange(10, 22))  # larger than the memory
    assert sorted(memory.contrast()[0].flatten().tolist()) == [17, 18, 19, 20, 21]
    assert memory.contrast()[0].flatten().tolist() == [20, 21, 17, 18, 19]
    memory.enqueue(rows(), torch.tensor([], dtype=torch.long))  # nothing to add
    assert int(memory.next_slot) == 2
    memory.reset()
    assert len(memory) == 0 and memory.contrast()[0].shape == (0, 1)


def test_enqueue_casts_to_the_memory_dtype_and_detaches():
    memory = SupConMemory(4, 3, dtype=torch.bfloat16)
    embeddings = torch.randn(2, 3, requires_grad=True)
    memory.enqueue(embeddings, torch.tensor([1, 2], dtype=torch.int32))
    assert memory.rows.dtype == torch.bfloat16 and not memory.rows.requires_grad
    assert memory.row_labels.dtype == torch.long
    torch.testing.assert_close(memory.contrast()[0].float(), embeddings.detach(), rtol=1e-2, atol=1e-2)


def test_state_dict_round_trip_through_the_loss():
    source = SupConLoss(0.1, memory=filled_memory(6, 3, 4))
    source.memory.enqueue(torch.randn(4, 3, dtype=torch.float64), torch.tensor([2, 1, 0, -1]))
    target = SupConLoss(0.1, memory=SupConMemory(6, 3, dtype=torch.float64))
    assert set(source.state_dict()) == {"memory.rows", "memory.row_labels", "memory.row_groups",
                                        "memory.next_slot", "memory.filled"}
    target.load_state_dict(source.state_dict())
    assert len(target.memory) == 6 and int(target.memory.next_slot) == 2
    for a, b in zip(source.memory.contrast(), target.memory.contrast()):
        assert torch.equal(a, b)
    batch = torch.randn(3, 3, dtype=torch.float64), torch.tensor([0, 1, 0])
    torch.testing.assert_close(source(*batch), target(*batch), rtol=0, atol=0)
    assert torch.equal(source.memory.rows, target.memory.rows)


def test_eval_mode_neither_uses_nor_changes_the_memory():
    memory = filled_memory(6, 3, 4)
    before = memory.rows.clone()
    criterion = SupConCrossEntropyLoss(0.5, memory=memory).eval()
    logits, embeddings = torch.randn(5, 2, dtype=torch.float64), torch.randn(5, 3, dtype=torch.float64)
    labels = torch.tensor([0, 1, 0, 1, 1])
    expected = SupConCrossEntropyLoss(0.5)(logits, embeddings, labels)
    torch.testing.assert_close(criterion(logits, embeddings, labels), expected, rtol=0, atol=0)
    assert len(memory) == 4 and torch.equal(memory.rows, before)


def test_cross_entropy_loss_with_memory_is_the_formula():
    generator = torch.Generator().manual_seed(6)
    logits = torch.randn(7, 3, generator=generator, dtype=torch.float64, requires_grad=True)
    embeddings = torch.randn(7, 4, generator=generator, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, 3, (7,), generator=generator)
    memory = filled_memory(9, 4, 12)
    memory_rows, memory_labels = (t.clone() for t in memory.contrast())
    loss = SupConCrossEntropyLoss(0.7, 0.3, memory=memory)(logits, embeddings, labels)
    expected = 0.3 * F.cross_entropy(logits, labels) + 0.7 * dense_memory_loss(
        embeddings, labels, memory_rows, memory_labels, 0.3, 7)
    got, want = (torch.autograd.grad(v, (logits, embeddings)) for v in (loss, expected))
    torch.testing.assert_close(loss, expected, rtol=1e-10, atol=1e-12)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-12)


class TinyEncoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 5)).double()
        self.head = nn.Linear(5, 3).double()

    def forward(self, inputs):
        embeddings = self.body(inputs)
        return self.head(embeddings), embeddings


@pytest.mark.parametrize("chunk_size", [3, 4])
def test_gradient_cache_equals_one_pass_with_the_same_memory(chunk_size):
    generator = torch.Generator().manual_seed(7)
    steps = [(torch.randn(11, 6, generator=generator, dtype=torch.float64),
              torch.randint(0, 3, (11,), generator=generator)) for _ in range(3)]
    torch.manual_seed(0)
    model = TinyEncoder()
    results = []
    for chunk in (chunk_size, 11):  # 11: the whole batch in one pass, no cache
        memory = filled_memory(16, 5, 5)
        criterion = SupConCrossEntropyLoss(0.9, 0.3, memory=memory)
        cache = GradientCache(model, criterion, chunk)
        grads = []
        for inputs, labels in steps:  # several steps: the memory fills and wraps
            model.zero_grad()
            cache.step(inputs, labels)
            grads.append([p.grad.clone() for p in model.parameters()])
        results.append((grads, memory.state_dict()))
    (cached, cached_memory), (plain, plain_memory) = results
    for step_cached, step_plain in zip(cached, plain):
        for a, b in zip(step_cached, step_plain):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    for name in plain_memory:
        torch.testing.assert_close(cached_memory[name], plain_memory[name], rtol=1e-12, atol=0)
    assert int(plain_memory["filled"]) == 16  # 5 + 3 * 11 rows went through a 16-row ring


@pytest.mark.parametrize("call, error, match", [
    (lambda: SupConMemory(0, 4), ValueError, "size must be at least 1"),
    (lambda: SupConMemory(4.0, 4), TypeError, "size must be a positive int"),
    (lambda: SupConMemory(4, True), TypeError, "dim must be a positive int"),
    (lambda: SupConMemory(4, 4, dtype=torch.int64), TypeError, "dtype must be a floating"),
    (lambda: SupConMemory(4, 384).enqueue(torch.randn(2, 768), torch.tensor([0, 1])),
     ValueError, "memory dim 384 but embeddings have 768"),
    (lambda: SupConMemory(4, 3).enqueue(torch.randn(2, 3), torch.tensor([0, 1, 2])),
     ValueError, r"labels must have shape \[2\]"),
    (lambda: SupConMemory(4, 3).enqueue(torch.randn(2, 3), torch.tensor([0.0, 1.0])),
     TypeError, "labels must be an integer tensor"),
    (lambda: SupConMemory(4, 3).enqueue(torch.ones(2, 3, dtype=torch.long), torch.tensor([0, 1])),
     TypeError, "embeddings must be a floating-point tensor"),
    (lambda: SupConMemory(4, 3).enqueue(torch.randn(3), torch.tensor([0, 1, 2])),
     ValueError, r"embeddings must have shape \[N, 3\]"),
    (lambda: SupConMemory(4, 3).enqueue(torch.tensor([[0.0, float("nan"), 1.0]]), torch.tensor([0])),
     ValueError, "embeddings contains NaN or inf"),
    (lambda: SupConMemory(4, 3, device="meta").enqueue(torch.randn(2, 3), torch.tensor([0, 1])),
     ValueError, "embeddings is on cpu but the memory is on meta"),
    (lambda: SupConLoss(memory=object()), TypeError, "memory must be a SupConMemory or None"),
    (lambda: SupConLoss(memory=SupConMemory(4, 3))(torch.randn(2, 5), torch.tensor([0, 1])),
     ValueError, "memory dim 3 but features have 5"),
    (lambda: SupConLoss(memory=SupConMemory(4, 3))(torch.randn(2, 3), torch.tensor([0, 1]),
                                                    contrast=torch.randn(2, 3)),
     ValueError, "contrast= cannot be combined with a memory"),
    (lambda: SupConCrossEntropyLoss(0.0, memory=SupConMemory(4, 3)), ValueError,
     "memory needs lam > 0"),
    (lambda: SupConCrossEntropyLoss(0.5, distributed=True, strategy="ring",
                                    memory=SupConMemory(4, 3)),
     ValueError, "memory needs strategy='gather'"),
])
def test_errors_name_the_problem(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_a_failed_call_leaves_the_memory_unchanged():
    memory = filled_memory(6, 3, 2)
    before = memory.state_dict()
    with pytest.raises(ValueError):
        SupConLoss(memory=memory)(torch.full((2, 3), float("inf")), torch.tensor([0, 1]))
    for name, value in memory.state_dict().items():
        assert torch.equal(value, before[name])


def test_the_memory_is_also_where_it_used_to_be():
    """scl_kernels.nn.memory, its former home, still gives the same objects (old imports, and
    whole-module checkpoints pickled by that path)."""
    import scl_kernels.cross_batch_memory as moved
    import scl_kernels.nn.memory as old

    assert old.SupConMemory is moved.SupConMemory is SupConMemory
    assert old.supcon_loss_with_memory is moved.supcon_loss_with_memory
    assert old.check_memory is moved.check_memory and old.memory_labels is moved.memory_labels

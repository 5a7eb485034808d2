"""GradientCache: parameter gradients equal to one pass over the whole batch, RNG replay,
split_batch, hooks and errors."""
import pytest
import torch
from torch import nn

from scl_kernels.grad_cache import GradientCache, split_batch
from scl_kernels.nn import SupConCrossEntropyLoss


class TinyEncoder(nn.Module):
    """An encoder with dropout that returns (logits, embeddings), like a classifier's forward."""

    def __init__(self, dim_in=6, dim=5, classes=3, dropout=0.0):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(dim_in, 16), nn.Tanh(), nn.Dropout(dropout), nn.Linear(16, dim))
        self.head = nn.Linear(dim, classes)

    def forward(self, inputs):
        embeddings = self.body(inputs)
        return self.head(embeddings), embeddings


def data(n=11, dim_in=6, classes=3, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(n, dim_in, generator=generator, dtype=torch.float64),
            torch.randint(0, classes, (n,), generator=generator))


def gradients(model):
    return [p.grad.clone() for p in model.parameters()]


def chunked_reference(model, criterion, inputs, labels, chunk_size, seed):
    """The loss of the batch encoded chunk by chunk with a graph, in the cache's RNG order."""
    torch.manual_seed(seed)
    model.zero_grad()
    outputs = [model(chunk) for chunk in inputs.split(chunk_size)]
    loss = criterion(torch.cat([o[0] for o in outputs]), torch.cat([o[1] for o in outputs]), labels)
    loss.backward()
    return loss.detach(), gradients(model)


def cached(model, criterion, inputs, labels, chunk_size, seed, **kwargs):
    torch.manual_seed(seed)
    model.zero_grad()
    loss = GradientCache(model, criterion, chunk_size, **kwargs).step(inputs, labels)
    return loss, gradients(model)


@pytest.mark.quick
@pytest.mark.parametrize("chunk_size", [1, 3, 4, 11, 64])
def test_equal_to_one_pass_without_dropout(chunk_size):
    torch.manual_seed(0)
    model = TinyEncoder().double()
    criterion = SupConCrossEntropyLoss(lam=0.7, temperature=0.3)
    inputs, labels = data()
    model.zero_grad()
    want_loss = criterion(*model(inputs), labels)
    want_loss.backward()
    want = gradients(model)
    loss, got = cached(model, criterion, inputs, labels, chunk_size, seed=1)
    torch.testing.assert_close(loss, want_loss.detach(), rtol=1e-12, atol=1e-12)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("chunk_size", [2, 5])
def test_dropout_masks_are_replayed(chunk_size):
    torch.manual_seed(0)
    model = TinyEncoder(dropout=0.5).double().train()
    criterion = SupConCrossEntropyLoss(lam=0.5, temperature=0.2)
    inputs, labels = data(seed=2)
    want_loss, want = chunked_reference(model, criterion, inputs, labels, chunk_size, seed=7)
    loss, got = cached(model, criterion, inputs, labels, chunk_size, seed=7)
    torch.testing.assert_close(loss, want_loss, rtol=1e-12, atol=1e-12)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)
    # The masks matter: another seed gives another gradient.
    _, other = chunked_reference(model, criterion, inputs, labels, chunk_size, seed=8)
    assert not torch.allclose(other[0], want[0])


def test_random_state_ends_as_after_the_first_pass():
    torch.manual_seed(0)
    model = TinyEncoder(dropout=0.5).double().train()
    criterion = SupConCrossEntropyLoss()
    inputs, labels = data()
    torch.manual_seed(3)
    with torch.no_grad():
        for chunk in inputs.split(4):
            model(chunk)
    want = torch.rand(3)
    torch.manual_seed(3)
    GradientCache(model, criterion, 4).step(inputs, labels)
    torch.testing.assert_close(torch.rand(3), want)


def test_learnable_temperature_gets_the_same_gradient():
    torch.manual_seed(0)
    model = TinyEncoder().double()
    inputs, labels = data()
    temperature = nn.Parameter(torch.tensor(0.3, dtype=torch.float64))
    criterion = SupConCrossEntropyLoss(0.9, temperature)
    criterion(*model(inputs), labels).backward()
    want = temperature.grad.clone()
    temperature.grad = None
    GradientCache(model, criterion, 3).step(inputs, labels)
    torch.testing.assert_close(temperature.grad, want, rtol=1e-10, atol=1e-12)


def test_gradients_accumulate_like_backward():
    torch.manual_seed(0)
    model = TinyEncoder().double()
    criterion = SupConCrossEntropyLoss()
    inputs, labels = data()
    cache = GradientCache(model, criterion, 4)
    model.zero_grad()
    cache.step(inputs, labels)
    once = gradients(model)
    cache.step(inputs, labels)
    for g, w in zip(gradients(model), once):
        torch.testing.assert_close(g, 2 * w)


def test_hooks_loss_backward_and_sync_context():
    torch.manual_seed(0)
    model = TinyEncoder().double()
    criterion = SupConCrossEntropyLoss()
    inputs, labels = data()
    model.zero_grad()
    GradientCache(model, criterion, 4).step(inputs, labels)
    plain = gradients(model)

    entered = []

    class NoSync:
        def __enter__(self):
            entered.append(True)

        def __exit__(self, *exc):
            return False

    model.zero_grad()
    cache = GradientCache(model, criterion, 4, loss_backward=lambda loss: (3 * loss).backward(),
                          sync_context=NoSync)
    loss, outputs = cache.step(inputs, labels, return_outputs=True)
    assert len(entered) == 2  # 3 chunks: every one but the last
    for g, w in zip(gradients(model), plain):  # a scaled loss scales every gradient
        torch.testing.assert_close(g, 3 * w)
    logits, embeddings = outputs
    assert logits.shape == (11, 3) and embeddings.shape == (11, 5) and not embeddings.requires_grad
    torch.testing.assert_close(loss, criterion(logits, embeddings, labels))


def test_mapping_batches_and_loss_keyword_arguments():
    torch.manual_seed(0)
    model = TinyEncoder().double()
    inputs, labels = data()

    def encode(chunk):
        assert chunk["flag"] == "kept"
        return model(chunk["x"])

    def loss_fn(logits, embeddings, *, labels):
        return SupConCrossEntropyLoss()(logits, embeddings, labels)

    model.zero_grad()
    GradientCache(encode, loss_fn, 5).step({"x": inputs, "flag": "kept"}, labels=labels)
    got = gradients(model)
    model.zero_grad()
    loss_fn(*model(inputs), labels=labels).backward()
    for g, w in zip(got, gradients(model)):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)


def test_supcon_and_cross_entropy_through_a_transformer_with_dropout():
    pytest.importorskip("transformers")
    from scl_kernels.integrations import sentence_embedding
    from support.tiny_models import tiny_classifier
    model = tiny_classifier("roberta", dropout=0.1).double().train()
    generator = torch.Generator().manual_seed(1)
    batch = {"input_ids": torch.randint(3, 100, (10, 9), generator=generator),
             "attention_mask": torch.ones(10, 9, dtype=torch.long)}
    batch["attention_mask"][::3, 6:] = 0
    labels = torch.randint(0, 3, (10,), generator=generator)
    criterion = SupConCrossEntropyLoss(0.9, 0.3)

    def encode(chunk):
        out = model(**chunk, output_hidden_states=True)
        return out.logits, sentence_embedding(model, out, chunk["attention_mask"])

    torch.manual_seed(5)
    model.zero_grad()
    outputs = [encode(chunk) for chunk in split_batch(batch, 4)]
    criterion(torch.cat([o[0] for o in outputs]), torch.cat([o[1] for o in outputs]), labels).backward()
    want = gradients(model)
    torch.manual_seed(5)
    model.zero_grad()
    GradientCache(encode, criterion, 4).step(batch, labels)
    for (name, _), g, w in zip(model.named_parameters(), gradients(model), want):
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-12, msg=name)


def test_split_batch_shapes():
    x = torch.arange(10)
    assert [c.tolist() for c in split_batch(x, 4)] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    chunks = split_batch({"a": x, "b": x[:, None], "name": "n"}, 6)
    assert [c["a"].tolist() for c in chunks] == [[0, 1, 2, 3, 4, 5], [6, 7, 8, 9]]
    assert chunks[1]["b"].shape == (4, 1) and chunks[1]["name"] == "n"
    pairs = split_batch((x, x * 2), 5)
    assert isinstance(pairs[0], tuple) and pairs[1][1].tolist() == [10, 12, 14, 16, 18]


@pytest.mark.parametrize("batch, chunk_size, error, match", [
    (torch.arange(4), 0, ValueError, "chunk_size"),
    (torch.arange(4), 2.0, ValueError, "chunk_size"),
    (torch.tensor(1.0), 2, ValueError, "0-dim"),
    ({"a": torch.arange(4), "b": torch.arange(5)}, 2, ValueError, "first"),
    ({"a": "text"}, 2, ValueError, "no tensor"),
    ("text", 2, TypeError, "batch"),
])
def test_split_batch_errors(batch, chunk_size, error, match):
    with pytest.raises(error, match=match):
        split_batch(batch, chunk_size)


def test_encode_must_return_tensors_of_stable_shape():
    inputs, labels = data()
    with pytest.raises(TypeError, match="encode must return"):
        GradientCache(lambda chunk: {"x": chunk}, SupConCrossEntropyLoss(), 4).step(inputs, labels)
    calls = []

    def unstable(chunk):
        calls.append(1)
        out = chunk if len(calls) <= 3 else chunk[:, :2]
        return out, out

    with pytest.raises(RuntimeError, match="different shapes"):
        GradientCache(unstable, lambda a, b: a.sum() + b.sum(), 4).step(inputs.requires_grad_())
    with pytest.raises(ValueError, match="chunk_size"):
        GradientCache(lambda c: c, SupConCrossEntropyLoss(), 0)
    with pytest.raises(TypeError, match="callables"):
        GradientCache(None, SupConCrossEntropyLoss(), 2)


def test_loss_defers_the_encoder_backward_to_the_callers_backward():
    torch.manual_seed(0)
    model = TinyEncoder(dropout=0.3).double().train()
    criterion = SupConCrossEntropyLoss(0.6, 0.2)
    inputs, labels = data(n=13)
    _, want = chunked_reference(model, criterion, inputs, labels, 4, seed=2)

    torch.manual_seed(2)
    model.zero_grad()
    cache = GradientCache(model, criterion, 4)
    loss = cache.loss(inputs, labels)
    assert loss.requires_grad and all(p.grad is None for p in model.parameters())
    torch.manual_seed(99)  # the trainer may draw random numbers before it calls backward
    (0.5 * loss).backward()  # e.g. gradient accumulation over two batches
    for g, w in zip(gradients(model), want):
        torch.testing.assert_close(g, 0.5 * w, rtol=1e-10, atol=1e-12)


def test_an_output_the_loss_does_not_use_gets_no_gradient():
    torch.manual_seed(0)
    model = TinyEncoder().double()
    inputs, labels = data()
    model.zero_grad()
    GradientCache(model, lambda logits, embeddings: embeddings.square().sum(), 4).step(inputs)
    assert model.head.weight.grad is None  # only the logits depend on the head
    got = model.body[0].weight.grad.clone()
    model.zero_grad()
    model(inputs)[1].square().sum().backward()
    torch.testing.assert_close(got, model.body[0].weight.grad)


def test_loss_without_grad_mode_is_the_value_only():
    torch.manual_seed(0)
    model = TinyEncoder().double()
    criterion = SupConCrossEntropyLoss()
    inputs, labels = data()
    with torch.no_grad():
        for chunk_size in (4, 64):
            loss = GradientCache(model, criterion, chunk_size).loss(inputs, labels)
            assert not loss.requires_grad
            torch.testing.assert_close(loss, criterion(*model(inputs), labels))

"""CoreTuningLoss: the generated rows (hard positives, semi-hard negatives: indices, weights,
labels, soft targets), seeded reproducibility, gradients into the embeddings and the head, the
whole objective against a dense computation written here, and the Hugging Face heads.

scl_kernels.hard_pairs and supcon_loss's focal_gamma come from other branches: the tests that
need them skip until they are merged."""
import inspect

import pytest
import torch
import torch.nn.functional as F

import scl_kernels
from scl_kernels.nn import CoreTuningLoss, FocalLoss
from scl_kernels.nn.core_tuning import _random_other_class_rows

HAS_HARD_PAIRS = hasattr(scl_kernels, "hard_pairs")
HAS_FOCAL = "focal_gamma" in inspect.signature(scl_kernels.supcon_loss).parameters
needs_hard_pairs = pytest.mark.skipif(not HAS_HARD_PAIRS, reason="scl_kernels.hard_pairs is not merged yet")
needs_focal = pytest.mark.skipif(not (HAS_HARD_PAIRS and HAS_FOCAL),
                                 reason="hard_pairs / supcon_loss(focal_gamma=) are not merged yet")


def batch(n=10, classes=3, dim=6, seed=0, negative_rows=()):
    generator = torch.Generator().manual_seed(seed)
    embeddings = torch.randn(n, dim, generator=generator, dtype=torch.float64, requires_grad=True)
    labels = torch.arange(n) % classes
    labels[list(negative_rows)] = -1
    return embeddings, labels


def linear_head(dim=6, classes=3, seed=1):
    torch.manual_seed(seed)
    return torch.nn.Linear(dim, classes).double()


def dense_hardest_pairs(embeddings, labels):
    """Hardest positive (least similar other row of the class) and negative (most similar row
    of another class, labels >= 0 both), lowest index on ties; -1 where none."""
    unit = F.normalize(embeddings.detach(), dim=1)
    similarity = unit @ unit.T
    n = len(labels)
    positive, negative = [], []
    for i in range(n):
        same = [j for j in range(n) if j != i and labels[j] == labels[i] and labels[i] >= 0]
        other = [j for j in range(n) if labels[j] != labels[i] and labels[i] >= 0 and labels[j] >= 0]
        positive.append(min(same, key=lambda j: (similarity[i, j], j)) if same else -1)
        negative.append(min(other, key=lambda j: (-similarity[i, j], j)) if other else -1)
    return positive, negative


def dense_focal_supcon(rows, row_labels, anchors, temperature, gamma):
    """(1/A) sum over the first ``anchors`` rows with a positive of (1/|P|) sum_p
    (1 - pi_ip)^gamma * (-log pi_ip), over every other row of ``rows``."""
    unit = F.normalize(rows, dim=1)
    logits = unit[:anchors] @ unit.T / temperature
    total, counted = rows.new_zeros(()), 0
    for i in range(anchors):
        others = [k for k in range(len(rows)) if k != i]
        log_pi = logits[i, others] - torch.logsumexp(logits[i, others], dim=0)
        positive = [o for o, k in enumerate(others) if row_labels[k] == row_labels[i] and row_labels[i] >= 0]
        if not positive:
            continue
        pi = log_pi[positive].exp()
        total = total + ((1 - pi) ** gamma * -log_pi[positive]).mean()
        counted += 1
    return total / max(counted, 1)


def test_random_other_class_rows_covers_every_other_row_once():
    labels = torch.tensor([0, 1, 1, 2, 0, 1, -1, 2])
    valid = labels >= 0
    for anchor in torch.nonzero(valid).squeeze(1).tolist():
        others = [j for j in range(len(labels)) if valid[j] and labels[j] != labels[anchor]]
        picked = []
        for k in range(len(others)):
            uniforms = torch.zeros(len(labels), dtype=torch.float64)
            uniforms[anchor] = (k + 0.5) / len(others)
            picked.append(int(_random_other_class_rows(labels, uniforms)[anchor]))
        assert sorted(picked) == others
    picks = _random_other_class_rows(labels, torch.rand(len(labels), dtype=torch.float64))
    assert int(picks[6]) == -1
    assert int(_random_other_class_rows(torch.tensor([3, 3]), torch.rand(2, dtype=torch.float64))[0]) == -1


@needs_hard_pairs
def test_generated_rows_are_the_documented_mixes():
    embeddings, labels = batch(n=11, negative_rows=(10,))
    labels[9] = 7  # a class with one row: no hardest positive, still other-class rows
    criterion = CoreTuningLoss(linear_head(classes=8), seed=0, backend="reference")
    rows = criterion.generate(embeddings, labels, 8)
    positive, negative = dense_hardest_pairs(embeddings, labels)
    hard = rows.hard_positive
    expected_anchors = [i for i in range(11) if positive[i] >= 0 and negative[i] >= 0]
    assert rows.anchor_index[hard].tolist() == expected_anchors and 9 not in expected_anchors
    assert rows.first_index[hard].tolist() == [positive[i] for i in expected_anchors]
    assert rows.second_index[hard].tolist() == [negative[i] for i in expected_anchors]
    assert bool((rows.weight[hard] >= 0.5).all()) and bool((rows.weight[hard] <= 1).all())
    assert rows.contrast_labels[hard].tolist() == labels[expected_anchors].tolist()
    semi = ~hard
    assert rows.anchor_index[semi].tolist() == list(range(10))  # not the unlabelled row 10
    assert bool((rows.second_index[semi] == rows.anchor_index[semi]).all())
    first_labels = labels[rows.first_index[semi]]
    assert bool((first_labels >= 0).all()) and bool((first_labels != labels[rows.anchor_index[semi]]).all())
    assert bool((rows.weight[semi] >= 0.8).all()) and bool((rows.contrast_labels[semi] == -1).all())
    mix = rows.weight.unsqueeze(1)
    torch.testing.assert_close(rows.embeddings, mix * embeddings[rows.first_index]
                               + (1 - mix) * embeddings[rows.second_index])
    one_hot = torch.eye(8, dtype=torch.float64)
    torch.testing.assert_close(rows.soft_targets, mix * one_hot[labels[rows.first_index]]
                               + (1 - mix) * one_hot[labels[rows.second_index]])
    torch.testing.assert_close(rows.soft_targets.sum(dim=1), torch.ones(len(rows.weight), dtype=torch.float64))


@needs_focal
def test_seeded_reproducible_and_leaves_the_global_generator_alone():
    embeddings, labels = batch()
    logits = torch.randn(10, 3, dtype=torch.float64)
    first = CoreTuningLoss(linear_head(), seed=3, backend="reference")
    state = torch.get_rng_state()
    values = [first(logits, embeddings, labels) for _ in range(2)]
    assert torch.equal(torch.get_rng_state(), state)
    second = CoreTuningLoss(linear_head(), seed=3, backend="reference")
    again = [second(logits, embeddings, labels) for _ in range(2)]
    assert [v.item() for v in values] == [v.item() for v in again]
    assert values[0].item() != values[1].item()  # a new draw per call
    other = CoreTuningLoss(linear_head(), seed=4, backend="reference")(logits, embeddings, labels)
    assert other.item() != values[0].item()
    resumed = CoreTuningLoss(linear_head(), seed=99, backend="reference")
    replay = CoreTuningLoss(linear_head(), seed=3, backend="reference")
    replay(logits, embeddings, labels)
    resumed.load_state_dict(replay.state_dict())
    assert resumed(logits, embeddings, labels).item() == values[1].item()


@needs_focal
@pytest.mark.parametrize("gamma, lam", [(0.0, 0.3), (1.0, 0.3), (2.0, 2.0)])
def test_the_objective_is_the_dense_computation(gamma, lam):
    embeddings, labels = batch(n=9, seed=int(gamma * 3))
    generator = torch.Generator().manual_seed(5)
    logits = torch.randn(9, 3, generator=generator, dtype=torch.float64, requires_grad=True)
    head = linear_head()
    criterion = CoreTuningLoss(head, lam=lam, temperature=0.2, focal_gamma=gamma, seed=7,
                               backend="reference")
    twin = CoreTuningLoss(head, lam=lam, temperature=0.2, focal_gamma=gamma, seed=7,
                          backend="reference")
    parts = criterion.parts(logits, embeddings, labels)
    inputs = (logits, embeddings, head.weight)
    got = torch.autograd.grad(parts.loss, inputs)

    rows = twin.generate(embeddings, labels, 3)  # the same draws
    everything = torch.cat([embeddings, rows.embeddings])
    every_label = torch.cat([labels, rows.contrast_labels])
    supcon = dense_focal_supcon(everything, every_label, 9, 0.2, gamma)
    cross_entropy = F.cross_entropy(logits, labels)
    head_log_p = torch.log_softmax(head(rows.embeddings), dim=1)
    mixed = -(rows.soft_targets * head_log_p).sum(dim=1).mean()
    expected = cross_entropy + lam * supcon + mixed
    want = torch.autograd.grad(expected, inputs)
    torch.testing.assert_close(parts.supcon, supcon, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(parts.mixed_cross_entropy, mixed, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(parts.loss, expected, rtol=1e-10, atol=1e-12)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-8, atol=1e-10)


@needs_focal
def test_gradient_reaches_the_embeddings_through_the_generated_rows_and_the_head():
    embeddings, labels = batch(seed=2)
    logits = torch.randn(10, 3, dtype=torch.float64, requires_grad=True)
    head = linear_head()
    CoreTuningLoss(head, lam=0.0, seed=1, backend="reference")(logits, embeddings, labels).backward()
    # lam = 0: the embeddings' gradient comes only through the head's mixed cross-entropy
    assert embeddings.grad is not None and float(embeddings.grad.abs().sum()) > 0
    assert head.weight.grad is not None and float(head.weight.grad.abs().sum()) > 0


@needs_focal
def test_a_custom_ce_term_and_label_smoothing():
    embeddings, labels = batch(seed=6)
    logits = torch.randn(10, 3, dtype=torch.float64)
    focal = CoreTuningLoss(linear_head(), ce=FocalLoss(2.0), seed=0, backend="reference")
    assert float(focal.parts(logits, embeddings, labels).cross_entropy) == pytest.approx(
        float(FocalLoss(2.0)(logits, labels)))
    smoothed = CoreTuningLoss(linear_head(), label_smoothing=0.1, seed=0, backend="reference")
    assert float(smoothed.parts(logits, embeddings, labels).cross_entropy) == pytest.approx(
        float(F.cross_entropy(logits, labels, label_smoothing=0.1)))


@needs_focal
@pytest.mark.parametrize("architecture", ["roberta", "bert"])
def test_hugging_face_heads(architecture):
    pytest.importorskip("transformers")
    from scl_kernels.integrations.embeddings import classification_head
    from support.tiny_models import tiny_classifier

    model = tiny_classifier(architecture, 3).double().eval()
    tokens = torch.randint(5, 100, (8, 7))
    outputs = model(input_ids=tokens, output_hidden_states=True)
    first_token = outputs.hidden_states[-1][:, 0]
    head = classification_head(model, "first_token")
    torch.testing.assert_close(head(first_token), outputs.logits)
    labels = torch.arange(8) % 3
    if architecture == "roberta":  # the model's own head, detected as reading [B, T, H]
        criterion = CoreTuningLoss(model.classifier, seed=0, backend="reference")
        assert criterion.head_input == "sequence"
    else:
        criterion = CoreTuningLoss(head, seed=0, backend="reference")
    model.train()
    embeddings = first_token.detach().requires_grad_()
    criterion(outputs.logits.detach(), embeddings, labels).backward()
    assert any(p.grad is not None and float(p.grad.abs().sum()) > 0 for p in head.parameters())


@pytest.mark.parametrize("architecture", ["roberta", "bert"])
def test_classification_head_on_the_mean_embedding(architecture):
    """BERT's classifier reads the mean directly (no pooler); RoBERTa's whole head does; the
    logits of classifier_logits are that head's, not the model's first-token logits."""
    pytest.importorskip("transformers")
    from scl_kernels.integrations.embeddings import (classification_head, classifier_logits,
                                                     sentence_embedding)
    from support.tiny_models import tiny_classifier

    model = tiny_classifier(architecture, 3).double().eval()
    tokens = torch.randint(5, 100, (6, 7))
    mask = torch.ones_like(tokens)
    mask[0, 4:] = 0
    outputs = model(input_ids=tokens, attention_mask=mask, output_hidden_states=True)
    mean = sentence_embedding(model, outputs, mask, "mean")
    if architecture == "bert":
        expected = model.classifier(mean)
    else:
        expected = model.classifier.out_proj(torch.tanh(model.classifier.dense(mean)))
    torch.testing.assert_close(classification_head(model, "mean")(mean), expected)
    torch.testing.assert_close(classifier_logits(model, outputs, mean, "mean"), expected)
    assert classifier_logits(model, outputs, mean, "first_token") is outputs.logits
    assert not torch.allclose(expected, outputs.logits)


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(head=None), TypeError, "head"),
    (dict(lam=-1.0), ValueError, "lam"),
    (dict(temperature=0.0), ValueError, "temperature"),
    (dict(focal_gamma=-0.5), ValueError, "focal_gamma"),
    (dict(mixup_alpha=0.0), ValueError, "mixup_alpha"),
    (dict(negative_weight_floor=0.2), ValueError, "negative_weight_floor"),
    (dict(label_smoothing=1.0), ValueError, "label_smoothing"),
    (dict(head_input="tokens"), ValueError, "head_input"),
    (dict(seed=1, generator=torch.Generator()), ValueError, "seed or generator"),
    (dict(backend="fast"), ValueError, "backend"),
])
def test_bad_options_name_the_argument(kwargs, error, match):
    options = dict(head=linear_head()) | kwargs
    with pytest.raises(error, match=match):
        CoreTuningLoss(**options)


def test_bad_inputs_name_the_argument():
    criterion = CoreTuningLoss(linear_head(), seed=0)
    embeddings, labels = batch()
    with pytest.raises(ValueError, match="logits must have shape"):
        criterion(torch.randn(9, 3, dtype=torch.float64), embeddings, labels)
    with pytest.raises(ValueError, match="embeddings must have shape"):
        criterion(torch.randn(10, 3, dtype=torch.float64), embeddings[:, None], labels)


@pytest.mark.parametrize("ce, row, label, allowed", [
    (None, 4, 3, "lie in [0, 3) or equal the ignore index -100"),
    (None, 2, -1, "lie in [0, 3) or equal the ignore index -100"),
    (FocalLoss(), 4, 3, "be < 3"),  # a custom ce checks its own negatives
])
def test_a_label_beyond_the_logits_names_the_label_and_its_row(ce, row, label, allowed):
    criterion = CoreTuningLoss(linear_head(), seed=0, ce=ce)
    embeddings, labels = batch()  # three classes: 0, 1, 2
    labels[row] = label
    with pytest.raises(ValueError) as raised:
        criterion(torch.randn(10, 3, dtype=torch.float64), embeddings, labels)
    assert str(raised.value) == (f"labels must {allowed} (logits has 3 classes), "
                                 f"got label {label} at row {row}")


@needs_hard_pairs
@pytest.mark.parametrize("head, got", [
    (linear_head(dim=5), "applied to \\(\\d+, 6\\) it raised: mat1 and mat2 shapes"),  # reads 5, not 6
    (linear_head(classes=4), "got \\(\\d+, 4\\)"),  # 4 logits for 3 classes
])
def test_a_head_of_the_wrong_width_names_both_widths(head, got):
    criterion = CoreTuningLoss(head, seed=0)
    embeddings, labels = batch()
    with pytest.raises(ValueError, match="head must map rows of the embeddings' width \\(6\\) to "
                                         f"logits of the logits' width \\(3\\).*{got}"):
        criterion(torch.randn(10, 3, dtype=torch.float64), embeddings, labels)

"""--head-init probe: the head's last linear layer is the L2-penalised logistic regression of the
frozen model's features (linear probing before fine-tuning), for each sentence vector."""
import json

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("sklearn")

from scl_kernels.finetune import cli, training_loop  # noqa: E402
from scl_kernels.finetune.data import TextClassificationData  # noqa: E402
from scl_kernels.integrations.embeddings import classification_head, sentence_embedding  # noqa: E402
from support.tiny_models import tiny_classifier  # noqa: E402
from test_finetune_cli import VOCAB, assets, common, sentences  # noqa: E402,F401


class WordTokenizer:
    """Maps words to VOCAB ids, BERT-style ([CLS] text [SEP], padded with 0)."""

    def __call__(self, texts, truncation, max_length, padding, return_tensors):
        ids = [[2] + [VOCAB.index(w) for w in text.split()][:max_length - 2] + [3] for text in texts]
        width = max(map(len, ids))
        return {"input_ids": torch.tensor([row + [0] * (width - len(row)) for row in ids]),
                "attention_mask": torch.tensor([[1] * len(row) + [0] * (width - len(row))
                                                for row in ids])}


@pytest.mark.parametrize("architecture, embedding", [
    ("bert", "mean"), ("bert", "first_token"), ("roberta", "mean"), ("roberta", "head")])
def test_probe_fits_the_penalised_logistic_regression(architecture, embedding):
    rows = sentences(30, 3)
    labels = [i % 3 for i in range(30)]  # three classes
    data = TextClassificationData([text for text, _ in rows], labels, ["a", "b", "c"])
    model = tiny_classifier(architecture, 3, vocab_size=len(VOCAB), max_position_embeddings=40,
                            dropout=0.1, pad_token_id=0).double()
    untouched = {name: value.clone() for name, value in model.named_parameters()
                 if name not in {f"{p}.{k}" for p in ("classifier", "classifier.out_proj")
                                 for k in ("weight", "bias")}}
    options = training_loop.TrainingOptions(embedding=embedding, eval_batch_size=7, max_length=12)
    model.train()
    training_loop.fit_head_by_probe(model, WordTokenizer(), data, options)
    assert model.training  # restored
    linear = training_loop.final_linear(model)
    for name, value in model.named_parameters():
        if name in untouched:
            assert torch.equal(value, untouched[name]), name
    # The penalised objective's gradient vanishes at the fitted weights (its optimum).
    model.eval()
    batch = WordTokenizer()(data.texts, True, 12, True, "pt")
    captured = []
    hook = linear.register_forward_pre_hook(lambda module, inputs: captured.append(inputs[0]))
    with torch.no_grad():
        outputs = model(**batch, output_hidden_states=True)
        captured.clear()
        head = classification_head(model, embedding)
        logits = head(sentence_embedding(model, outputs, batch["attention_mask"], embedding))
    hook.remove()
    features = captured[-1]
    weight = linear.weight.detach().clone().requires_grad_()
    bias = linear.bias.detach().clone().requires_grad_()
    loss = (torch.nn.functional.cross_entropy(features @ weight.T + bias, torch.tensor(labels),
                                              reduction="sum") + 0.5 * weight.pow(2).sum())
    loss.backward()
    assert float(weight.grad.abs().max()) < 1e-6 and float(bias.grad.abs().max()) < 1e-6
    torch.testing.assert_close(logits, features @ linear.weight.T + linear.bias)
    assert float(linear.weight.detach().abs().max()) > 0


def test_refuses_a_model_without_a_linear_classifier():
    model = torch.nn.Module()
    model.classifier = torch.nn.Sequential(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="no linear classifier"):
        training_loop.final_linear(model)


def test_probe_and_memory_from_the_command_line(assets, tmp_path):
    output = tmp_path / "out"
    assert cli.main(common(assets, output) + [
        "--max-steps", "4", "--seed", "0", "--batch-size", "8", "--objectives", "ce,scl",
        "--no-plot", "--head-init", "probe", "--memory-size", "16", "--embedding", "mean"]) == 2
    assert cli.main(common(assets, output) + [
        "--max-steps", "4", "--seed", "0", "--batch-size", "8", "--objectives", "scl",
        "--no-plot", "--head-init", "probe", "--memory-size", "16", "--embedding", "mean"]) == 0
    run, = json.loads((output / "metrics.json").read_text(encoding="utf-8"))["runs"]
    # the probe's pass over the 24 training rows, 4 steps of 8, the 12 test rows
    assert run["steps"] == 4 and run["encoded_examples"] == 24 + 4 * 8 + 12
    assert 0.0 <= run["accuracy"] <= 1.0

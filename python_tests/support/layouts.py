"""Input builders for every layout of supcon_loss, shared by the backend test files."""
import torch

LAYOUTS = (
    "single_all",       # [N, D] with labels
    "multiview_all",    # [B, V, D] with labels, every row an anchor
    "multiview_one",    # [B, V, D] with labels, view-0 rows are the anchors
    "simclr",           # [B, V, D] without labels: views of a sample are its positives
    "multiview_simclr_one",  # [B, V, D] without labels, contrast_mode="one"
    "cross_labels",     # features [N, D] vs contrast [M, D] with labels on both sides
    "cross_multiview",  # features [B, V, D] vs contrast [M, D] with labels
    "clip",             # features [N, D] vs contrast [N, D], no labels: positive is row i
    "simcse",           # features [N, D] vs contrast [M > N, D], rows >= N extra negatives
)


def make_layout(layout, randn, randint, *, dtype=torch.float32, n=24, d=9, classes=4, views=2,
                extra=5):
    """kwargs for supcon_loss (features, labels, contrast, contrast_labels, contrast_mode)."""
    kw = dict(labels=None, contrast=None, contrast_labels=None, contrast_mode="all")
    if layout == "single_all":
        kw.update(features=randn(n, d, dtype=dtype), labels=randint(0, classes, (n,)))
    elif layout in ("multiview_all", "multiview_one"):
        b = max(1, n // views)
        kw.update(features=randn(b, views, d, dtype=dtype), labels=randint(0, classes, (b,)))
        if layout == "multiview_one":
            kw["contrast_mode"] = "one"
    elif layout in ("simclr", "multiview_simclr_one"):
        b = max(1, n // views)
        kw.update(features=randn(b, views, d, dtype=dtype))
        if layout == "multiview_simclr_one":
            kw["contrast_mode"] = "one"
    elif layout == "cross_labels":
        m = n + extra
        kw.update(features=randn(n, d, dtype=dtype), labels=randint(0, classes, (n,)),
                  contrast=randn(m, d, dtype=dtype), contrast_labels=randint(0, classes, (m,)))
    elif layout == "cross_multiview":
        b = max(1, n // views)
        m = n + extra
        kw.update(features=randn(b, views, d, dtype=dtype), labels=randint(0, classes, (b,)),
                  contrast=randn(m, d, dtype=dtype), contrast_labels=randint(0, classes, (m,)))
    elif layout == "clip":
        kw.update(features=randn(n, d, dtype=dtype), contrast=randn(n, d, dtype=dtype))
    elif layout == "simcse":
        kw.update(features=randn(n, d, dtype=dtype), contrast=randn(n + extra, d, dtype=dtype))
    else:
        raise ValueError(layout)
    return kw



def with_groups(kw, randint, group_count):
    """kw with group ids for its samples and contrast rows: some negative (no group), the rest
    drawn from ``group_count`` ids, so that groups hold positives and non-positives alike."""
    kw = dict(kw)
    kw["groups"] = randint(-1, group_count, (kw["features"].shape[0],))
    if kw["contrast"] is not None:
        kw["contrast_groups"] = randint(-1, group_count, (kw["contrast"].shape[0],))
    return kw


def few_class_rows(randint, rows, classes):
    """[rows, classes] bool multi-hot rows that sums over class subsets take: each of the first 8
    classes a row's with chance 1/4 (no row over 8 classes), every fifth row without one, row 1
    with the first 8 (where C >= 8)."""
    hot = randint(0, 4, (rows, classes)) == 0
    hot[:, 8:] = False
    hot[::5] = False
    if rows > 1:
        hot[1, :8] = classes >= 8
    return hot


def many_class_rows(randint, rows, classes):
    """[rows, classes] bool multi-hot rows past the sums over class subsets: up to 70 classes a
    row (each class with chance 1/2 within the row's own span of the first classes), every
    fifth row without one."""
    hot = randint(0, 2, (rows, classes)) == 1
    spans = randint(1, 70, (rows,))
    hot &= torch.arange(classes, device=hot.device) < spans.unsqueeze(1)
    hot[::5] = False
    return hot


def with_multi_hot_rows(kw, randint, classes, draw=few_class_rows):
    """kw with multi-hot labels for its samples and contrast rows, drawn by ``draw``
    (few_class_rows or many_class_rows)."""
    kw = dict(kw)
    kw["labels"] = draw(randint, kw["features"].shape[0], classes)
    if kw["contrast"] is not None:
        kw["contrast_labels"] = draw(randint, kw["contrast"].shape[0], classes)
    return kw


def num_anchor_rows(kw):
    """How many anchors supcon_loss(reduction='none') returns for these kwargs."""
    f = kw["features"]
    rows = f.shape[0] * f.shape[1] if f.dim() == 3 else f.shape[0]
    if kw.get("contrast_mode") == "one" and kw.get("contrast") is None:
        return f.shape[0]
    return rows


def op_args(kw, temperature=0.1, normalize=True):
    """The arguments supcon_loss passes to torch.ops.scl.supcon for these kwargs, rebuilt from the
    documented semantics (view-major flattening, default labels) without calling the package."""
    f = kw["features"]
    labels, contrast, contrast_labels = kw.get("labels"), kw.get("contrast"), kw.get("contrast_labels")
    if f.dim() == 3:
        b, v, d = f.shape
        rows = f.transpose(0, 1).reshape(v * b, d)
        row_labels = None if labels is None else labels.repeat(v)
    else:
        b, v = f.shape[0], 1
        rows, row_labels = f, labels
    n = rows.shape[0]
    if contrast is None:
        if row_labels is None:
            row_labels = torch.arange(b).repeat(v)
        num_anchors = b if kw.get("contrast_mode") == "one" else n
    else:
        num_anchors = n
        if contrast_labels is None:
            row_labels = torch.arange(n)
            contrast_labels = torch.full((contrast.shape[0],), -1, dtype=torch.long)
            contrast_labels[:n] = row_labels
    t = temperature if isinstance(temperature, torch.Tensor) else torch.tensor(float(temperature),
                                                                               dtype=torch.float64)
    return rows, row_labels, contrast, contrast_labels, t, num_anchors, normalize

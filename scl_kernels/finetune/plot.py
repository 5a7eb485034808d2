"""t-SNE pictures of sentence embeddings coloured by class, as in Gunel et al.'s figure."""
import textwrap
from pathlib import Path

import torch
import torch.nn.functional as F


def tsne_2d(embeddings, seed=0):
    """Projects ``[n, d]`` embeddings to 2-D with scikit-learn's t-SNE.

    The embeddings are L2-normalised first: that is the space the contrastive term shapes.
    The perplexity is 30, or less for small sets (t-SNE needs it below n).

    Returns:
        A ``[n, 2]`` numpy array.
    """
    from sklearn.manifold import TSNE

    points = F.normalize(torch.as_tensor(embeddings, dtype=torch.float32), dim=1).numpy()
    perplexity = max(1.0, min(30.0, (len(points) - 1) / 3))
    return TSNE(n_components=2, perplexity=perplexity, init="pca", random_state=seed).fit_transform(points)


# Inches per panel, and the characters of a panel title's line that fit in it at matplotlib's
# default title size (12 pt): longer lines are wrapped, or they run past the panel and are cut.
PANEL_WIDTH = 5.0
TITLE_LINE_CHARACTERS = 40


def _wrapped(title, width):
    return "\n".join(textwrap.fill(line, width) for line in title.splitlines())


def plot_tsne(panels, label_names, path, *, title=None, seed=0):
    """Draws one t-SNE panel per run, side by side (:func:`tsne_figure`), and saves a PNG.

    Args:
        panels: ``(title, embeddings [n, d], labels [n])`` triples, e.g. the test embeddings of
            the CE and the CE+SCL run of one seed. Long titles are wrapped to the panel.
        label_names: class names for the legend (``labels`` index them).
        path: the PNG file to write.
        title: the figure's title (what the panels show), above them, or None.
        seed: t-SNE's seed.

    Returns:
        The path written.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tsne_figure(panels, label_names, title=title, seed=seed).savefig(path, dpi=120)
    return path


def tsne_figure(panels, label_names, *, title=None, seed=0):
    """The figure of :func:`plot_tsne` (its arguments but the path): a matplotlib ``Figure``."""
    # A bare Figure renders with Agg and leaves pyplot's global backend alone.
    from matplotlib.figure import Figure

    figure = Figure(figsize=(PANEL_WIDTH * len(panels), 4.8), layout="constrained")
    if title is not None:
        figure.suptitle(_wrapped(title, int(TITLE_LINE_CHARACTERS * len(panels))))
    axes = figure.subplots(1, len(panels), squeeze=False)[0]
    colours = [f"C{i % 10}" for i in range(len(label_names))]
    for ax, (panel_title, embeddings, labels) in zip(axes, panels):
        points = tsne_2d(embeddings, seed)
        labels = torch.as_tensor(labels)
        for c, name in enumerate(label_names):
            mask = (labels == c).numpy()
            ax.scatter(points[mask, 0], points[mask, 1], s=6, alpha=0.7, color=colours[c], label=name)
        ax.set_title(_wrapped(panel_title, TITLE_LINE_CHARACTERS))
        ax.set_xticks([])
        ax.set_yticks([])
    axes[0].legend(markerscale=3, loc="best")
    return figure

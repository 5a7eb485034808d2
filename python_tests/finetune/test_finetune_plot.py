"""The t-SNE figure (finetune/plot.py): every objective's title fits its panel, and the figure
says that it shows the test embeddings."""
import pytest
import torch

pytest.importorskip("sklearn")
pytest.importorskip("matplotlib")

from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402

from scl_kernels.finetune.cli import _tsne_title  # noqa: E402
from scl_kernels.finetune.objectives import OBJECTIVES, ObjectiveOptions, describe  # noqa: E402
from scl_kernels.finetune.plot import tsne_figure  # noqa: E402


def test_long_objective_titles_stay_inside_their_panels():
    # The longest titles the command line writes: every objective, and SCL with all its settings.
    options = ObjectiveOptions(memory_size=4096, focal_contrastive_gamma=1.0, label_smoothing=0.1)
    titles = [describe(name, options) + "\naccuracy 81.2%" for name in OBJECTIVES]
    generator = torch.Generator().manual_seed(0)
    panels = [(title, torch.randn(12, 4, generator=generator), torch.arange(12) % 2)
              for title in titles]
    figure = tsne_figure(panels, ["negative", "positive"], title=_tsne_title(500, "mean", 0))
    renderer = FigureCanvasAgg(figure).get_renderer()
    figure.draw(renderer)  # constrained layout places the titles while drawing
    page = figure.bbox
    for ax in figure.axes:
        title, panel = ax.title.get_window_extent(renderer), ax.get_window_extent(renderer)
        assert panel.x0 - 1 <= title.x0 and title.x1 <= panel.x1 + 1, ax.get_title()
        assert 0 <= title.y0 and title.y1 <= page.y1, ax.get_title()
    heading = figure.get_suptitle()
    assert "500 test examples" in heading and "seed 0" in heading
    extent = figure._suptitle.get_window_extent(renderer)
    assert page.x0 <= extent.x0 and extent.x1 <= page.x1 and extent.y1 <= page.y1

"""CoreTuningLoss: contrast-regularised fine-tuning (Core-tuning, Zhang et al., NeurIPS 2021):
cross-entropy, a focal contrastive term over the batch and mixup-generated hard pairs, and the
classifier trained on the mixed embeddings with mixed labels."""
import math
from numbers import Real
from typing import Any, Callable, Dict, Literal, NamedTuple, Optional, Tuple, cast, get_args

import torch
import torch.nn.functional as F
from torch import nn

from .._types import BackendName, Temperature
from .._validation import (check_backend_name, check_focal_gamma, check_tensor,
                           check_temperature)
from ..functional import supcon_loss
from ._classification_targets import IGNORE_INDEX, check_class_indices
from .supcon_cross_entropy import focal_options

HeadInput = Literal["auto", "embedding", "sequence"]
HEAD_INPUTS: Tuple[str, ...] = get_args(HeadInput)


class CoreTuningParts(NamedTuple):
    """The objective and its three terms, each unweighted (for logging)."""
    loss: torch.Tensor
    cross_entropy: torch.Tensor
    supcon: torch.Tensor
    mixed_cross_entropy: torch.Tensor


class GeneratedRows(NamedTuple):
    """The rows Core-tuning adds to a batch, each ``weight * row[first] + (1 - weight) *
    row[second]`` of the batch's embeddings.

    Hard positives (``hard_positive`` True) mix the anchor's hardest positive (``first``) with
    its hardest negative (``second``), ``weight >= 0.5``, and carry the anchor's class;
    semi-hard negatives mix a random row of another class (``first``) with the anchor
    (``second``), ``weight >= negative_weight_floor``, and carry the label -1 (a negative for
    every anchor, no loss of its own).
    """
    embeddings: torch.Tensor  # [G, D], with the batch embeddings' graph
    contrast_labels: torch.Tensor  # [G] int64
    soft_targets: torch.Tensor  # [G, C] weight * onehot(y_first) + (1 - weight) * onehot(y_second)
    anchor_index: torch.Tensor  # [G] int64, the batch row each was made for
    first_index: torch.Tensor  # [G] int64
    second_index: torch.Tensor  # [G] int64
    weight: torch.Tensor  # [G], the weight of row[first]
    hard_positive: torch.Tensor  # [G] bool


def _check_real(value: object, name: str, low: float, high: float = math.inf, *,
                low_open: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{name} must be a float, got {type(value).__name__}")
    number = cast(float, value)  # typeshed's numbers.Real declares no comparisons
    below = number <= low if low_open else number < low
    if not math.isfinite(number) or below or number > high:
        bounds = f"{'(' if low_open else '['}{low:g}, {high:g}]" if high != math.inf else (
            f"{'>' if low_open else '>='} {low:g}")
        raise ValueError(f"{name} must be finite and {bounds}, got {value}")


def _random_other_class_rows(labels: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """For every row with a label >= 0, a row of another class (label >= 0) picked by its
    uniform draw in [0, 1), uniformly among them; -1 where there is none. O(N log N): rows
    sorted by class, the anchor's own class block skipped, no [N, N] mask."""
    picked = torch.full_like(labels, -1)
    valid_rows = torch.nonzero(labels >= 0).squeeze(1)
    if valid_rows.numel() == 0:
        return picked
    valid_labels = labels[valid_rows]
    order = torch.argsort(valid_labels, stable=True)
    classes, class_of_row, counts = torch.unique(valid_labels, return_inverse=True, return_counts=True)
    starts = torch.cumsum(counts, 0) - counts
    others = valid_rows.numel() - counts[class_of_row]
    draw = torch.minimum((uniforms[valid_rows] * others).long(), (others - 1).clamp_min(0))
    position = torch.where(draw < starts[class_of_row], draw, draw + counts[class_of_row])
    has_other = others > 0
    picked[valid_rows[has_other]] = valid_rows[order[position[has_other]]]
    return picked


class CoreTuningLoss(nn.Module):
    """Core-tuning (Zhang et al., "Unleashing the Power of Contrastive Self-Supervised Visual
    Models via Contrast-Regularized Fine-Tuning", NeurIPS 2021), for ``(logits, embeddings,
    labels)``::

        loss = CE(logits, labels) + lam * FocalSupCon(embeddings + generated rows)
               + CE_soft(head(generated rows), mixed labels)

    **Generated rows** (from the batch, each call; see :class:`GeneratedRows` and
    :meth:`generate`). The pairs are mined by :func:`scl_kernels.hard_pairs` on the detached,
    L2-normalised embeddings:

    * a *hard positive* per anchor that has both a hardest positive p (least similar row of its
      class) and a hardest negative n (most similar row of another class):
      ``lam_mix * e_p + (1 - lam_mix) * e_n`` with ``b ~ Beta(mixup_alpha, mixup_alpha)`` and
      ``lam_mix = max(b, 1 - b)`` (the positive keeps the larger weight), labelled with the
      anchor's class: a positive for the anchors of that class that sits towards the negative.
    * a *semi-hard negative* per anchor that has a row of another class: a random such row r
      (not the hardest: too-hard negatives are often false negatives) mixed with the anchor,
      ``w * e_r + (1 - w) * e_anchor`` with ``w = max(b', negative_weight_floor)``,
      ``b' ~ Beta(mixup_alpha, mixup_alpha)`` (the official code's 0.8 floor: mostly the other
      row, pulled towards the anchor), labelled -1, a negative for every anchor.

    The mixes are of the embeddings as given (with their graph: the gradient reaches the
    encoder through them), rows with a negative label take no part, and anchors without a
    hardest positive / negative get no row.

    **The contrastive term** is the focal SupCon (:func:`~scl_kernels.supcon_loss` with
    ``focal_gamma``) whose anchors are the batch's rows and whose contrast set is the batch plus
    the generated rows: the single-set layout over ``cat(embeddings, generated)`` (each anchor's
    own column left out, the generated rows in every denominator, hard positives among the
    positives of their class), averaged over the batch anchors that have a positive. The
    generated rows are contrast rows only: their own anchor losses are computed by the fused op
    and discarded (up to 3x the anchors of plain SCL; a num_anchors option of the op's public
    API would avoid it).

    **The smooth classifier**: ``head`` maps embeddings to logits; it sees the generated rows
    with their mixed (soft) labels ``w * onehot(y_first) + (1 - w) * onehot(y_second)``,
    cross-entropy against probabilities (``F.cross_entropy`` with soft targets), averaged over
    the generated rows (0 when there are none). This smooths the decision boundary between the
    mixed classes.

    ``head`` for Hugging Face classifiers, with ``embeddings`` the last layer's first-token
    vector: RoBERTa's ``model.classifier`` (a ``RobertaClassificationHead``, which takes hidden
    states ``[B, T, H]`` and reads token 0: with ``head_input="auto"`` any module whose class name
    ends in ``ClassificationHead`` gets ``embeddings.unsqueeze(1)``); for BERT, whose logits are
    ``classifier(dropout(pooler(hidden)))``, pass a callable doing that on the embedding, or use
    :func:`scl_kernels.integrations.classification_head`, which builds the right one
    for both families and for the ``"head"`` embedding. An ``nn.Module`` head is registered as a
    submodule (its parameters are the model's: build the optimiser from the model's).

    **Defaults** are the paper's (its official code for CIFAR): ``temperature=0.07``,
    ``focal_gamma=1`` (its weight ``1 - pi``), ``mixup_alpha=1`` (uniform ``b``),
    ``negative_weight_floor=0.8``. Its trade-off ``eta = 10`` multiplies a per-anchor sum
    divided by all 3B columns rather than by ``|P(i)|``; at its CIFAR-10 setting (batch 128,
    about 12 positives per anchor) that is about 0.3 on the ``|P(i)|``-mean used here, hence
    ``lam=0.3``. Deviations from the official code: the generated rows are contrast rows, not
    anchors; hard positives carry the anchor's class (the code gives each mixed row its own
    soft-label class); ``lam_mix`` is folded; the contrastive term sees the embeddings directly
    (the paper adds a 2-layer projection head); CE and the mixed CE are separate means (the code
    pools them over B + G rows).

    **Text encoders** (stated deviations, used by ``python -m scl_kernels.finetune
    --objectives core``): ``temperature`` 0.3 rather than 0.07, the temperature of Gunel et
    al.'s SCL fine-tuning on first-token vectors without a projection head (at 0.07 the
    contrastive gradient on a small pre-trained encoder's [CLS] vectors swamps CE within a few
    steps); ``lam`` as here (0.3). Tune ``lam`` and the temperature per task, as for SCL.

    Seeded: the Beta draws and the random rows come from ``generator`` (or a generator seeded
    with ``seed``), never from torch's global generator, whose state (dropout) is left alone; its
    state is part of the module's state dict. Without either, draws take their seed from the
    global generator.
    """

    head: Callable[[torch.Tensor], torch.Tensor]
    ce: Optional[Callable[[torch.Tensor, torch.Tensor], torch.Tensor]]
    temperature: Temperature

    def __init__(self, head: Callable[[torch.Tensor], torch.Tensor], lam: float = 0.3,
                 temperature: Temperature = 0.07, *, focal_gamma: float = 1.0,
                 mixup_alpha: float = 1.0, negative_weight_floor: float = 0.8,
                 ce: Optional[Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = None,
                 label_smoothing: float = 0.0, head_input: HeadInput = "auto",
                 normalize: bool = True, backend: BackendName = "auto",
                 seed: Optional[int] = None, generator: Optional[torch.Generator] = None) -> None:
        """
        Args:
            head: callable mapping ``[G, D]`` embeddings to ``[G, C]`` logits (see above).
            lam: weight of the contrastive term, a float >= 0 (default 0.3, see above).
            temperature: the contrastive softmax temperature (default 0.07, the paper's).
            focal_gamma: the focal exponent of the contrastive term, >= 0 (default 1, the
                paper's; 0 is plain SupCon).
            mixup_alpha: the Beta(alpha, alpha) parameter of the mixing weights, > 0 (default 1).
            negative_weight_floor: the least weight of the other-class row in a semi-hard
                negative, in [0.5, 1] (default 0.8, the official code's).
            ce: the cross-entropy term on the batch, ``ce(logits, labels)`` (e.g.
                :class:`FocalLoss`); None (default): ``F.cross_entropy`` with
                ``label_smoothing``.
            label_smoothing: torch's label smoothing for the default CE and the mixed CE; default 0.
            head_input: ``"embedding"`` (``head(e)``), ``"sequence"``
                (``head(e.unsqueeze(1))``, for heads reading token 0 of ``[B, T, H]``) or
                ``"auto"`` (default: ``"sequence"`` for modules whose class name ends in
                ``ClassificationHead``).
            normalize: L2-normalise the rows in the contrastive term (default True).
            backend: the SupCon / hard_pairs backend, as in :func:`~scl_kernels.supcon_loss`.
            seed: an int seeding the module's own generator.
            generator: a CPU ``torch.Generator`` to draw from (not with ``seed``).

        Raises:
            TypeError / ValueError naming the argument.
        """
        super().__init__()
        if not callable(head):
            raise TypeError(f"head must be a callable mapping embeddings to logits, got {type(head).__name__}")
        _check_real(lam, "lam", 0.0)
        check_temperature(temperature, check_value=True)
        check_focal_gamma(focal_gamma)
        _check_real(mixup_alpha, "mixup_alpha", 0.0, low_open=True)
        _check_real(negative_weight_floor, "negative_weight_floor", 0.5, 1.0)
        if ce is not None and not callable(ce):
            raise TypeError(f"ce must be a callable ce(logits, labels), got {type(ce).__name__}")
        _check_real(label_smoothing, "label_smoothing", 0.0, 1.0)
        if label_smoothing == 1.0:
            raise ValueError("label_smoothing must be in [0, 1), got 1.0")
        if head_input not in HEAD_INPUTS:
            raise ValueError(f"head_input must be one of {HEAD_INPUTS}, got {head_input!r}")
        if not isinstance(normalize, bool):
            raise TypeError(f"normalize must be a bool, got {type(normalize).__name__}")
        check_backend_name(backend)
        if seed is not None and generator is not None:
            raise ValueError("pass seed or generator, not both")
        if seed is not None:
            if isinstance(seed, bool) or not isinstance(seed, int):
                raise TypeError(f"seed must be an int, got {type(seed).__name__}")
            generator = torch.Generator().manual_seed(seed)
        if generator is not None and (not isinstance(generator, torch.Generator)
                                      or generator.device.type != "cpu"):
            raise TypeError("generator must be a CPU torch.Generator")
        if head_input == "auto":
            head_input = "sequence" if type(head).__name__.endswith("ClassificationHead") else "embedding"
        self.head = head
        self.ce = ce
        # The attributes' types, declared (as the constructor's signature gives them).
        self.lam: float = float(lam)
        self.temperature = temperature
        self.focal_gamma: float = float(focal_gamma)
        self.mixup_alpha: float = float(mixup_alpha)
        self.negative_weight_floor: float = float(negative_weight_floor)
        self.label_smoothing: float = float(label_smoothing)
        self.head_input: HeadInput = head_input
        self.normalize: bool = normalize
        self.backend: BackendName = backend
        self.generator: Optional[torch.Generator] = generator

    def get_extra_state(self) -> Dict[str, Optional[torch.Tensor]]:
        return {"generator_state": None if self.generator is None else self.generator.get_state()}

    def set_extra_state(self, state: Dict[str, Any]) -> None:
        if state.get("generator_state") is not None and self.generator is not None:
            self.generator.set_state(state["generator_state"])

    def _draws(self, count: int) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(b_positive, b_negative, uniforms)``, ``count`` each, on the CPU."""
        seed = int(torch.randint(0, 2 ** 62, (), generator=self.generator))
        # torch.distributions takes no generator: the Beta draws run on a generator seeded from
        # ours inside fork_rng, which restores the global state afterwards.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            alpha = torch.tensor(self.mixup_alpha, dtype=torch.float64)
            betas = torch.distributions.Beta(alpha, alpha).sample((2, count))
        uniforms = torch.rand(count, generator=self.generator, dtype=torch.float64)
        return betas[0], betas[1], uniforms

    def _check(self, logits: torch.Tensor, embeddings: torch.Tensor, labels: torch.Tensor) -> None:
        check_tensor(logits, "logits", floating=True)
        check_tensor(embeddings, "embeddings", floating=True)
        check_tensor(labels, "labels", floating=False)
        if labels.dim() != 1:
            raise ValueError(f"labels must have shape [N], got {tuple(labels.shape)}")
        n = labels.shape[0]
        if logits.dim() != 2 or logits.shape[0] != n:
            raise ValueError(f"logits must have shape [N, num_classes] with N = {n} (the labels), "
                             f"got {tuple(logits.shape)}")
        if embeddings.dim() != 2 or embeddings.shape[0] != n:
            raise ValueError(f"embeddings must have shape [N, D] with N = {n} (the labels), "
                             f"got {tuple(embeddings.shape)}")
        # Checked here, not left to torch: the mixed labels' one_hot would say only "Class
        # values must be smaller than num_classes", naming neither the label nor the logits.
        # The one_hot reads the labels >= 0 only; a custom ce checks its own negatives.
        check_class_indices(labels, logits.shape[1],
                            ignore_index=IGNORE_INDEX if self.ce is None else None)

    @torch.no_grad()
    def _mine(self, embeddings: torch.Tensor, labels: torch.Tensor
              ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The index pairs and weights of the generated rows (no graph)."""
        from .. import hard_pairs  # scl_kernels.nn is imported before the package's hard_pairs

        n = labels.shape[0]
        b_positive, b_negative, uniforms = self._draws(n)
        device = labels.device
        anchors = torch.arange(n, device=device)
        valid = labels >= 0
        # Mined among the rows with a class only: a mixed row's soft label needs both rows' classes,
        # so a classless row (negative label) is nobody's hardest negative here.
        labelled = torch.nonzero(valid).squeeze(1)
        positive_index = torch.full_like(anchors, -1)
        negative_index = torch.full_like(anchors, -1)
        if labelled.numel() > 0:
            pairs = hard_pairs(embeddings.detach()[labelled], labels[labelled], normalize=True,
                               backend=self.backend)
            positive_index[labelled] = torch.where(pairs.positive_index >= 0,
                                                   labelled[pairs.positive_index.clamp_min(0)], -1)
            negative_index[labelled] = torch.where(pairs.negative_index >= 0,
                                                   labelled[pairs.negative_index.clamp_min(0)], -1)
        has_pair = valid & (positive_index >= 0) & (negative_index >= 0)
        other = _random_other_class_rows(labels, uniforms.to(device))
        has_other = valid & (other >= 0)
        positive_weight = torch.maximum(b_positive, 1.0 - b_positive).to(device)
        negative_weight = b_negative.clamp_min(self.negative_weight_floor).to(device)
        return (torch.cat([anchors[has_pair], anchors[has_other]]),
                torch.cat([positive_index[has_pair], other[has_other]]),
                torch.cat([negative_index[has_pair], anchors[has_other]]),
                torch.cat([positive_weight[has_pair], negative_weight[has_other]]),
                torch.cat([torch.ones_like(anchors[has_pair], dtype=torch.bool),
                           torch.zeros_like(anchors[has_other], dtype=torch.bool)]))

    def generate(self, embeddings: torch.Tensor, labels: torch.Tensor,
                 num_classes: int) -> GeneratedRows:
        """The generated rows of a batch (:class:`GeneratedRows`): hard positives first, in
        anchor order, then semi-hard negatives. Draws from the generator."""
        anchor, first, second, weight, hard_positive = self._mine(embeddings, labels)
        mix = weight.to(embeddings.dtype).unsqueeze(1)
        rows = mix * embeddings[first] + (1.0 - mix) * embeddings[second]
        contrast_labels = torch.where(hard_positive, labels[anchor], torch.full_like(anchor, -1))
        one_hot = F.one_hot(labels.clamp_min(0), num_classes).to(weight.dtype)  # rows used have labels >= 0
        targets = weight.unsqueeze(1) * one_hot[first] + (1.0 - weight.unsqueeze(1)) * one_hot[second]
        return GeneratedRows(rows, contrast_labels, targets, anchor, first, second, weight,
                             hard_positive)

    def _cross_entropy(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if self.ce is not None:
            return self.ce(logits, labels)
        return F.cross_entropy(logits, labels, label_smoothing=self.label_smoothing)

    def _supcon(self, embeddings: torch.Tensor, labels: torch.Tensor,
                generated: GeneratedRows) -> torch.Tensor:
        n = labels.shape[0]
        rows = torch.cat([embeddings, generated.embeddings])
        row_labels = torch.cat([labels, generated.contrast_labels])
        per_anchor = supcon_loss(rows, row_labels, self.temperature, normalize=self.normalize,
                                 reduction="none", backend=self.backend,
                                 **focal_options(self.focal_gamma))[:n]
        # Hard positives exist only for anchors with a positive in the batch, so the anchors
        # with a positive are those whose class holds another batch row.
        valid = labels >= 0
        inverse: torch.Tensor
        counts: torch.Tensor
        _, inverse, counts = torch.unique(torch.where(valid, labels, -1), return_inverse=True,
                                          return_counts=True)
        with_positive = valid & (counts[inverse] > 1)
        return per_anchor.sum() / with_positive.sum().clamp_min(1)

    def _mixed_cross_entropy(self, generated: GeneratedRows, like: torch.Tensor) -> torch.Tensor:
        if generated.embeddings.shape[0] == 0:
            return like.new_zeros(())
        inputs = generated.embeddings
        num_classes = generated.soft_targets.shape[1]
        expected = (f"head must map rows of the embeddings' width ({inputs.shape[1]}"
                    + (", passed as [rows, 1, width] with head_input='sequence'"
                       if self.head_input == "sequence" else "")
                    + f") to logits of the logits' width ({num_classes})")
        try:
            logits = self.head(inputs.unsqueeze(1) if self.head_input == "sequence" else inputs)
        except torch.OutOfMemoryError:
            raise
        except RuntimeError as error:
            # torch's own words ("mat1 and mat2 shapes cannot be multiplied") name neither the
            # head nor which width is wrong.
            raise ValueError(f"{expected}; applied to {tuple(inputs.shape)} it raised: "
                             f"{' '.join(str(error).split())}") from error
        if logits.dim() != 2 or logits.shape[1] != num_classes:
            raise ValueError(f"{expected}, got {tuple(logits.shape)}")
        return F.cross_entropy(logits, generated.soft_targets.to(logits.dtype),
                               label_smoothing=self.label_smoothing)

    def parts(self, logits: torch.Tensor, embeddings: torch.Tensor,
              labels: torch.Tensor) -> CoreTuningParts:
        """The objective and its three terms (unweighted): a :class:`CoreTuningParts`
        ``(loss, cross_entropy, supcon, mixed_cross_entropy)``. Takes the arguments of
        :meth:`forward` and draws from the generator as it does."""
        self._check(logits, embeddings, labels)
        generated = self.generate(embeddings, labels, logits.shape[1])
        cross_entropy = self._cross_entropy(logits, labels)
        supcon = self._supcon(embeddings, labels, generated)
        mixed = self._mixed_cross_entropy(generated, cross_entropy)
        return CoreTuningParts(cross_entropy + self.lam * supcon + mixed, cross_entropy, supcon, mixed)

    def forward(self, logits: torch.Tensor, embeddings: torch.Tensor,
                labels: torch.Tensor) -> torch.Tensor:
        """The objective of one batch (a 0-dim tensor).

        Args:
            logits: ``[N, C]`` classifier outputs of the batch.
            embeddings: ``[N, D]`` the vectors ``head`` maps to logits (e.g. the last layer's
                first-token vectors), with their graph.
            labels: integer ``[N]`` class indices; a negative label takes no part in the
                contrastive term and the generated rows, and -100 is ignored by the CE term. A
                label >= C, or with the default CE a negative one other than -100, raises a
                ValueError naming its value and row (on a GPU the check waits for the labels
                once a call; it is left out while a CUDA graph is captured).
        """
        return self.parts(logits, embeddings, labels).loss

    def extra_repr(self) -> str:
        temperature: object = self.temperature
        if isinstance(temperature, torch.Tensor):
            temperature = f"{type(temperature).__name__}(...)"
        return (f"lam={self.lam:g}, temperature={temperature}, focal_gamma={self.focal_gamma:g}, "
                f"mixup_alpha={self.mixup_alpha:g}, negative_weight_floor={self.negative_weight_floor:g}, "
                f"label_smoothing={self.label_smoothing:g}, head_input={self.head_input!r}, "
                f"backend={self.backend!r}")

"""Drop-in replacements for the SupCon losses of other libraries, running on scl_kernels.

Import the one you need explicitly (``import scl_kernels`` does not import this package):

- :mod:`scl_kernels.compat.supcontrast`: ``SupConLoss`` of SupContrast (HobbitLong/SupContrast,
  ``losses.py``).
- :mod:`scl_kernels.compat.pml`: ``SupConLoss`` of pytorch-metric-learning
  (``pytorch_metric_learning.losses.SupConLoss``), and ``MultiSupConLoss``, a multi-label SupCon
  with that library's call (Jaccard-weighted positives, a formula of its own: no release of
  pytorch-metric-learning has one to match).

Each ``SupConLoss`` gives the library's own values and gradients; docs/COMPAT.md shows how to
switch and where their conventions differ from :func:`scl_kernels.supcon_loss`.
"""

"""The fine-tuning application: the ``scl-finetune`` command line (``python -m
scl_kernels.finetune``), its data loading, training loop, reports and plots.

It is built on the library and its integrations (:mod:`scl_kernels.integrations`) and needs the
optional dependencies: ``pip install --no-build-isolation -e ".[finetune]"`` in a checkout.
Nothing in the library imports it.
"""

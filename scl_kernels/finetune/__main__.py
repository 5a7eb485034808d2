"""``python -m scl_kernels.finetune``: the fine-tuning command line (see :mod:`.cli`)."""
import sys

from .cli import main

sys.exit(main())

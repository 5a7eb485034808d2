"""``python -m scl_kernels.finetune`` and ``scl-finetune``: the fine-tuning command line (see
:mod:`.cli`), its threads prepared for a shared machine first (:mod:`scl_kernels.command_threads`:
it may restart the process, so :mod:`.cli`'s imports wait until it has)."""
import sys

from ..command_threads import prepare_command_threads


def main() -> int:
    prepare_command_threads()
    from .cli import main as cli_main
    return cli_main()


if __name__ == "__main__":
    sys.exit(main())

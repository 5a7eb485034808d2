"""The scl-finetune commands' argument parser."""
import argparse
from typing import NoReturn


class OneLineErrorParser(argparse.ArgumentParser):
    """Usage mistakes as one line, as the commands' other errors are: argparse prints its whole
    usage (about 30 lines here) above the message, where the message is what matters."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

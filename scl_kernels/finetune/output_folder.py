"""The output folder of a scl-finetune command, checked before any data or model loads: it must
be writable, and an earlier run's results in it are never replaced silently (--overwrite replaces
them, and the classifier command's --resume adds to them)."""
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from .data import InputError


@dataclass(frozen=True)
class RunOutputs:
    """The files and folders a command writes into its --output-dir."""
    files: tuple[str, ...]
    folders: tuple[str, ...] = ()

    def describe(self) -> str:
        return ", ".join([*self.files, *(f"{name}/" for name in self.folders)])

    def earlier(self, folder: Path) -> list[str]:
        """Those an earlier run left in ``folder`` (folders with a trailing /)."""
        return ([name for name in self.files if (folder / name).exists()]
                + [f"{name}/" for name in self.folders if (folder / name).exists()])

    def check(self, output_dir: str, *, overwrite: bool, resume: Optional[bool] = None) -> None:
        """Raises InputError when ``output_dir`` cannot be written, or holds an earlier run's
        results that neither ``overwrite`` nor ``resume`` says what to do with (``resume`` None:
        the command has no --resume)."""
        if overwrite and resume:
            raise InputError("pass --overwrite or --resume, not both: --resume adds runs to the "
                             "results in --output-dir, --overwrite replaces them")
        folder = Path(output_dir)
        if folder.exists() and not folder.is_dir():
            raise InputError(f"--output-dir {output_dir} is a file, not a folder: pass another "
                             "--output-dir")
        earlier = self.earlier(folder)
        if earlier and not (overwrite or resume):
            add = ", --resume to add to them" if resume is not None else ""
            raise InputError(f"--output-dir {output_dir} holds an earlier run's results "
                             f"({', '.join(earlier)}): pass --overwrite to replace them{add}, or "
                             "another --output-dir")
        existing = folder
        while not existing.exists():
            existing = existing.parent
        if not existing.is_dir():
            raise InputError(f"cannot create --output-dir {output_dir}: {existing} is a file, "
                             "not a folder")
        # Trying is the only test that holds everywhere: os.access says yes to root on a
        # read-only folder, and knows nothing of a read-only mount or a full disk's quota.
        try:
            tempfile.TemporaryDirectory(dir=existing, prefix=".scl-finetune-write-check-").cleanup()
        except OSError as error:
            raise InputError(f"cannot write --output-dir {output_dir}: {existing}: "
                             f"{error.strerror or error}") from None

    def remove_earlier(self, folder: Path) -> list[str]:
        """Deletes what an earlier run wrote in ``folder`` (--overwrite); returns what it deleted."""
        removed = self.earlier(folder)
        for name in (*self.files, *self.folders):
            path = folder / name
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            elif path.exists() or path.is_symlink():
                path.unlink()
        return removed

# The one place the version is written: pyproject.toml reads it (dynamic), the package exports it.
__version__ = "0.1.0"

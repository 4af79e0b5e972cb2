"""The package version (one place; ``xbench.__version__`` re-exports it)."""

__version__ = "0.1.0"

"""speclens: state, force, measure and predict speculative-decoding acceptance length."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("speclens")
except PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.0.0"

__all__ = ["__version__"]

"""Configuration shipped with replab: policy presets, the scenario library, Spark logging.

A package (not a bare folder) so that it travels inside the `--py-files` zip and a wheel alike.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path


def path(*parts: str) -> Path:
    """Filesystem path of a file under conf/ (works from the repo, a wheel and an unpacked zip)."""
    return Path(str(resources.files(__name__).joinpath(*parts)))


def read_text(*parts: str) -> str:
    return resources.files(__name__).joinpath(*parts).read_text()

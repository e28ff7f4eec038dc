"""Configuration shipped with replab: policy presets, the scenario library, Spark logging.

A package (not a bare folder) so that it travels inside the `--py-files` zip and a wheel alike.
"""

from __future__ import annotations

import tempfile
from functools import cache
from importlib import resources
from importlib.abc import Traversable
from pathlib import Path


def path(*parts: str) -> Path:
    """Filesystem path of a file under conf/ (works from the repo, a wheel and an unpacked or zipped package)."""
    root = resources.files(__name__)
    if isinstance(root, Path):
        return root.joinpath(*parts)
    # Imported from a zip (`spark-submit --py-files replab.zip`): callers glob folders and open files by path,
    # so conf/ is copied out of the zip once per process.
    return _extracted().joinpath(*parts)


def read_text(*parts: str) -> str:
    return resources.files(__name__).joinpath(*parts).read_text()


def page_css() -> str:
    """The one stylesheet of replab's HTML pages (the comparison report, the recommendation, the gates' reports)."""
    return read_text("page.css")


@cache
def _extracted() -> Path:
    target = Path(tempfile.mkdtemp(prefix="replab-conf-"))

    def copy(node: Traversable, dest: Path) -> None:
        for child in node.iterdir():
            if child.is_dir():
                if child.name != "__pycache__":
                    (dest / child.name).mkdir()
                    copy(child, dest / child.name)
            else:
                (dest / child.name).write_bytes(child.read_bytes())

    copy(resources.files(__name__), target)
    return target

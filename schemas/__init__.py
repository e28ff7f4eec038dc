"""Every schema of replab, declared once: the trace format (SPEC §2) and the Delta tables (SPEC §4-5); the
version and the floors (`layout`) live on this bottom floor too."""

from schemas.errors import BadInput, GateFailed, ReplabError
from schemas.version import __version__

__all__ = ["BadInput", "GateFailed", "ReplabError", "__version__"]

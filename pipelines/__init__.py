"""The top floor: the `replab` CLI, the spark-submit jobs (`*_job.py`), `make dist`, the notebooks' set-up. Thin."""

from schemas.exports import lazy_exports

#: public name -> the module that defines it
_EXPORTS = {
    "main": "pipelines.cli",
}
__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports("pipelines", _EXPORTS)

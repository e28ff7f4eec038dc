"""Presentation: plots, run figures, comparison tables, the HTML compare, the DLedger-vs-Kafka study."""

from schemas.exports import lazy_exports

#: public name -> the module that defines it
_EXPORTS = {
    "run_figures": "report.figures",
    "COMPARISON_COLUMNS": "report.tables",
    "print_comparison": "report.tables",
    "console": "report.terminal",
    "build_report": "report.compare",
}
__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports("report", _EXPORTS)

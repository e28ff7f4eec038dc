"""Data-quality suites as code (Great Expectations 1.x): the trace gate and the output gate (SPEC §7)."""

from schemas.exports import lazy_exports

#: public name -> the module that defines it
_EXPORTS = {
    "run_trace_gate": "expectations.trace_gate",
    "GateResult": "expectations.trace_gate",
    "run_output_gate": "expectations.output_gate",
    "NamedCheck": "expectations.output_gate",
    "RunOutputs": "expectations.output_gate",
}
__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports("expectations", _EXPORTS)

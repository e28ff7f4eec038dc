"""Data-quality suites as code (Great Expectations 1.x): the trace gate and the output gate (SPEC §7)."""

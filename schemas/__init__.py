"""Every schema of replab, declared once: the trace format (SPEC §2) and the Delta tables (SPEC §4-5)."""

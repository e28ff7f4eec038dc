"""Helpers of both families' reference interpreters: what each hands the judgement (SPEC §9)."""

"""Benchmarks (SPEC §10): measured here, reported in the README, never asserted by timed tests."""

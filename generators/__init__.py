"""Synthetic, seeded traces of a cluster's life in the format of SPEC §2, generated with Spark (SPEC §8)."""

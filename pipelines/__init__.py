"""Spark entry points and the `replab` CLI. Jobs are thin: they route, group, window and write."""

__version__ = "0.1.0"

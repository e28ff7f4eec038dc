"""Reference interpreters (SPEC §9): plain event-by-event replays of SPEC §3, written to be read next to it.

They define what the vectorized kernels (`replay/kernels/`) must compute; differential tests hold the two to
the same outcome for every message and the same partition timeline.
"""

"""Reference interpreter (SPEC §9): a plain event-by-event replay of SPEC §3, written to be read next to it.

It defines what the vectorized kernels (`kernels/` beside it) must compute; differential tests hold the two to
the same outcome for every message and the same timeline.
"""

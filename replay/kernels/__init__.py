"""Vectorized replay kernels, one module per family: numpy over whole segments of a partition's timeline."""

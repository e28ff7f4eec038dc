"""Vectorized kernels of the `kafka` family: numpy and compiled code over whole segments of a partition's timeline."""

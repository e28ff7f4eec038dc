"""Helpers of both families' vectorized kernels: numpy and compiled code over whole segments of a timeline."""

"""Vectorized kernels of the RocketMQ families: numpy and compiled code over whole segments of a group's timeline."""

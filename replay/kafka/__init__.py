"""The `kafka` policy family (SPEC §3.2): replay unit = partition. Its routing, family, reference interpreter and
kernels."""

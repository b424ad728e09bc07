"""Operators: the kernels' Python front-ends and their per-layer plans."""

"""Measurement that writes the calibration profile: the GEMM calibration set and cost-model
fit (``gemm``, ``gemm_set``, ``costfit``) and the energy micro-benchmarks
(``energy_kernels``)."""

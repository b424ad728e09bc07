"""The runtime: the pinned, asymmetry-aware thread pool (``pool``), the C library's interface
(``ffi``) and the task plumbing kernels use to run over the pool (``tasks``)."""

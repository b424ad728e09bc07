"""The runtime: the pinned, asymmetry-aware thread pool (``pool``), the C library's interface
(``ffi``), the task plumbing kernels use to run over the pool (``tasks``), the
largest-remainder split of tasks over clusters (``partition``) and cache-line-aligned buffers
(``memory``)."""

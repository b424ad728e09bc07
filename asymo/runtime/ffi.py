"""Access to the compiled C core (``asymo._native``), with a clear error when it is missing."""

try:
    from asymo._native import ffi, lib  # noqa: F401
except ImportError as exc:  # pragma: no cover - only on a broken install
    raise ImportError(
        "asymo's C core (asymo._native) is not built. Install the package with "
        "`pip install .` or build it in place with `make build`."
    ) from exc

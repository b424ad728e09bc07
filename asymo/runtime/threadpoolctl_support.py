"""asymo's pools as a threadpoolctl library (``user_api="asymo"``).

threadpoolctl finds a library among the shared objects the process has loaded, through the
controllers registered with it. ``import asymo`` imports this module, which loads asymo's C
core and registers the controller, so that ``threadpool_limits(n)`` caps asymo even before
its first call (a pool made inside the block starts capped). The pools themselves are only
imported when threadpoolctl asks (`asymo.runtime.pool.get_thread_limit` /
`set_thread_limit`).
"""
from __future__ import annotations

import os

from asymo.runtime import ffi as _ffi  # noqa: F401  (loads asymo._native for threadpoolctl)

__all__ = ["register"]


def register():
    """Register the controller with threadpoolctl once (no-op without threadpoolctl, or one
    older than 3.5, which has no plug-in controllers)."""
    try:
        import threadpoolctl
    except ImportError:  # pragma: no cover - a declared dependency
        return
    if not hasattr(threadpoolctl, "register") or not hasattr(threadpoolctl, "LibController"):
        return
    if any(getattr(c, "user_api", None) == "asymo"
           for c in getattr(threadpoolctl, "_ALL_CONTROLLERS", [])):
        return

    class AsymoPoolController(threadpoolctl.LibController):
        """threadpoolctl view of asymo's pools (``user_api="asymo"``)."""

        user_api = "asymo"
        internal_api = "asymo"
        filename_prefixes = ("_native",)
        check_symbols = ("asymo_pool_create", "asymo_pool_set_limit")

        def get_num_threads(self):
            from asymo.runtime.pool import get_thread_limit
            return get_thread_limit()

        def set_num_threads(self, num_threads):
            from asymo.runtime.pool import set_thread_limit
            set_thread_limit(num_threads)

        def get_version(self):
            from asymo import __version__
            return __version__

        def set_additional_attributes(self):
            from asymo.runtime import pool
            default = pool._default_pool
            self.policy = default.policy if default is not None else (
                os.environ.get(pool.POLICY_ENV_VAR) or "asymo")

    threadpoolctl.register(AsymoPoolController)


register()

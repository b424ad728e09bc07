"""Regression tests from the hostile review (bad input, closed objects, restore paths)."""
import math
import os
import warnings

import numpy as np
import pytest

from asymo._ffi import ffi, lib

COUNT = ffi.addressof(lib, "asymo_task_count")
NCPU = len(os.sched_getaffinity(0))


def _pool(spec="big:0@1.0,little:1@0.5"):
    from asymo.pool import Pool
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return Pool(spec)


# -- pool ------------------------------------------------------------------------------------
def test_pool_rejects_addresses_wider_than_a_pointer():
    with _pool() as pool:
        with pytest.raises(ValueError, match="ctx address"):
            pool.parallel_for(COUNT, 1, ctx=1 << 70)  # was truncated to NULL: segfault
        with pytest.raises(ValueError, match="fn address"):
            pool.parallel_for((1 << 64) + 8, 1)  # was truncated to 0x8


def test_pool_rejects_ntasks_beyond_int64():
    with _pool() as pool:
        with pytest.raises(ValueError, match="ntasks"):
            pool.parallel_for(COUNT, 1 << 70)
        with pytest.raises(ValueError, match="ntasks"):
            pool.split_counts(1 << 63)


def test_closed_pool_never_touches_freed_handle():
    pool = _pool()
    counts = np.zeros(4, np.int32)
    pool.parallel_for(COUNT, 4, ctx=counts)
    pool.close()
    with pytest.raises(ValueError, match="closed"):
        pool.parallel_for(COUNT, 4, ctx=counts)
    with pytest.raises(ValueError, match="closed"):
        pool.queue  # was a KeyError from reading freed memory
    assert (counts == 1).all()


def test_pool_queue_argument_type():
    from asymo.pool import Pool
    with pytest.raises(ValueError, match="queue"):
        Pool("a:0@1", queue=["mutex"])

"""The Numba backend of the GEMM (``backend="numba"``): the same plans on the same pool.

The kernels are Numba ``@cfunc`` task functions ``void(int64 task, void *ctx)`` that the pool
runs like the C ones; ``ctx`` points to an int64 parameter block (shapes, strides, operand
addresses, per-cluster geometry). Numba has no atomics for host code, so the packed-B sharing
uses per-cluster phases instead of the C driver's cooperative packing: a first job packs every
``kc x nc`` panel of B (tasks on the cluster that will use it, one sliver each), a second job
computes the ``mc x nc`` blocks, each task packing its own ``mc x kc`` A blocks. A job boundary
is the only synchronisation, so nothing can deadlock under work stealing.

The register tile is a small accumulator in L1 (Numba cannot pin a tile in registers), so this
backend reaches roughly a third of the C kernels' speed; it exists as a second, independent
implementation on the pool and as a template for user kernels.

Batches run product by product. The task functions compile on first use (about ten seconds
per dtype) and are cached on disk by Numba afterwards.
"""
from __future__ import annotations

import threading

import numpy as np
from numba import carray, cfunc, njit, types
from numba.extending import intrinsic

from asymo.runtime.ffi import ffi, lib

__all__ = ["run", "TILE"]

#: register tile (mr, nr) of the Numba micro-kernel per dtype
TILE = {"float32": (8, 64), "float64": (8, 32)}

# parameter block layout (int64 slots)
H_M, H_K, H_N = 0, 1, 2
H_A, H_AOFF, H_RSA, H_CSA, H_ASPAN = 3, 4, 5, 6, 7
H_B, H_BOFF, H_RSB, H_CSB, H_BSPAN = 8, 9, 10, 11, 12
H_C, H_COFF, H_RSC, H_CSC, H_CSPAN = 13, 14, 15, 16, 17
H_NCL, H_SPLIT, H_MR, H_NR, H_LONGM = 18, 19, 20, 21, 22
CL0, CLW = 32, 24
# per-cluster slots
C_R0, C_R1, C_Q0, C_Q1, C_MC, C_NC, C_KC = 0, 1, 2, 3, 4, 5, 6
C_NTM, C_NTN, C_NPC, C_T0, C_NT = 7, 8, 9, 10, 11
C_BP, C_NSL, C_PANEL, C_CHUNK, C_PT0, C_PNT = 12, 13, 14, 15, 16, 17
NPARAMS = CL0 + 8 * CLW


@intrinsic
def _ptr_like(typingctx, addr, like):
    """Typed pointer (element type of the array ``like``) from an integer address."""
    sig = types.CPointer(like.dtype)(addr, like)

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_value_type(signature.return_type))
    return sig, codegen


_JIT = dict(fastmath=True, boundscheck=False, nogil=True, cache=True)


@njit(**_JIT)
def _find_cluster(P, t, t0_slot, nt_slot):
    for c in range(P[H_NCL]):
        base = CL0 + c * CLW
        if P[base + t0_slot] <= t < P[base + t0_slot] + P[base + nt_slot]:
            return c
    return -1


@njit(**_JIT)
def _tile(kb, mr, nr, ap, aoff, bp, boff, acc):
    """acc[mr x nr] = A rows (ap[aoff + i*kb + p]) @ B sliver (bp[boff + p*nr + j]).

    The inner loop indexes slices with the bare loop counter: Numba wraps negative indices,
    and only an index LLVM can prove non-negative lets the loop vectorize. The trip counts
    are run-time values on purpose: with constants LLVM unrolls the loop completely and then
    does not vectorize it."""
    acc[:] = 0
    for p in range(kb):
        brow = bp[boff + p * nr:boff + p * nr + nr]
        for i in range(mr):
            av = ap[aoff + i * kb + p]
            arow = acc[i * nr:i * nr + nr]
            for j in range(nr):
                arow[j] += av * brow[j]


@njit(**_JIT)
def _pack_task(t, P, like):
    c = _find_cluster(P, t, C_PT0, C_PNT)
    if c < 0:
        return
    cl = CL0 + c * CLW
    nr = P[H_NR]
    nsl = P[cl + C_NSL]
    lt = t - P[cl + C_PT0]
    s = lt % nsl
    panel = lt // nsl
    tn = panel // P[cl + C_NPC]
    pc = panel % P[cl + C_NPC]
    j0 = P[cl + C_Q0] + tn * P[cl + C_NC]
    j1 = min(j0 + P[cl + C_NC], P[cl + C_Q1])
    jj = j0 + s * nr
    if jj >= j1:
        return
    cols = min(nr, j1 - jj)
    K = P[H_K]
    p0 = pc * P[cl + C_KC]
    kb = min(P[cl + C_KC], K - p0)
    b = carray(_ptr_like(P[H_B], like), (P[H_BSPAN],))
    bp = carray(_ptr_like(P[cl + C_BP], like),
                (P[cl + C_NTN] * P[cl + C_NPC] * P[cl + C_PANEL],))
    dst = panel * P[cl + C_PANEL] + s * kb * nr
    rsb, csb, boff = P[H_RSB], P[H_CSB], P[H_BOFF]
    for p in range(kb):
        src = boff + (p0 + p) * rsb + jj * csb
        d = dst + p * nr
        if csb == 1:
            bp[d:d + cols] = b[src:src + cols]
        else:
            for j in range(cols):
                bp[d + j] = b[src + j * csb]
        for j in range(cols, nr):
            bp[d + j] = 0



@njit(**_JIT)
def _mm_task(t, P, like):
    c = _find_cluster(P, t, C_T0, C_NT)
    if c < 0:
        return
    cl = CL0 + c * CLW
    mr, nr, K = P[H_MR], P[H_NR], P[H_K]
    ntm = P[cl + C_NTM]
    lt = t - P[cl + C_T0]
    tn, tm = lt // ntm, lt % ntm
    mc, nc, kc = P[cl + C_MC], P[cl + C_NC], P[cl + C_KC]
    i0 = P[cl + C_R0] + tm * mc
    i1 = min(i0 + mc, P[cl + C_R1])
    j0 = P[cl + C_Q0] + tn * nc
    j1 = min(j0 + nc, P[cl + C_Q1])
    a = carray(_ptr_like(P[H_A], like), (P[H_ASPAN],))
    cm = carray(_ptr_like(P[H_C], like), (P[H_CSPAN],))
    bp = carray(_ptr_like(P[cl + C_BP], like),
                (P[cl + C_NTN] * P[cl + C_NPC] * P[cl + C_PANEL],))
    rows_pad = (i1 - i0 + mr - 1) // mr * mr
    ap = np.zeros(rows_pad * min(kc, K), like.dtype)
    acc = np.empty(mr * nr, like.dtype)
    rsa, csa, aoff = P[H_RSA], P[H_CSA], P[H_AOFF]
    rsc, csc, coff = P[H_RSC], P[H_CSC], P[H_COFF]
    npc = P[cl + C_NPC]
    for pc in range(npc):
        p0 = pc * kc
        kb = min(kc, K - p0)
        for ii in range(i1 - i0):
            src = aoff + (i0 + ii) * rsa + p0 * csa
            if csa == 1:
                ap[ii * kb:ii * kb + kb] = a[src:src + kb]
            else:
                for p in range(kb):
                    ap[ii * kb + p] = a[src + p * csa]
        for ii in range(i1 - i0, rows_pad):
            for p in range(kb):
                ap[ii * kb + p] = 0
        pbase = (tn * npc + pc) * P[cl + C_PANEL]
        s = 0
        for jj in range(j0, j1, nr):
            cols = min(nr, j1 - jj)
            boff = pbase + s * kb * nr
            for ib in range(i0, i1, mr):
                rows = min(mr, i1 - ib)
                _tile(kb, mr, nr, ap, (ib - i0) * kb, bp, boff, acc)
                for i in range(rows):
                    dst = coff + (ib + i) * rsc + jj * csc
                    arow = acc[i * nr:i * nr + cols]
                    if csc == 1:
                        crow = cm[dst:dst + cols]
                        if pc == 0:
                            crow[:] = arow
                        else:
                            for j in range(cols):
                                crow[j] += arow[j]
                    elif pc == 0:
                        for j in range(cols):
                            cm[dst + j * csc] = arow[j]
                    else:
                        for j in range(cols):
                            cm[dst + j * csc] += arow[j]
            s += 1



@njit(**_JIT)
def _mv_task(t, P, like):
    c = _find_cluster(P, t, C_T0, C_NT)
    if c < 0:
        return
    cl = CL0 + c * CLW
    K = P[H_K]
    long_m = P[H_LONGM] == 1
    if P[H_SPLIT] == 0:
        start, stop = P[cl + C_R0], P[cl + C_R1]
    else:
        start, stop = P[cl + C_Q0], P[cl + C_Q1]
    l0 = start + (t - P[cl + C_T0]) * P[cl + C_CHUNK]
    l1 = min(l0 + P[cl + C_CHUNK], stop)
    a = carray(_ptr_like(P[H_A], like), (P[H_ASPAN],))
    b = carray(_ptr_like(P[H_B], like), (P[H_BSPAN],))
    cm = carray(_ptr_like(P[H_C], like), (P[H_CSPAN],))
    # out(L x S) = mat(L x K) @ vec(K x S)
    if long_m:
        mat, moff, rsl, csp = a, P[H_AOFF], P[H_RSA], P[H_CSA]
        vec, voff, rsp, css = b, P[H_BOFF], P[H_RSB], P[H_CSB]
        ns = P[H_N]
        orl, ocs = P[H_RSC], P[H_CSC]
    else:
        mat, moff, rsl, csp = b, P[H_BOFF], P[H_CSB], P[H_RSB]
        vec, voff, rsp, css = a, P[H_AOFF], P[H_CSA], P[H_RSA]
        ns = P[H_M]
        orl, ocs = P[H_CSC], P[H_RSC]
    coff = P[H_COFF]
    if csp == 1 and rsp == 1:  # dot form, contiguous: slices let LLVM vectorize
        for l in range(l0, l1):
            mrow = mat[moff + l * rsl:moff + l * rsl + K]
            for s in range(ns):
                v = vec[voff + s * css:voff + s * css + K]
                acc = like[0]
                for p in range(K):
                    acc += mrow[p] * v[p]
                cm[coff + l * orl + s * ocs] = acc
    elif csp == 1 or rsl != 1:  # dot form with strides (also the general fallback)
        for l in range(l0, l1):
            for s in range(ns):
                acc = like[0]
                mb = moff + l * rsl
                vb = voff + s * css
                for p in range(K):
                    acc += mat[mb + p * csp] * vec[vb + p * rsp]
                cm[coff + l * orl + s * ocs] = acc
    else:  # axpy form: mat columns are contiguous along l
        n = l1 - l0
        accs = np.zeros(ns * n, like.dtype)
        for p in range(K):
            mcol = mat[moff + p * csp + l0:moff + p * csp + l0 + n]
            for s in range(ns):
                w = vec[voff + p * rsp + s * css]
                arow = accs[s * n:s * n + n]
                for j in range(n):
                    arow[j] += w * mcol[j]
        for s in range(ns):
            for j in range(n):
                cm[coff + (l0 + j) * orl + s * ocs] = accs[s * n + j]



@njit(**_JIT)
def _outer_task(t, P, like):
    c = _find_cluster(P, t, C_T0, C_NT)
    if c < 0:
        return
    cl = CL0 + c * CLW
    i0, i1, j0, j1 = 0, P[H_M], 0, P[H_N]
    first = (t - P[cl + C_T0]) * P[cl + C_CHUNK]
    if P[H_SPLIT] == 0:
        i0 = P[cl + C_R0] + first
        i1 = min(i0 + P[cl + C_CHUNK], P[cl + C_R1])
    else:
        j0 = P[cl + C_Q0] + first
        j1 = min(j0 + P[cl + C_CHUNK], P[cl + C_Q1])
    a = carray(_ptr_like(P[H_A], like), (P[H_ASPAN],))
    b = carray(_ptr_like(P[H_B], like), (P[H_BSPAN],))
    cm = carray(_ptr_like(P[H_C], like), (P[H_CSPAN],))
    rsa, csb, rsc, csc = P[H_RSA], P[H_CSB], P[H_RSC], P[H_CSC]
    for i in range(i0, i1):
        ai = a[P[H_AOFF] + i * rsa]
        for j in range(j0, j1):
            cm[P[H_COFF] + i * rsc + j * csc] = ai * b[P[H_BOFF] + j * csb]



_SIG = types.void(types.int64, types.voidptr)
_LIKE32 = np.zeros(1, np.float32)
_LIKE64 = np.zeros(1, np.float64)


# One cfunc per task kind and dtype, at module level so that Numba's on-disk cache keeps them
# across processes.
@cfunc(_SIG, nopython=True, cache=True)
def _pack_f32(t, ctx):
    _pack_task(t, carray(ctx, (NPARAMS,), np.int64), _LIKE32)


@cfunc(_SIG, nopython=True, cache=True)
def _pack_f64(t, ctx):
    _pack_task(t, carray(ctx, (NPARAMS,), np.int64), _LIKE64)


@cfunc(_SIG, nopython=True, cache=True)
def _mm_f32(t, ctx):
    _mm_task(t, carray(ctx, (NPARAMS,), np.int64), _LIKE32)


@cfunc(_SIG, nopython=True, cache=True)
def _mm_f64(t, ctx):
    _mm_task(t, carray(ctx, (NPARAMS,), np.int64), _LIKE64)


@cfunc(_SIG, nopython=True, cache=True)
def _mv_f32(t, ctx):
    _mv_task(t, carray(ctx, (NPARAMS,), np.int64), _LIKE32)


@cfunc(_SIG, nopython=True, cache=True)
def _mv_f64(t, ctx):
    _mv_task(t, carray(ctx, (NPARAMS,), np.int64), _LIKE64)


@cfunc(_SIG, nopython=True, cache=True)
def _outer_f32(t, ctx):
    _outer_task(t, carray(ctx, (NPARAMS,), np.int64), _LIKE32)


@cfunc(_SIG, nopython=True, cache=True)
def _outer_f64(t, ctx):
    _outer_task(t, carray(ctx, (NPARAMS,), np.int64), _LIKE64)


_CFUNCS = {"float32": {"pack": _pack_f32, "mm": _mm_f32, "mv": _mv_f32, "outer": _outer_f32},
           "float64": {"pack": _pack_f64, "mm": _mm_f64, "mv": _mv_f64, "outer": _outer_f64}}


_kernels = {}
_kernels_lock = threading.Lock()


def _kernels_for(dtype_name):
    """Task function pointers for one dtype (the cfuncs compile, or load, on first use)."""
    with _kernels_lock:
        k = _kernels.get(dtype_name)
        if k is None:
            k = {name: ffi.cast("asymo_task_fn", fn.address)
                 for name, fn in _CFUNCS[dtype_name].items()}
            _kernels[dtype_name] = k
        return k


def _span(arr_addr, shape, strides, es):
    """(base address, element offset of [0, 0], elements spanned) of a strided 2-D view."""
    lo = sum(min(0, (n - 1) * s) for n, s in zip(shape, strides) if n > 0)
    hi = sum(max(0, (n - 1) * s) for n, s in zip(shape, strides) if n > 0)
    return arr_addr + lo, -lo // es, (hi - lo) // es + 1


def _cdiv(a, b):
    return -(-a // b)


def _params(a, b, c, plan, tile):
    """The parameter block, the buffers it points to, and the task counts per cluster."""
    M, K, N = plan.shape
    mr, nr = tile
    es = a.itemsize
    P = np.zeros(NPARAMS, np.int64)
    P[H_M], P[H_K], P[H_N] = M, K, N
    for (arr, slots) in ((a, (H_A, H_AOFF, H_RSA, H_CSA, H_ASPAN)),
                         (b, (H_B, H_BOFF, H_RSB, H_CSB, H_BSPAN)),
                         (c, (H_C, H_COFF, H_RSC, H_CSC, H_CSPAN))):
        base, off, span = _span(arr.__array_interface__["data"][0], arr.shape, arr.strides, es)
        P[slots[0]], P[slots[1]] = base, off
        P[slots[2]], P[slots[3]] = arr.strides[0] // es, arr.strides[1] // es
        P[slots[4]] = span
    P[H_NCL] = plan.nclusters
    P[H_SPLIT] = 0 if plan.split_dim == "M" else 1
    P[H_MR], P[H_NR] = mr, nr
    P[H_LONGM] = 1 if plan.split_dim == "M" else 0
    keep = []
    total, ptotal = 0, 0
    counts, pcounts = [], []
    for ci, ((lo, hi), (mc, nc, kc), chunk) in enumerate(
            zip(plan.cluster_ranges, plan.blocks, plan.chunks)):
        cl = CL0 + ci * CLW
        r0, r1, q0, q1 = (lo, hi, 0, N) if plan.split_dim == "M" else (0, M, lo, hi)
        P[cl + C_R0], P[cl + C_R1], P[cl + C_Q0], P[cl + C_Q1] = r0, r1, q0, q1
        # the Numba tile is wider than the C one: keep blocks whole multiples of it
        mc = _cdiv(mc, mr) * mr
        nc = _cdiv(nc, nr) * nr
        P[cl + C_MC], P[cl + C_NC], P[cl + C_KC], P[cl + C_CHUNK] = mc, nc, kc, chunk
        n = 0
        pn = 0
        if r1 > r0 and q1 > q0:
            if plan.kind == "mm":
                ntm, ntn, npc = _cdiv(r1 - r0, mc), _cdiv(q1 - q0, nc), _cdiv(K, kc)
                nsl = _cdiv(min(nc, q1 - q0), nr)
                panel = nsl * nr * min(kc, K)
                buf = np.empty(ntn * npc * panel, a.dtype)
                keep.append(buf)
                P[cl + C_NTM], P[cl + C_NTN], P[cl + C_NPC] = ntm, ntn, npc
                P[cl + C_BP], P[cl + C_NSL], P[cl + C_PANEL] = buf.ctypes.data, nsl, panel
                n = ntm * ntn
                pn = ntn * npc * nsl
            else:
                n = _cdiv((r1 - r0) if plan.split_dim == "M" else (q1 - q0), chunk)
        P[cl + C_T0], P[cl + C_NT] = total, n
        P[cl + C_PT0], P[cl + C_PNT] = ptotal, pn
        total += n
        ptotal += pn
        counts.append(n)
        pcounts.append(pn)
    return P, keep, counts, pcounts


def _run_one(a, b, c, plan, pool, kern, tile):
    P, keep, counts, pcounts = _params(a, b, c, plan, tile)
    total, ptotal = sum(counts), sum(pcounts)
    ctx = ffi.cast("void *", P.ctypes.data)
    if plan.kind == "mm":
        _launch(pool, kern["pack"], ctx, ptotal, pcounts)
        _launch(pool, kern["mm"], ctx, total, counts)
    else:
        _launch(pool, kern[plan.kind], ctx, total, counts)
    del keep


def _launch(pool, fn, ctx, ntasks, counts):
    if ntasks == 0:
        return
    if pool is None:
        for t in range(ntasks):
            fn(t, ctx)
        return
    full = list(counts) + [0] * (pool.nclusters - len(counts))
    rc = lib.asymo_pool_run(pool._handle, fn, ctx, ntasks, ffi.new("int64_t[]", full), 0)
    if rc != lib.ASYMO_OK:
        raise RuntimeError(f"asymo pool job failed with code {rc}")


def run(a, b, c, offsets, nbatch, plan, pool):
    """C = A @ B for item 0 views a, b, c (and, with offsets, every item of a batch)."""
    from asymo.plan import gemm as gemm_plan
    kern = _kernels_for(a.dtype.name)
    tile = TILE[a.dtype.name]
    M, K, N = plan.shape
    if plan.split_dim == "batch" or nbatch > 1:
        plan = gemm_plan.plan_gemm(M, K, N, a.dtype, pool, isa=plan.isa,
                                   split_dim=None if plan.split_dim == "batch"
                                   else plan.split_dim)
        if plan.split_dim == "batch":  # pragma: no cover - nbatch=1 never splits by batch
            raise AssertionError(plan)
    if plan.in_caller():
        pool = None
    if offsets is None:
        _run_one(a, b, c, plan, pool, kern, tile)
        return
    for i in range(nbatch):
        views = []
        for arr, off in zip((a, b, c), offsets):
            base = arr.__array_interface__["data"][0] + int(off[i])
            views.append(_view_at(arr, base))
        _run_one(views[0], views[1], views[2], plan, pool, kern, tile)


class _At:
    """Minimal array-interface object: arr's shape and strides at another address."""

    def __init__(self, arr, address):
        self.__array_interface__ = {"shape": arr.shape, "strides": arr.strides,
                                    "typestr": arr.dtype.str, "data": (address, False),
                                    "version": 3}


def _view_at(arr, address):
    return np.asarray(_At(arr, address))

"""``GraphModel``: a planned graph that runs on asymo's operations.

At load (:class:`GraphModel` construction) the graph is rewritten once by
:func:`asymo.models.graph_plan.optimize` (BatchNorm folded, activations and residual adds in
the convolutions' epilogues, fully-connected weights stored as rows). Per batch size, on first
use, :meth:`GraphModel.plan` decides the rest as data (:class:`ExecutionPlan`): every tensor's
shape, each node's kernel path, and one activation arena: tensors whose lifetimes do not
overlap share memory (first-fit by size, TFLite's greedy arena), reshapes are views, and
element-wise operators write over an input that dies with them. An *instance* of a plan (the
arena plus every node bound to its input and output views) is made once and reused: inference
allocates no activation memory. Concurrent calls (several threads) take separate instances.

On a pool of several clusters a model runs on all clusters, on the fastest alone, or each node
where it ran faster (:attr:`GraphModel.cluster_choice`): with small layers a slower cluster's
share can cost more than it brings (a job waits for its last task), and what pays depends on
the layer in its network. The model's first calls measure the three and keep the fastest, per
pool and batch size (:meth:`GraphModel.chosen_clusters` says which, with the times).

``model(x)`` takes NCHW float32 NumPy arrays (or torch tensors, giving torch tensors back) of
any batch size. ``model.layers`` are the graph's segments between single-tensor cut points, as
:class:`asymo.models.Layer` descriptors, and ``model.run_layers(x, first, last)`` runs a
contiguous range of them: the pipeline planner and runtime take a ``GraphModel`` like a zoo
model.
"""
from __future__ import annotations

import math
import threading
import time
import weakref
from contextlib import nullcontext
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from asymo.models import spec
from asymo.models.graph import GraphError
from asymo.models.graph_plan import optimize
from asymo.models.shapes import (infer_shapes, ints, pad_amounts, slice_spec, softmax_axis,
                                 split_sizes)
from asymo.ops import blocked as _blocked
from asymo.ops.conv import (BoundConv2d, PackedConvWeight, conv_path, kernel_isa,
                             rows_form_small_plane)
from asymo.ops.packed import PackedMatVec
from asymo.ops.tensors import torch_of
from asymo.plan.split_cost import emulated_period
from asymo.runtime.ffi import ffi, lib
from asymo.runtime.memory import CACHE_LINE, empty_aligned
from asymo.runtime.pool import EVERY_JOB, caller_on_fastest, hold
from asymo.runtime.tasks import JobSequence, merged_call

__all__ = ["GraphModel", "ExecutionPlan", "ALIAS_OPS", "INPLACE_OPS"]

ALIAS_OPS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze"})
INPLACE_OPS = frozenset({"Relu", "Clip", "Sigmoid", "HardSigmoid", "Tanh", "Add", "Mul", "Sub",
                         "Div", "BatchNormalization"})
ALIGN = CACHE_LINE  # bytes: every arena tensor starts on a cache line
#: The largest activation arena planned (bytes), so a bad shape fails clearly, not in malloc.
MAX_ARENA_BYTES = 16 << 30
#: ``GraphModel.cluster_choice`` values: "auto" (measured, see `_Choice`), "all" (every
#: cluster of the pool), "fastest" (the pool's fastest cluster alone).
CLUSTER_CHOICES = ("auto", "all", "fastest")
#: Timed calls per candidate in each phase of "auto" (each candidate's first call, which makes
#: its plans, is not counted).
CHOICE_SAMPLES = 5
#: "auto" runs a node on the fastest cluster alone only when its median there is this much
#: lower.
CHOICE_MARGIN = 0.03
#: The most calls "auto" takes to decide: both candidates with one uncounted call and
#: CHOICE_SAMPLES timed ones each, then the three in turn (the mix's first call uncounted).
CHOICE_MAX_CALLS = 2 * (1 + CHOICE_SAMPLES) + 1 + 3 * CHOICE_SAMPLES
#: Once "auto" has decided, every call of the kept candidate is timed; when the median of
#: CHOICE_RECHECK_CALLS of them is more than CHOICE_RECHECK_MARGIN above the best median
#: another candidate had when the choice was made, the machine may have changed (another load
#: on a core, another speed) -- or the whole host slowed, which that median, taken earlier,
#: cannot show. The kept candidate and that other are then probed (`CHOICE_PROBE_CALLS`), and
#: the choice is measured again only when the other wins. Each check that fires doubles the
#: calls before the next, so a machine that keeps changing is not probed without end.
CHOICE_RECHECK_CALLS = 16
CHOICE_RECHECK_MARGIN = 0.10
#: A decided choice is also probed CHOICE_REFRESH_S seconds after it was made, however its
#: calls run: the check above sees only the kept candidate slow down, not another speed up (a
#: choice of the fastest cluster alone, made while cores were busy or transfers between them
#: dear, would else be kept after they are free again).
CHOICE_REFRESH_S = 30.0
#: A probe: the kept candidate and the other candidate with the best median run in turn, the
#: other first, until each has this many timed calls; the choice is measured again (at most
#: CHOICE_MAX_CALLS calls, part of them on the slower candidates) only when the other's median
#: is CHOICE_MARGIN below the kept one's. Otherwise the choice stays, and the probe's medians
#: (the others scaled by the kept candidate's change) are what later checks compare with.
CHOICE_PROBE_CALLS = 3
#: On a pool of several clusters a convolution's tasks may be backed up (docs/pool.md, "Backup
#: tasks"): a task a stopped core holds is run again on another and the node ends without
#: waiting for it, its late copy running on into the next nodes. The arena of such a pool's
#: instances keeps every tensor's memory BACKUP_OVERLAP_NODES nodes past its last reader (pools
#: of one cluster keep the tighter arena: a larger one costs cache), and before a node the
#: runner waits only for late copies that use memory the node writes (_late_copy_fences).
BACKUP_OVERLAP_NODES = 2
#: "auto": chains of 1x1 and depthwise 3x3 convolutions keep their activations in the
#: blocked-channel layout (NCHW8c, `asymo.ops.blocked`) where the kernels have it, reordered
#: only where a tensor enters or leaves such a chain (`_blocked_tensors`); "off": every tensor
#: NCHW. Measured: docs/conv-and-zoo.md ("The blocked layout").
BLOCKED_LAYOUT = "auto"
#: A chain of blocked tensors is kept only when the reorders its convolutions need (an NCHW
#: input, shortcut or output each cost one pass over that tensor) are at most this many per
#: convolution in it: ResNet's bottleneck blocks pass blocked tensors between 1x1 layers whose
#: other side is a Winograd 3x3 one (NCHW), two reorders for each two convolutions, and ran
#: slower than in NCHW (docs/conv-and-zoo.md, "The blocked layout").
BLOCKED_REORDERS_PER_CONV = 0.5

#: Adjacent convolutions none of which reads another's result (a fire module's two expand
#: layers, an inception module's first layers) run as one pool job, up to this many at once:
#: one submission and one wait instead of several, and each layer's tasks fill the others'
#: tails (`asymo.runtime.tasks.merged_call`). 1: every node alone. Four keep a merged job
#: within ASYMO_MULTI_MAX_PARTS with a share per worker on up to eight workers. Measured:
#: docs/tuning.md.
SIBLING_MAX_NODES = 4
#: A whole call's consecutive pool jobs run from one call into C (`_program`,
#: `asymo.runtime.tasks.JobSequence`; with the late copies' fences where backups run) rather
#: than one Python call each: no worker waits for the interpreter between two jobs. False:
#: node by node. Measured: docs/tuning.md.
SEQUENCE_JOBS = True
#: A convolution whose shortcut (a fused residual add) no later node reads writes its output
#: onto the shortcut's memory, as ONNX Runtime's fused Conv + Sum does: the layer reads each
#: shortcut value just before it writes the sum there, so its output costs no new lines
#: (`_residual_in_place`, `asymo.ops.conv.bind_conv2d`). Only on kernel paths whose tasks write
#: each output once (RESIDUAL_IN_PLACE_PATHS); where tasks may be backed up (pools of several
#: clusters), only on long layers, which then back nothing up (a late copy would read the
#: sum). Measured: docs/tuning.md.
RESIDUAL_IN_PLACE = True
#: ... and in plans with backed-up tasks (pools of several clusters), for layers of at least
#: this many floating-point operations, whose tasks then back nothing up: long layers lose
#: little by a late task, short ones much (measured under the emulator: docs/tuning.md).
RESIDUAL_IN_PLACE_BACKUP_FLOPS = 50e6
RESIDUAL_IN_PLACE_PATHS = frozenset({"conv2d:pointwise runs", "conv2d:pointwise rows",
                                     "conv2d:rows"})
# operators that write a strided output (a channel slice of a concat) correctly
SLICE_WRITERS = frozenset({"asymo.Conv", "MaxPool", "AveragePool", "Relu", "Clip", "Sigmoid",
                           "HardSigmoid", "HardSwish", "asymo.SiLU", "Tanh"})


@dataclass
class ExecutionPlan:
    """What running the graph at one batch size needs, decided once (plain data).

    ``shapes``: tensor -> shape; ``storage``: tensor -> ``(offset, nbytes)`` in the arena
    (bytes), views and in-place results sharing their input's storage (``aliases``: tensor ->
    the tensor whose storage it uses); ``kernels``: node name -> kernel path;
    ``naive_bytes``: what one buffer per tensor would take; ``slices``: tensor -> ``(concat
    output, first channel, end channel)`` for concat inputs written in place; ``overlap``: the
    nodes past its last reader a tensor's memory is kept (a backed-up task's late copy may
    still use it; BACKUP_OVERLAP_NODES on pools of several clusters, else 0); ``siblings``:
    groups of adjacent node indices run as one pool job, longest first (`_sibling_groups`),
    whose tensors the arena keeps apart for the whole group."""

    batch: int
    shapes: dict
    storage: dict
    arena_bytes: int
    kernels: dict
    naive_bytes: int = 0
    aliases: dict = field(default_factory=dict)
    slices: dict = field(default_factory=dict)
    overlap: int = 0
    blocked: dict = field(default_factory=dict)
    siblings: list = field(default_factory=list)

    def to_dict(self):
        return {"batch": self.batch, "arena_bytes": self.arena_bytes,
                "naive_bytes": self.naive_bytes,
                "storage": {k: list(v) for k, v in self.storage.items()},
                "kernels": dict(self.kernels), "aliases": dict(self.aliases),
                "slices": {k: list(v) for k, v in self.slices.items()},
                "blocked": dict(self.blocked),
                "siblings": [list(g) for g in self.siblings],
                "shapes": {k: list(v) for k, v in self.shapes.items()}}


def _kernel_path(node, shapes, consts):
    op = node.op
    if op == "asymo.Conv":
        a = node.attrs
        residual = len(node.inputs) > 3 and bool(node.inputs[3])
        return "conv2d:" + conv_path(shapes[node.inputs[0]], consts[node.inputs[1]].shape,
                                     a["strides"], (a["pads"][0], a["pads"][1]),
                                     a["dilations"], a["group"], activation=a["activation"],
                                     residual=residual, cold_weights=True)
    if op == "asymo.Gemm":
        return "matmul:rows"
    if op in ("MaxPool", "AveragePool", "GlobalAveragePool"):
        return "pool2d"
    if op == "MatMul":
        return "matmul"
    if op in ALIAS_OPS:
        return "view"
    return "numpy"


def _plan(graph, batch, overlap=0):
    """The ExecutionPlan of ``graph`` at ``batch``; a tensor's memory is kept ``overlap`` nodes
    past its last reader (BACKUP_OVERLAP_NODES)."""
    shapes = infer_shapes(graph, batch)
    consts = graph.initializers
    nodes = graph.nodes
    end = len(nodes)
    siblings = _sibling_groups(graph, shapes)
    # a group's nodes run at once: what any of them reads lives to the group's end, what
    # any writes from its start (so no two share memory)
    start, stop = list(range(end)), list(range(end))
    for g in siblings:
        for i in g:
            start[i], stop[i] = min(g), max(g)
    last_use = {}
    for i, n in enumerate(nodes):
        for t in n.inputs:
            if t and t not in consts:
                last_use[t] = stop[i]
    for t in graph.outputs:
        last_use[t] = end
    root = {}
    birth = {}
    for t in graph.inputs:
        root[t.name] = t.name
        birth[t.name] = -1
    members = {t.name: [t.name] for t in graph.inputs}

    def root_death(r):
        return max(last_use.get(m, birth[r]) for m in members[r])

    for i, n in enumerate(nodes):
        outs = [t for t in n.outputs if t]
        x = n.inputs[0] if n.inputs else ""
        if n.op in ALIAS_OPS and x not in consts:
            r = root[x]
            root[outs[0]] = r
            members[r].append(outs[0])
            continue
        if (n.op in INPLACE_OPS and x and x not in consts and x not in graph.outputs
                and shapes[x] == shapes[outs[0]] and root_death(root[x]) == i
                and all(root.get(t) != root[x] for t in n.inputs[1:] if t)):
            r = root[x]
            root[outs[0]] = r
            members[r].append(outs[0])
            continue
        for t in outs:
            root[t] = t
            birth[t] = start[i]
            members[t] = [t]
    # Concat along channels: producers that feed only the concat write straight into their
    # channel slice of its output (no copy); the output's storage is then live from the first
    # producer on.
    readers = {}
    for i, n in enumerate(nodes):
        for t in set(n.inputs):
            if t:
                readers[t] = readers.get(t, 0) + 1
    producer = {t: n for n in nodes for t in n.outputs if t}
    slices = {}
    for i, n in enumerate(nodes):
        if n.op != "Concat":
            continue
        y = n.outputs[0]
        ins = [t for t in n.inputs if t]
        rank = len(shapes[y])
        if (rank != 4 or int(n.attrs.get("axis", 1)) % rank != 1 or root[y] != y
                or len(set(ins)) != len(ins)):
            continue
        if not all(t not in consts and root.get(t) == t and members.get(t) == [t]
                   and t not in graph.outputs and readers.get(t) == 1 and birth.get(t, -1) >= 0
                   and producer[t].op in SLICE_WRITERS and t not in slices
                   for t in ins):
            continue
        c0 = 0
        for t in ins:
            c1 = c0 + shapes[t][1]
            slices[t] = (y, c0, c1)
            del members[t]
            root[t] = y
            members[y].append(t)
            birth[y] = min(birth[y], birth[t])
            c0 = c1
    aliases = {t: r for t, r in root.items() if t != r and t not in slices}
    blocked, runs_blocked = _blocked_tensors(graph, shapes, consts, slices, aliases)
    if RESIDUAL_IN_PLACE:
        _residual_in_place(graph, shapes, consts, start, stop, last_use, root, members,
                           birth, slices, blocked, runs_blocked,
                           RESIDUAL_IN_PLACE_BACKUP_FLOPS if overlap else 0)
    # first-fit placement of the roots, largest first (a root's memory kept `overlap` nodes
    # past its last reader, for late copies of backed-up tasks)
    blocks = []
    for r, ms in members.items():
        nbytes = 4 * math.prod(shapes[r])
        blocks.append((nbytes, birth[r], root_death(r) + overlap, r))
    blocks.sort(key=lambda b: (-b[0], b[1]))
    placed, offsets = [], {}
    for nbytes, b0, d0, r in blocks:
        size = -(-max(nbytes, 1) // ALIGN) * ALIGN
        busy = sorted((o, o + s) for o, s, b1, d1 in placed if b1 <= d0 and b0 <= d1)
        off = 0
        for lo, hi in busy:
            if off + size <= lo:
                break
            off = max(off, hi)
        placed.append((off, size, b0, d0))
        offsets[r] = (off, nbytes)
    arena = max((o + s for o, s, _, _ in placed), default=0)
    if arena > MAX_ARENA_BYTES:
        raise GraphError(f"{graph.name}: batch {batch} needs {arena / 2**30:.1f} GiB of "
                         f"activations, more than the limit of {MAX_ARENA_BYTES / 2**30:.0f} GiB "
                         "(a smaller batch, or raise asymo.models.graph_model.MAX_ARENA_BYTES)")
    storage = {t: offsets[root[t]] for t in root if t not in slices}
    aliases = {t: r for t, r in root.items() if t != r and t not in slices}
    kernels = {n.name: _kernel_path(n, shapes, consts) for n in nodes}
    for n in nodes:
        if n.op == "Concat" and all(slices.get(t, (None,))[0] == n.outputs[0]
                                    for t in n.inputs if t):
            kernels[n.name] = "view (its inputs are written in place)"
    for n in nodes:
        if n.name in runs_blocked:
            kernels[n.name] = f"conv2d:blocked {runs_blocked[n.name]}"
    naive = sum(4 * math.prod(shapes[t]) for t in root)
    return ExecutionPlan(batch, {t: shapes[t] for t in root}, storage, arena, kernels, naive,
                         aliases, slices, overlap, blocked, siblings)


def _sibling_groups(graph, shapes):
    """Runs of adjacent convolution nodes (at most SIBLING_MAX_NODES) none of which reads a
    tensor another of the run writes or writes one another reads or writes, as lists of node
    indices, the most FLOPs first (`merged_call` deals each job's share after the previous
    one's, so the short ones fill the long one's tail)."""
    consts = graph.initializers
    nodes = graph.nodes
    groups, run = [], []

    def flops(i):
        n = nodes[i]
        return math.prod(shapes[n.outputs[0]]) * math.prod(consts[n.inputs[1]].shape[1:])

    def close():
        if len(run) > 1:
            groups.append(sorted(run, key=lambda i: (-flops(i), i)))
        run.clear()

    for i, n in enumerate(nodes):
        if (n.op != "asymo.Conv" or n.inputs[1] not in consts or SIBLING_MAX_NODES < 2
                or n.outputs[0] in graph.outputs):
            close()
            continue
        reads = {t for t in n.inputs if t and t not in consts}
        if run and (len(run) >= SIBLING_MAX_NODES or any(
                reads & set(nodes[k].outputs)
                or set(n.outputs) & ({t for t in nodes[k].inputs if t} | set(nodes[k].outputs))
                for k in run)):
            close()
        run.append(i)
    close()
    return groups


def _residual_in_place(graph, shapes, consts, start, stop, last_use, root, members, birth,
                       slices, blocked, runs_blocked, min_flops=0):
    """`RESIDUAL_IN_PLACE`: give each convolution's output its shortcut's storage (``root``
    and ``members`` updated) where that is safe: this node is the last reader of that storage
    (of every tensor in it), its other readers done before it (the node in no sibling group;
    the shortcut not its input too), the storage a tensor's own of the output's shape (no
    graph input, output, concat slice or blocked tensor in it), the node's kernel path writes
    each output once, the shortcut read there just before, and it has at least ``min_flops``
    floating-point operations (a plan with backups: the layer then backs nothing up)."""
    for i, n in enumerate(graph.nodes):
        if n.op != "asymo.Conv" or len(n.inputs) < 4 or not n.inputs[3]:
            continue
        r, y = n.inputs[3], n.outputs[0]
        if r in consts or r not in root:
            continue
        R = root[r]
        held = members.get(R, ())
        if any(t in held for t in n.inputs[:3] if t):  # (its input in the same memory)
            continue
        if 2 * math.prod(shapes[y]) * math.prod(consts[n.inputs[1]].shape[1:]) < min_flops:
            continue
        if (start[i] != i or stop[i] != i or birth.get(R, -1) < 0
                or max(last_use.get(m, birth[R]) for m in held) != i
                or any(m in graph.outputs or m in slices or m in blocked for m in held)
                or any(v[0] == R for v in slices.values())
                or y in graph.outputs or root.get(y) != y or members.get(y) != [y]
                or y in slices or y in blocked or n.name in runs_blocked
                or shapes[r] != shapes[y] or shapes[R] != shapes[y]
                or _kernel_path(n, shapes, consts) not in RESIDUAL_IN_PLACE_PATHS):
            continue
        root[y] = R
        members[R].append(y)
        del members[y]


def _blocked_kind(n, shapes, consts):
    """The blocked kernel ("pointwise", "depthwise") that can run node ``n``, or None."""
    if n.op != "asymo.Conv" or consts[n.inputs[1]].dtype != np.float32:
        return None
    a = n.attrs
    xshape = shapes[n.inputs[0]]
    kind = _blocked.blocked_kind(xshape, consts[n.inputs[1]].shape, a["strides"],
                                 (a["pads"][0], a["pads"][1]), a["dilations"], a["group"],
                                 a["activation"])
    # on AVX-512 the NCHW rows form beats the (AVX2) blocked 1x1 kernel on small planes
    if kind == "pointwise" and kernel_isa() == "avx512" and rows_form_small_plane(xshape):
        return None
    return kind


def _blocked_tensors(graph, shapes, consts, slices, aliases):
    """Which tensors keep the blocked layout (BLOCKED_LAYOUT), as ``({tensor: "nchw8c"},
    {node: kind})`` for the nodes that run blocked kernels.

    A tensor is blocked when its producer and every reader are convolutions the blocked
    kernels run (reading it as input or shortcut), it is no graph output and shares no
    storage. A node that can run blocked does so when it reads or writes a blocked tensor: its
    other operands are reordered on the way in and out (a node touching none stays NCHW, where
    two reorders would only add work). A chain (blocked tensors joined by the convolutions
    touching them) whose convolutions need more than BLOCKED_REORDERS_PER_CONV reorders each
    stays NCHW."""
    if BLOCKED_LAYOUT == "off":
        return {}, {}
    kinds = {n.name: k for n in graph.nodes if (k := _blocked_kind(n, shapes, consts))}
    if not kinds:
        return {}, {}
    readers = {}
    for n in graph.nodes:
        for i, t in enumerate(n.inputs):
            if t and t not in consts:
                readers.setdefault(t, []).append((n, i))
    shared = set(aliases) | set(aliases.values()) | set(slices)
    blocked = {}
    for n in graph.nodes:
        t = n.outputs[0] if n.outputs else ""
        if (n.name in kinds and t and t not in graph.outputs and t not in shared
                and readers.get(t)
                and all(r.name in kinds and i in (0, 3) for r, i in readers[t])):
            blocked[t] = "nchw8c"

    def operands(n):
        return [t for t in (n.inputs[0], n.inputs[3] if len(n.inputs) > 3 else "",
                            n.outputs[0]) if t]

    # chains: blocked tensors joined by the convolutions that touch them
    chain = {t: t for t in blocked}

    def root(t):
        while chain[t] != t:
            chain[t] = chain[chain[t]]
            t = chain[t]
        return t

    for n in graph.nodes:
        ts = [t for t in operands(n) if t in blocked]
        for t in ts[1:]:
            chain[root(t)] = root(ts[0])
    convs, reorders = {}, {}
    for n in graph.nodes:
        ts = [t for t in operands(n) if t in blocked]
        if n.name not in kinds or not ts:
            continue
        c = root(ts[0])
        convs[c] = convs.get(c, 0) + 1
        planar = _blocked.planar_input_ok(kinds[n.name], shapes[n.inputs[0]])
        reorders[c] = reorders.get(c, 0) + sum(
            1 for i, t in enumerate(operands(n))
            if t not in blocked and not (i == 0 and t == n.inputs[0] and planar))
    blocked = {t: v for t, v in blocked.items()
               if reorders[root(t)] <= BLOCKED_REORDERS_PER_CONV * convs[root(t)]}
    runs = {}
    for n in graph.nodes:
        if n.name in kinds and any(t in blocked for t in operands(n)):
            runs[n.name] = kinds[n.name]
    return blocked, runs


# ---- node runners: make(node, V, C, graph) -> fn(pool) (convolutions: _ConvStep.bind) -----
class _ConvStep:
    """A convolution node: ``step.bind(pool)`` gives the `asymo.ops.conv.BoundConv2d` an
    instance calls on its hot path."""

    __slots__ = ("x", "w", "b", "r", "y", "args", "backup")

    def __init__(self, n, V, C, packed, backup):
        self.x, self.y = V[n.inputs[0]], V[n.outputs[0]]
        self.w = packed  # the weights' PackedConvWeight, shared by the model's instances
        self.b = C[n.inputs[2]] if n.inputs[2] else None
        self.r = V[n.inputs[3]] if len(n.inputs) > 3 and n.inputs[3] else None
        a = n.attrs
        self.args = dict(stride=a["strides"], padding=(a["pads"][0], a["pads"][1]),
                         dilation=a["dilations"], groups=a["group"],
                         activation=a["activation"])
        # the instance's arena has room for late copies (bind_conv2d backs nothing up for a
        # layer writing onto its shortcut)
        self.backup = backup

    def bind(self, pool):
        from asymo.ops.conv import bind_conv2d

        # backups on pools of several clusters (_Instance.run fences); a network's weights
        # leave the caches between calls
        return bind_conv2d(self.x, self.w, self.b, residual=self.r, out=self.y, pool=pool,
                           backup=self.backup and pool.nclusters > 1, cold_weights=True,
                           **self.args)


class _BlockedConvStep:
    """A convolution node in the blocked layout (`asymo.ops.blocked`): its NCHW operands are
    reordered into the instance's own buffers first (a depthwise layer reads an NCHW input
    itself, a row at a time), and an NCHW output computed in one and reordered into place.
    Its jobs back tasks up as `_ConvStep`'s do (the buffers are the node's own: only the
    node's late copies use them, and the call ends with a fence)."""

    __slots__ = ("x", "y", "b", "r", "packed", "args", "xs", "rs", "ys", "backup", "planar")

    def __init__(self, n, V, C, packed, blocked, backup):
        self.x, self.y = V[n.inputs[0]], V[n.outputs[0]]
        b = C[n.inputs[2]] if n.inputs[2] else None
        self.b = None if b is None else np.ascontiguousarray(b, np.float32)
        r = n.inputs[3] if len(n.inputs) > 3 and n.inputs[3] else None
        self.r = V[r] if r else None
        self.packed = packed
        a = n.attrs
        self.args = dict(stride=a["strides"], pads=(a["pads"][0], a["pads"][1]),
                         activation=a["activation"])
        # (an NCHW input read in place must be contiguous: a concat's channel slice at a
        # batch over one is reordered into the node's own buffer instead)
        self.planar = (n.inputs[0] not in blocked and self.x.flags.c_contiguous
                       and _blocked.planar_input_ok(packed.kind, self.x.shape))
        self.xs = None if n.inputs[0] in blocked or self.planar else np.empty_like(self.x)
        self.rs = None if r is None or r in blocked else np.empty_like(self.r)
        self.ys = None if n.outputs[0] in blocked else np.empty_like(self.y)
        self.backup = backup

    def bind(self, pool):
        calls, keep = [], []
        backup = self.backup and pool.nclusters > 1

        def reorder(src, dst, to_blocked):
            c, k = _blocked.bind_reorder(src, dst, to_blocked, pool, backup)
            calls.extend(c)
            keep.extend(k)
            return dst

        x = self.x if self.xs is None else reorder(self.x, self.xs, True)
        r = self.r if self.rs is None else reorder(self.r, self.rs, True)
        y = self.y if self.ys is None else self.ys
        c, k = _blocked.bind_blocked_conv(x, self.packed, self.b, r, y, pool=pool,
                                          backup=backup, x_planar=self.planar, **self.args)
        calls.extend(c)
        keep.extend(k)
        if self.ys is not None:
            reorder(self.ys, self.y, False)
        return BoundConv2d(calls, keep)


def _act(y, act):
    if act == "relu":
        np.maximum(y, 0, out=y)
    elif act == "relu6":
        np.clip(y, 0, 6, out=y)


class _MatVecStep:
    """An ``asymo.Gemm`` node at batch 1 with float32 weights and an activation the C
    epilogue has: a matrix-vector product with the weights packed once by the model
    (`asymo.ops.packed.PackedMatVec`: read as one stream, where the MV kind's dot form reads
    four rows at a time), bound per pool like `_ConvStep`."""

    __slots__ = ("x", "y", "b", "act", "packed")

    def __init__(self, n, V, C, packed):
        self.x, self.y = V[n.inputs[0]], V[n.outputs[0]]
        self.b = C[n.inputs[2]] if n.inputs[2] else None
        self.act = n.attrs.get("activation")
        self.packed = packed

    @staticmethod
    def applies(n, V, C):
        return (V[n.inputs[0]].shape[0] == 1 and C[n.inputs[1]].dtype == np.float32
                and n.attrs.get("activation") in (None, "relu", "relu6"))

    def bind(self, pool):
        return self.packed.bind(self.x, self.y, bias=self.b, activation=self.act, pool=pool)


def _gemm_runner(n, V, C, g):
    from asymo.ops.conv_gemm import matmul_into

    x, y = V[n.inputs[0]], V[n.outputs[0]]
    w = C[n.inputs[1]]
    b = C[n.inputs[2]] if n.inputs[2] else None
    act = n.attrs.get("activation")
    xt, yt = x.T, y.T

    def run(pool):
        # y.T = w @ x.T: one dot product per weight row (rows streamed once)
        matmul_into(w, xt, yt, pool)
        if b is not None:
            np.add(y, b, out=y)
        _act(y, act)
    return run


def _generic_gemm_runner(n, V, C, g):
    """Gemm on computed operands (the planner turns the usual constant-weight Gemm into
    asymo.Gemm): ``alpha * op(A) @ op(B) + beta * C``."""
    from asymo.ops.matmul import matmul

    def get(t):
        return V[t] if t in V else np.asarray(C[t], np.float32)
    a, b = get(n.inputs[0]), get(n.inputs[1])
    a = a.T if n.attrs.get("transA", 0) else a
    b = b.T if n.attrs.get("transB", 0) else b
    c = get(n.inputs[2]) if len(n.inputs) > 2 and n.inputs[2] else None
    alpha = np.float32(n.attrs.get("alpha", 1.0))
    beta = np.float32(n.attrs.get("beta", 1.0))
    y = V[n.outputs[0]]

    def run(pool):
        matmul(a, b, out=y, pool=pool)
        if alpha != 1:
            np.multiply(y, alpha, out=y)
        if c is not None:
            np.add(y, c * beta if beta != 1 else c, out=y)
    return run


def _matmul_runner(n, V, C, g):
    from asymo.ops.matmul import matmul

    a = V.get(n.inputs[0], C.get(n.inputs[0]))
    b = V.get(n.inputs[1], C.get(n.inputs[1]))
    y = V[n.outputs[0]]

    def run(pool):
        matmul(a, b, out=y, pool=pool)
    return run


class _PoolStep:
    """A 2-D pooling node (MaxPool, AveragePool, GlobalAveragePool), bound per pool like
    `_ConvStep` (`asymo.ops.pooling.bind_pool2d`: one C call per run)."""

    def __init__(self, n, V):
        self.x, self.y = V[n.inputs[0]], V[n.outputs[0]]
        if n.op == "GlobalAveragePool":
            self.kind, self.args = "avg", (tuple(self.x.shape[2:]), 1)
        else:
            a = n.attrs
            self.kind = "max" if n.op == "MaxPool" else "avg"
            self.args = (a["kernel_shape"], a["strides"], (a["pads"][0], a["pads"][1]),
                         bool(a["ceil_mode"]), bool(a.get("count_include_pad", 0)))

    def bind(self, pool):
        from asymo.ops.pooling import bind_pool2d

        return bind_pool2d(self.kind, self.x, *self.args, out=self.y, pool=pool)


def _pool_runner(n, V, C, g):
    x, y = V[n.inputs[0]], V[n.outputs[0]]
    if n.op == "GlobalAveragePool" and x.ndim != 4:
        def run(pool):
            np.mean(x, axis=tuple(range(2, x.ndim)), keepdims=True, out=y)
        return run
    return _PoolStep(n, V)


def _global_max_runner(n, V, C, g):
    x, y = V[n.inputs[0]], V[n.outputs[0]]
    axes = tuple(range(2, x.ndim))

    def run(pool):
        np.max(x, axis=axes, keepdims=True, out=y)
    return run


def _unary_runner(n, V, C, g):
    x, y = V[n.inputs[0]], V[n.outputs[0]]
    op, a = n.op, n.attrs
    if op == "Relu":
        return lambda pool: np.maximum(x, 0, out=y)
    if op == "Clip":
        lo, hi = a["min"], a["max"]
        return lambda pool: np.clip(x, lo, hi, out=y)
    if op == "Tanh":
        return lambda pool: np.tanh(x, out=y)

    def sigmoid(src, dst):
        # exp(-x) overflows to inf below about -88, and 1 / (1 + inf) is the right 0 (no
        # warning: `_Instance.run` silences NumPy's floating-point warnings)
        np.negative(src, out=dst)
        np.exp(dst, out=dst)
        dst += 1
        np.reciprocal(dst, out=dst)

    if op == "Sigmoid":
        return lambda pool: sigmoid(x, y)
    if op == "asymo.SiLU":
        def run(pool):
            sigmoid(x, y)
            np.multiply(y, x, out=y)
        return run
    if op in ("HardSigmoid", "HardSwish"):
        alpha = float(a.get("alpha", 0.2)) if op == "HardSigmoid" else 1.0 / 6.0
        beta = float(a.get("beta", 0.5)) if op == "HardSigmoid" else 0.5

        def run(pool):
            np.multiply(x, np.float32(alpha), out=y)
            np.add(y, np.float32(beta), out=y)
            np.clip(y, 0, 1, out=y)
            if op == "HardSwish":
                np.multiply(y, x, out=y)
        return run
    if op == "LeakyRelu":
        alpha = np.float32(a.get("alpha", 0.01))

        def run(pool):
            np.multiply(x, alpha, out=y)
            np.maximum(x, y, out=y) if alpha <= 1 else np.minimum(x, y, out=y)
        return run
    raise AssertionError(op)  # pragma: no cover


def _binary_runner(n, V, C, g):
    f = {"Add": np.add, "Mul": np.multiply, "Sub": np.subtract, "Div": np.divide}[n.op]
    a = V[n.inputs[0]] if n.inputs[0] in V else np.asarray(C[n.inputs[0]], np.float32)
    b = V[n.inputs[1]] if n.inputs[1] in V else np.asarray(C[n.inputs[1]], np.float32)
    y = V[n.outputs[0]]
    return lambda pool: f(a, b, out=y)  # (x / 0: inf or NaN, silently, see `_Instance.run`)


def _bn_runner(n, V, C, g):
    x, y = V[n.inputs[0]], V[n.outputs[0]]
    scale, shift, mean, var = (np.asarray(C[t], np.float64) for t in n.inputs[1:5])
    k = scale / np.sqrt(var + float(n.attrs.get("epsilon", 1e-5)))
    shape = (1, -1) + (1,) * (x.ndim - 2)
    kk = k.astype(np.float32).reshape(shape)
    tt = (shift - mean * k).astype(np.float32).reshape(shape)

    def run(pool):
        np.multiply(x, kk, out=y)
        np.add(y, tt, out=y)
    return run


def _lrn_runner(n, V, C, g):
    x, y = V[n.inputs[0]], V[n.outputs[0]]
    size = int(n.attrs["size"])
    alpha, beta = float(n.attrs.get("alpha", 1e-4)), float(n.attrs.get("beta", 0.75))
    bias = float(n.attrs.get("bias", 1.0))
    c = x.shape[1]
    before, after = (size - 1) // 2, size // 2  # ONNX: floor((size-1)/2) before, ceil after
    hi = np.minimum(np.arange(c) + after + 1, c)
    lo = np.maximum(np.arange(c) - before, 0)

    def run(pool):
        # the window sums of squares as differences of a prefix sum over channels
        csum = np.zeros((x.shape[0], c + 1) + x.shape[2:], np.float32)
        np.cumsum(np.square(x), axis=1, out=csum[:, 1:])
        window = csum[:, hi] - csum[:, lo]
        window *= np.float32(alpha / size)
        window += np.float32(bias)
        np.power(window, np.float32(beta), out=window)
        np.divide(x, window, out=y)
    return run


def _concat_runner(n, V, C, g):
    ins = [V[t] if t in V else C[t] for t in n.inputs if t]
    y = V[n.outputs[0]]
    ax = int(n.attrs.get("axis", 1)) % y.ndim

    def run(pool):
        np.concatenate(ins, axis=ax, out=y)
    return run


def _split_runner(n, V, C, g, shapes):
    x = V[n.inputs[0]]
    ax, sizes = split_sizes(g, n, shapes)
    pairs, start = [], 0
    for t, k in zip(n.outputs, sizes):
        idx = [slice(None)] * x.ndim
        idx[ax] = slice(start, start + k)
        if t:
            pairs.append((V[t], x[tuple(idx)]))
        start += k

    def run(pool):
        for dst, src in pairs:
            np.copyto(dst, src)
    return run


def _slice_runner(n, V, C, g, shapes):
    x, y = V[n.inputs[0]], V[n.outputs[0]]
    idx = [slice(None)] * x.ndim
    for a, b, e, st in slice_spec(g, n, shapes):
        idx[a] = slice(b, e if e >= 0 else None, st)
    src = x[tuple(idx)]
    return lambda pool: np.copyto(y, src)


def _transpose_runner(n, V, C, g):
    x, y = V[n.inputs[0]], V[n.outputs[0]]
    src = x.transpose(ints(n.attrs.get("perm", tuple(reversed(range(x.ndim))))))
    return lambda pool: np.copyto(y, src)


def _copy_runner(n, V, C, g):
    x, y = V[n.inputs[0]], V[n.outputs[0]]
    return lambda pool: np.copyto(y, x)


def _pad_runner(n, V, C, g, shapes):
    x, y = V[n.inputs[0]], V[n.outputs[0]]
    amounts, value = pad_amounts(g, n, shapes)
    mode = n.attrs.get("mode", "constant")
    inner = y[tuple(slice(b, b + d) for (b, _), d in zip(amounts, x.shape))]
    if mode == "constant":
        v = np.float32(value)

        def run(pool):
            y.fill(v)
            np.copyto(inner, x)
        return run
    npmode = {"reflect": "reflect", "edge": "edge"}[mode]
    return lambda pool: np.copyto(y, np.pad(x, amounts, mode=npmode))


def _softmax_runner(n, V, C, g):
    x, y = V[n.inputs[0]], V[n.outputs[0]]
    ax, flattened = softmax_axis(g, n, x.ndim)
    if flattened and ax != x.ndim - 1:
        x2 = x.reshape(math.prod(x.shape[:ax]), -1)
        y2 = y.reshape(x2.shape)
        ax2 = 1
    else:
        x2, y2, ax2 = x, y, ax

    def run(pool):
        np.subtract(x2, x2.max(axis=ax2, keepdims=True), out=y2)
        np.exp(y2, out=y2)
        np.divide(y2, y2.sum(axis=ax2, keepdims=True), out=y2)
    return run


def _reduce_mean_runner(n, V, C, g, shapes):
    from asymo.models.shapes import reduce_axes

    x, y = V[n.inputs[0]], V[n.outputs[0]]
    axes, keep = reduce_axes(g, n, shapes)
    yk = y.reshape(tuple(1 if i in axes else d for i, d in enumerate(x.shape)))

    def run(pool):
        np.mean(x, axis=axes, keepdims=True, out=yk)
    return run


_RUNNERS = {
    "asymo.Gemm": _gemm_runner, "MatMul": _matmul_runner,
    "Gemm": _generic_gemm_runner,
    "MaxPool": _pool_runner, "AveragePool": _pool_runner, "GlobalAveragePool": _pool_runner,
    "GlobalMaxPool": _global_max_runner,
    "Relu": _unary_runner, "Clip": _unary_runner, "Sigmoid": _unary_runner,
    "HardSigmoid": _unary_runner, "HardSwish": _unary_runner, "Tanh": _unary_runner,
    "LeakyRelu": _unary_runner, "asymo.SiLU": _unary_runner,
    "Add": _binary_runner, "Mul": _binary_runner, "Sub": _binary_runner, "Div": _binary_runner,
    "BatchNormalization": _bn_runner, "Concat": _concat_runner, "Transpose": _transpose_runner,
    "Identity": _copy_runner, "Softmax": _softmax_runner, "LRN": _lrn_runner,
}
_SHAPED_RUNNERS = {"ReduceMean": _reduce_mean_runner, "Split": _split_runner,
                   "Slice": _slice_runner, "Pad": _pad_runner}


class _Choice:
    """"auto" cluster choice for one pool and batch size, made from the model's first calls:

    1. calls alternate between the whole pool ("all") and its fastest cluster alone
       ("fastest"), timing every node and the whole call, until each has CHOICE_SAMPLES timed
       calls (its first call makes plans and is not counted);
    2. each node is placed where its median was lower (on the fastest cluster alone only when
       CHOICE_MARGIN lower); if that mixes the two, the mix ("per node"; moving between pools
       costs what node times do not show), "all" and "fastest" run in turn until each has
       CHOICE_SAMPLES more timed calls, so the three are compared over the same stretch of
       time (a machine whose speed drifts favours no candidate);
    3. the candidate with the lowest median call (of step 2's calls when it ran, else step
       1's) is kept;
    4. the kept candidate's calls go on being timed (`observe`): a median of
       CHOICE_RECHECK_CALLS calls more than CHOICE_RECHECK_MARGIN above another candidate's
       median from step 3 starts a probe (step 6), with the check's window doubled;
    5. the first of its calls to end CHOICE_REFRESH_S seconds after the choice's first
       observed call starts a probe too (a refresh);
    6. a probe runs the best other candidate and the kept one in turn, CHOICE_PROBE_CALLS
       timed calls each (`next_probe`): when the other is CHOICE_MARGIN faster, the choice
       starts again from step 1 (a recheck, or a refresh); else it stays, with the probe's
       medians (the host's speed drifts: a candidate measured minutes ago is no yardstick).

    Used under the model's lock."""

    CANDIDATES = ("all", "fastest", "per node")

    def __init__(self):
        self.rechecks = 0  # times this choice was found slower and measured again (step 4)
        self.refreshes = 0  # times it was measured again on schedule (step 5)
        self.probes = 0  # probes that kept the choice (step 6)
        self._checks = 0  # checks that fired (step 4): each doubles the next one's window
        self._start()

    def _start(self):
        """Steps 1-3 from the beginning (a new choice, or a re-check's)."""
        self.recent = []  # the kept candidate's call seconds since the last check
        self.calls = dict.fromkeys(self.CANDIDATES, 0)
        self.node_samples = {"all": [], "fastest": []}
        self.call_samples = {c: [] for c in self.CANDIDATES}  # step 1 (per node: step 2)
        self.final_samples = None  # step 2's call seconds per candidate, when it runs
        self.per_node = None  # the node placement of step 2 (True: fastest cluster alone)
        self.medians = None  # per-node medians (all, fastest)
        self.choice = None
        self.choice_medians = None  # each candidate's median call when the choice was made
        self.on_fastest = None  # the kept placement, per node
        self.kept_since = None  # time.monotonic() at the kept candidate's first observed call
        self.probe = None  # during a probe (step 6): {candidate: call seconds}
        self._probe_cause = None  # what started it: "recheck" or "refresh"

    @property
    def decided(self):
        return self.on_fastest is not None

    @property
    def wants_node_times(self):
        """Whether a call dispatched now should time every node (step 1 places nodes)."""
        return self.per_node is None

    def next_candidate(self):
        if self.per_node is None:
            cand = "all" if self.calls["all"] <= self.calls["fastest"] else "fastest"
        else:  # in turn, the mix first (its first call is not counted)
            cand = min(self.CANDIDATES,
                       key=lambda c: (len(self.final_samples[c]), c != "per node"))
        self.calls[cand] += 1
        return cand

    def record(self, cand, node_seconds, call_seconds):
        if self.decided:
            if self.probe is not None and cand in self.probe:
                self._probe_sample(cand, call_seconds)
            return
        if self.per_node is not None:  # step 2
            if cand == "per node" and not self.call_samples[cand]:
                self.call_samples[cand].append(None)  # the mix's first call: bindings
                return
            self.final_samples[cand].append(call_seconds)
            if min(len(v) for v in self.final_samples.values()) < CHOICE_SAMPLES:
                return
            self._decide(self.final_samples)
            return
        if cand not in self.node_samples or node_seconds is None:
            return  # dispatched before a re-check restarted the choice
        if not self.call_samples[cand]:  # its first call: plans and bindings, not counted
            self.call_samples[cand].append(None)
            return
        self.call_samples[cand].append(call_seconds)
        self.node_samples[cand].append(np.asarray(node_seconds, dtype=np.float64))
        if min(len(v) for v in self.node_samples.values()) < CHOICE_SAMPLES:
            return
        ma, mf = (np.median(np.stack(self.node_samples[k]), axis=0)
                  for k in ("all", "fastest"))
        self.medians = ma, mf
        sel = mf < (1 - CHOICE_MARGIN) * ma
        ran = (ma > 0) | (mf > 0)
        if sel.any() and not sel[ran].all():
            self.per_node = tuple(bool(v) for v in sel)
            self.final_samples = {c: [] for c in self.CANDIDATES}
            return
        self._decide({c: [t for t in v if t is not None]
                      for c, v in self.call_samples.items()})

    def _decide(self, samples):
        med = {c: float(np.median(v)) for c, v in samples.items() if v}
        self.choice = min(med, key=med.get)
        self.choice_medians = med
        n = len(self.medians[0])
        self.on_fastest = (self.per_node if self.choice == "per node"
                           else (self.choice == "fastest",) * n)

    def observe(self, call_seconds, now=None):
        """One call of the kept candidate took ``call_seconds`` and ended at ``now``
        (`time.monotonic`, the default); when a check finds it slower than another candidate
        was (step 4), or the choice is due for a refresh (step 5), a probe starts (True)."""
        if not self.decided or self.probe is not None:
            return False
        now = time.monotonic() if now is None else now
        if self.kept_since is None:
            self.kept_since = now
        elif now - self.kept_since >= CHOICE_REFRESH_S:
            return self._start_probe("refresh")
        self.recent.append(call_seconds)
        if len(self.recent) < CHOICE_RECHECK_CALLS << self._checks:
            return False
        now = float(np.median(self.recent))
        self.recent = []
        others = [v for c, v in self.choice_medians.items() if c != self.choice]
        if not others or now <= (1 + CHOICE_RECHECK_MARGIN) * min(others):
            return False
        self._checks += 1
        return self._start_probe("recheck")

    def _start_probe(self, cause):
        others = {c: v for c, v in self.choice_medians.items() if c != self.choice}
        if not others:
            return False
        rival = min(others, key=others.get)
        self.probe = {rival: [], self.choice: []}
        self._probe_cause = cause
        return True

    def next_probe(self):
        """The candidate a call dispatched now runs during a probe (the other first, then in
        turn), or None: no probe."""
        if self.probe is None:
            return None
        return min(self.probe, key=lambda c: (len(self.probe[c]), c == self.choice))

    def _probe_sample(self, cand, call_seconds):
        self.probe[cand].append(call_seconds)
        if min(len(v) for v in self.probe.values()) < CHOICE_PROBE_CALLS:
            return
        med = {c: float(np.median(v)) for c, v in self.probe.items()}
        kept = med.pop(self.choice)
        (rival, other), = med.items()
        cause, self.probe, self._probe_cause = self._probe_cause, None, None
        self.recent = []
        if other < (1 - CHOICE_MARGIN) * kept:
            if cause == "refresh":
                self.refreshes += 1
            else:
                self.rechecks += 1
            self._start()
            return
        self.probes += 1
        self.kept_since = None
        scale = kept / self.choice_medians[self.choice]
        self.choice_medians = {c: (kept if c == self.choice else other if c == rival
                                   else v * scale)
                               for c, v in self.choice_medians.items()}

    def report(self):
        if self.choice_medians is not None:
            med = {c: self.choice_medians.get(c) for c in self.CANDIDATES}
        else:
            timed = {c: [t for t in v if t is not None] for c, v in self.call_samples.items()}
            med = {c: (float(np.median(v)) if v else None) for c, v in timed.items()}
        return {"choice": self.choice or "measuring", "all_s": med["all"],
                "fastest_s": med["fastest"], "per_node_s": med["per node"],
                "nodes_on_fastest": (int(sum(self.on_fastest)) if self.decided else None),
                "rechecks": self.rechecks, "refreshes": self.refreshes}


class _Instance:
    """An arena and the graph's nodes bound to views of it (used by one call at a time)."""

    def __init__(self, graph, plan, packed, matvec, blocked_weight):
        self.arena = empty_aligned(plan.arena_bytes // 4, np.float32)
        V = {}
        for t, (off, nbytes) in plan.storage.items():
            shape = plan.shapes[t]
            V[t] = self.arena[off // 4: off // 4 + nbytes // 4].reshape(shape)
        for t, (y, c0, c1) in plan.slices.items():
            V[t] = V[y][:, c0:c1]
        self.views = V
        self.blocked = plan.blocked
        self._planar = {}  # blocked tensor -> its NCHW buffer at a run_layers boundary
        self.batch = plan.batch
        self.overlap = plan.overlap
        self.siblings = plan.siblings
        C = graph.initializers
        self.steps = []
        self._bindings = {}  # (id(pool), limit, emulator period) -> _binding's entry
        self._mixed = (None, None)  # ((whole, fastest, placement), steps): the last mix
        for n in graph.nodes:
            if n.op in ALIAS_OPS or plan.kernels[n.name].startswith("view"):
                self.steps.append(None)
                continue
            kind = plan.kernels[n.name]
            if kind.startswith("conv2d:blocked"):
                fn = _BlockedConvStep(n, V, C, blocked_weight(n.inputs[1], kind.split()[-1]),
                                      plan.blocked, plan.overlap > 0)
            elif n.op == "asymo.Conv":
                fn = _ConvStep(n, V, C, packed[n.inputs[1]], plan.overlap > 0)
            elif n.op == "asymo.Gemm" and _MatVecStep.applies(n, V, C):
                # matvec(name): the model's weights packed once, shared by its instances
                fn = _MatVecStep(n, V, C, matvec(n.inputs[1]))
            elif n.op in _SHAPED_RUNNERS:
                fn = _SHAPED_RUNNERS[n.op](n, V, C, graph, plan.shapes | dict(
                    (k, np.shape(v)) for k, v in C.items()))
            else:
                fn = _RUNNERS[n.op](n, V, C, graph)
            self.steps.append(fn)
        # fence_until[k]: before node k, wait for every late copy of the jobs that began
        # before step fence_until[k] (k itself: every late copy; -1: none)
        self.fence_until = None
        if plan.overlap:
            last = _late_copy_fences(graph, plan, self.steps)
            later = [len(self.steps)] * (len(self.steps) + 1)  # the first step at or after i
            for i in range(len(self.steps) - 1, -1, -1):
                later[i] = i if self.steps[i] is not None else later[i + 1]
            # a sibling group's convolutions run as parts of one job (`_merge_siblings`), which
            # began with the group's first node: a late copy of any of them is bounded only by
            # the mark of the first step after the whole group (so no fence names a node
            # inside a group but its first)
            end = list(range(len(self.steps)))
            for group in plan.siblings:
                for k in group:
                    end[k] = max(group)
            self.fence_until = [-1 if j < 0 else later[end[j] + 1] for j in last]

    def boundary(self, t, to_blocked, pool):
        """``(buffer, reorder)`` for tensor ``t`` where a caller hands it in
        (``to_blocked``) or takes it out: its view and None for an NCHW tensor; for a blocked
        one an NCHW buffer of the instance's own and the reorder between it and the view,
        bound once per pool with the steps (`run_layers`)."""
        if t not in self.blocked:
            return self.views[t], None
        buf = self._planar.setdefault(t, np.empty_like(self.views[t]))
        reorders = self._binding(pool)[2]
        call = reorders.get((t, bool(to_blocked)))
        if call is None:
            src, dst = (buf, self.views[t]) if to_blocked else (self.views[t], buf)
            call = reorders[(t, bool(to_blocked))] = BoundConv2d(
                *_blocked.bind_reorder(src, dst, to_blocked, pool))
        return buf, call

    def _binding(self, pool):
        """``(weakref(pool), steps, reorders, merged, program, fenced)``: the steps bound to
        ``pool`` (held by the caller), made on first use, the boundary reorders bound to it
        so far, the sibling groups as one job each (`_merge_siblings`), the whole range as a
        program (`_program`) and, where late copies may run (`fence_until`), as a program
        with their fences (else None)."""
        key = (id(pool), pool.limit, emulated_period())
        entry = self._bindings.get(key)
        if entry is None or entry[0]() is not pool:
            if len(self._bindings) >= 4:  # (all clusters, the fastest alone, limits)
                self._bindings.clear()
            steps = [None if fn is None else
                     fn.bind(pool) if hasattr(fn, "bind") else partial(fn, pool)
                     for fn in self.steps]
            merged = _merge_siblings(self.siblings, steps, pool)
            fenced = None
            if self.fence_until is not None and pool.nclusters > 1:
                fenced = _program(steps, merged, pool, self.fence_until)
            entry = self._bindings[key] = (weakref.ref(pool), steps, {}, merged,
                                           _program(steps, merged, pool), fenced)
        return entry

    def _steps_for(self, pool):
        """The steps bound to ``pool`` (held by the caller), made on first use."""
        return self._binding(pool)[1]

    def _merged_for(self, pool):
        """{first node: (last node, call)}: the sibling groups bound to ``pool`` as one job."""
        return self._binding(pool)[3]

    def run(self, first, last, pool, *, fastest=None, on_fastest=None, times=None):
        """Run nodes ``first..last`` on ``pool``; with ``fastest`` (the pool's fastest-cluster
        pool) the nodes ``on_fastest`` marks (None: every node) run there; ``times`` (a list,
        one entry per node) gets each node's seconds added."""
        # held for the whole run: the bound steps call the pools' C handles directly; the
        # caller (the glue between jobs, and a helper in each) on the fastest cluster. The
        # NumPy steps give inf and NaN where the values lead there (a sigmoid's exp(-x) past
        # float32, x / 0) without a warning, as torch and ONNX Runtime do: set once per run,
        # not per node
        with hold(pool) as pool, caller_on_fastest(pool), \
                (hold(fastest) if fastest is not None else nullcontext()) as fast, \
                np.errstate(over="ignore", divide="ignore", invalid="ignore"):
            bound = self._binding(pool if fastest is None else fast)
            steps = bound[1]
            if fastest is not None and on_fastest is not None:
                whole = self._steps_for(pool)
                src = self._mixed[0]
                if src is None or src[0] is not whole or src[1] is not steps or \
                        src[2] is not on_fastest:  # (a placement is made once per choice)
                    self._mixed = ((whole, steps, on_fastest),
                                   [f if sel else s for s, f, sel in
                                    zip(whole, steps, on_fastest)])
                steps = self._mixed[1]
            # sibling groups as one job, unless each node is timed or placed on its own
            merged = {} if times is not None or on_fastest is not None else bound[3]
            fenced = self.overlap and pool.nclusters > 1 and (fastest is None or
                                                              on_fastest is not None)
            if SEQUENCE_JOBS and times is None and on_fastest is None and first == 0 and \
                    last == len(steps) - 1:
                # a whole call: its program (fenced: fastest is None here, so bound to pool)
                try:
                    for run in bound[5] if fenced else bound[4]:
                        run()
                finally:
                    if fenced:
                        lib.asymo_pool_fence(pool._handle, EVERY_JOB)
                return
            if fenced:
                self._run_fenced(steps, merged, first, last, pool._handle, times)
                return
            if times is None:
                i = first
                while i <= last:
                    group = merged.get(i)
                    if group is not None and group[0] <= last:
                        group[1]()
                        i = group[0] + 1
                        continue
                    if steps[i] is not None:
                        steps[i]()
                    i += 1
                return
            clock = time.perf_counter
            for i in range(first, last + 1):
                fn = steps[i]
                if fn is not None:
                    t0 = clock()
                    fn()
                    times[i] += clock() - t0

    def _run_fenced(self, steps, merged, first, last, handle, times):
        """Nodes ``first..last`` whose convolutions may leave backed-up tasks running, one by
        one from Python: before node k, every late copy of the last earlier node whose memory
        k writes, and of those before it, has returned (`_late_copy_fences`, `_fence_wait`; at
        the end of the call, every late copy). A sibling group (``merged``) waits for what
        each of its nodes waits for."""
        # marks[k]: the last job number before node k began (every job of nodes before k is
        # at or below it; a sibling group's, at its first node)
        marks = [0] * len(steps)
        clock = time.perf_counter
        try:
            i = first
            while i <= last:
                group = merged.get(i)
                if group is not None and group[0] <= last:
                    nodes = range(i, group[0] + 1)
                    _fence(handle, marks, _fence_wait(self.fence_until, nodes, first), i)
                    group[1]()
                    i = group[0] + 1
                    continue
                fn = steps[i]
                if fn is not None:
                    _fence(handle, marks, _fence_wait(self.fence_until, (i,), first), i)
                    if times is None:
                        fn()
                    else:
                        t0 = clock()
                        fn()
                        times[i] += clock() - t0
                i += 1
        finally:
            lib.asymo_pool_fence(handle, EVERY_JOB)


def _merge_siblings(groups, steps, pool):
    """{first node: (last node, call)} for the sibling groups (`_sibling_groups`, nodes
    adjacent and longest first) whose bound steps are convolutions running only pool jobs
    (`BoundConv2d.calls`): a `BoundConv2d` running each node's other jobs (a padded copy)
    first, in node order, then every node's last job as parts of one (`merged_call`). A group
    with a node that is not (a fallback, an inline job) keeps its nodes apart."""
    merged = {}
    for group in groups:
        calls = [getattr(steps[i], "calls", None) for i in group]
        if any(not c for c in calls):
            continue
        last = merged_call(pool, [c[-1] for c in calls])
        if last is None:
            continue
        call, keep = last
        pre = [c for i in sorted(group) for c in calls[group.index(i)][:-1]]
        merged[min(group)] = (max(group), BoundConv2d(pre + [call],
                                                      [keep] + [steps[i] for i in group]))
    return merged


def _fence_wait(after, nodes, first):
    """What node ``nodes[0]`` (alone, or the first of a sibling group's ``nodes``) waits for
    before it runs, from ``after`` (`_Instance.fence_until`) in a run that began at node
    ``first``: `JobSequence.WAIT_NONE`; `JobSequence.WAIT_ALL` (a node waits on itself: every
    late copy so far); or the node whose mark (the last job number before it began) bounds the
    late copies to wait for -- the latest of the nodes' (marks grow in node order; ``after``
    never names a node inside a sibling group but its first, which writes the group's mark)."""
    i = nodes[0]
    waits = [after[k] for k in nodes if after[k] >= first]
    if not waits:
        return JobSequence.WAIT_NONE
    j = max(waits)
    return JobSequence.WAIT_ALL if j >= i else j


def _fence(handle, marks, wait, mark):
    """The fence `_fence_wait` gave (``wait``), and the last job number before it, in
    ``marks[mark]``: what `asymo_pool_run_jobs` does before a job, from Python."""
    marks[mark] = lib.asymo_pool_fence(handle, 0 if wait == JobSequence.WAIT_NONE else
                                       EVERY_JOB if wait == JobSequence.WAIT_ALL
                                       else marks[wait])


def _program(steps, merged, pool, after=None):
    """Every node's step in order, as a list of calls: each run of consecutive nodes (or
    sibling groups, ``merged``) whose steps are only pool jobs on ``pool``
    (`BoundConv2d.calls`) as one `JobSequence`, so the jobs follow each other with no Python
    between them; any other step as it is.

    With ``after`` (`fence_until`: a pool where late copies may run), each node's (or sibling
    group's) first job also fences as `_fence_wait` says and records the last job number before
    it, in one ``uint64_t[]`` of marks (one per node) the fences read; a step that is not only
    pool jobs does both in Python (`_fenced_step`). For whole calls: every mark a fence reads
    is written earlier in the same call."""
    marks = None if after is None else ffi.new("uint64_t[]", max(len(steps), 1))
    program, pending, fences = [], [], []

    def flush():
        if pending:
            program.append(JobSequence(pool, pending, None if marks is None else fences, marks))
        pending.clear()
        fences.clear()

    i = 0
    while i < len(steps):
        group = merged.get(i)
        nodes = range(i, group[0] + 1) if group is not None else (i,)
        step, nxt = (group[1], group[0] + 1) if group is not None else (steps[i], i + 1)
        if step is not None:
            wait = (JobSequence.WAIT_NONE if after is None
                    else _fence_wait(after, nodes, 0))
            calls = getattr(step, "calls", None)
            if calls and all(JobSequence.fits(pool, fn, args) for fn, args in calls):
                pending.extend(calls)
                fences.extend([(wait, i)] + [(JobSequence.WAIT_NONE, -1)] * (len(calls) - 1))
            else:
                flush()
                program.append(step if marks is None else
                               partial(_fenced_step, step, pool._handle, marks, wait, i))
        i = nxt
    flush()
    return program  # (with fences, its sequences and steps hold the marks)


def _fenced_step(step, handle, marks, wait, mark):
    """A step of a fenced `_program` run from Python: its fence and mark, then the step."""
    _fence(handle, marks, wait, mark)
    step()


def _byte_intervals(plan, t):
    """The arena bytes tensor ``t`` occupies, as ``[lo, hi)`` intervals (one per image for a
    channel slice of a concat's output)."""
    if t in plan.slices:
        y, c0, c1 = plan.slices[t]
        off = plan.storage[y][0]
        n, c = plan.shapes[y][:2]
        per = 4 * math.prod(plan.shapes[y][2:])
        return [(off + (i * c + c0) * per, off + (i * c + c1) * per) for i in range(n)]
    off, nbytes = plan.storage[t]
    return [(off, off + nbytes)]


def _late_copy_fences(graph, plan, steps):
    """For each node k, the last earlier node whose backed-up tasks' late copies k must wait
    for: a convolution (the only nodes that back tasks up: `_ConvStep`, `_BlockedConvStep`)
    reading or writing memory k writes (-1: none). A late copy only ever meets memory it
    used, so a node waits for no more than that; the arena's overlap keeps it a few nodes
    back."""
    consts = graph.initializers

    def used(n, names):
        return [iv for t in names if t and t not in consts for iv in _byte_intervals(plan, t)]

    backed = [(j, used(n, list(n.inputs) + list(n.outputs)))
              for j, (n, fn) in enumerate(zip(graph.nodes, steps))
              if isinstance(fn, (_ConvStep, _BlockedConvStep))]
    out = [-1] * len(graph.nodes)
    for k, (n, fn) in enumerate(zip(graph.nodes, steps)):
        if fn is None:
            continue
        writes = used(n, n.outputs)
        for j, ivs in reversed(backed):
            if j < k and any(a < d and c < b for a, b in writes for c, d in ivs):
                out[k] = j
                break
    return out


def _descriptor(n, shapes, consts):
    """The :mod:`asymo.models.spec` step describing node ``n`` (None for light operators)."""
    per = {t: tuple(shapes[t][1:]) for t in list(n.inputs) + list(n.outputs) if t in shapes}
    if n.op == "asymo.Conv":
        w = consts[n.inputs[1]]
        return spec.Conv(name=n.name, in_shape=per[n.inputs[0]], out_shape=per[n.outputs[0]],
                         kernel=tuple(w.shape[2:]), stride=tuple(n.attrs["strides"]),
                         padding=(n.attrs["pads"][0], n.attrs["pads"][1]),
                         dilation=tuple(n.attrs["dilations"]), groups=n.attrs["group"],
                         activation=n.attrs["activation"], bias=bool(n.inputs[2]))
    if n.op == "asymo.Gemm":
        return spec.Linear(name=n.name, in_shape=per[n.inputs[0]], out_shape=per[n.outputs[0]],
                           activation=n.attrs["activation"], bias=bool(n.inputs[2]))
    if n.op in ("MaxPool", "AveragePool") and len(per[n.inputs[0]]) == 3:
        a = n.attrs
        return spec.Pool(kind="max" if n.op == "MaxPool" else "avg",
                         in_shape=per[n.inputs[0]], out_shape=per[n.outputs[0]],
                         kernel=tuple(a["kernel_shape"]), stride=tuple(a["strides"]),
                         padding=(a["pads"][0], a["pads"][1]), ceil_mode=bool(a["ceil_mode"]),
                         count_include_pad=bool(a.get("count_include_pad", 0)))
    if n.op == "GlobalAveragePool" and len(per[n.inputs[0]]) == 3:
        return spec.Pool(kind="avg", in_shape=per[n.inputs[0]], out_shape=per[n.outputs[0]])
    return None


def _segment_kind(nodes, steps):
    if any(n.op == "asymo.Conv" and len(n.inputs) > 3 for n in nodes) or \
            any(n.op == "Add" for n in nodes):
        return "residual"
    if any(n.op == "Concat" for n in nodes):
        return "inception"
    weighted = [s for s in steps if isinstance(s, (spec.Conv, spec.Linear))]
    if not weighted:
        return "other"
    dom = max(weighted, key=lambda s: s.flops)
    if isinstance(dom, spec.Linear):
        return "fc"
    return "dwconv" if dom.depthwise else "conv"


class GraphModel(spec.LayerChain):
    """A graph planned for asymo (build with :func:`asymo.from_onnx` / :func:`asymo.from_torch`).

    Parameters
    ----------
    graph : asymo.models.graph.Graph
        The model as loaded (kept as ``source_graph``; ``graph`` is the rewritten one).
    pool : asymo.Pool, optional
        Default pool for calls (``asymo.get_pool()`` when None).
    name : str, optional
    cluster_choice : {"auto", "all", "fastest"}
        Where calls run on a pool of several clusters: "auto" (default) times all clusters,
        the fastest alone, and each node where it was faster during the first calls, and
        keeps the fastest of the three; "all" / "fastest" fix it for the whole model. Also an
        attribute.
    """

    def __init__(self, graph, *, pool=None, name=None, cluster_choice="auto"):
        self.source_graph = graph
        self.graph, self.rewrites = optimize(graph)
        self.name = name or graph.name
        self.pool = pool
        g = self.graph
        self.input_names = [t.name for t in g.inputs]
        self.output_names = list(g.outputs)
        self.input_shape = tuple(g.inputs[0].shape[1:])
        self._lock = threading.Lock()
        self._plans = {}
        self._free = {}
        self.cluster_choice = cluster_choice
        self._choices = weakref.WeakKeyDictionary()  # pool -> {(batch, limit, period): _Choice}
        # every convolution's weights prepared once (packed GEMM panels, Winograd transforms)
        # and shared by the instances; the graph's arrays are made read-only so none is copied
        self._conv_weights = {}
        self._matvecs = {}  # Gemm weights packed for batch 1 (_matvec)
        self._blocked_weights = {}  # conv weights packed for the blocked layout
        for n in g.nodes:
            if n.op == "asymo.Conv" and n.inputs[1] not in self._conv_weights:
                w = g.initializers[n.inputs[1]]
                w.flags.writeable = False
                self._conv_weights[n.inputs[1]] = PackedConvWeight(w, copy=False)
        shapes = infer_shapes(g, g.batch)
        self.output_shape = tuple(shapes[g.outputs[0]][1:])
        self._segments = g.segments(shapes)
        self.layers = self._make_layers(shapes)

    def _make_layers(self, shapes):
        out = []
        consts = self.graph.initializers
        for i, (a, b, tin, tout) in enumerate(self._segments):
            nodes = self.graph.nodes[a:b + 1]
            steps = tuple(s for s in (_descriptor(n, shapes, consts) for n in nodes)
                          if s is not None)
            tin = tin or self.input_names[0]
            tout = tout or self.output_names[0]
            name = nodes[-1].name if len(nodes) == 1 else f"{nodes[0].name}..{nodes[-1].name}"
            out.append(spec.Layer(index=i, name=name, kind=_segment_kind(nodes, steps),
                                  input_shape=tuple(shapes[tin][1:]),
                                  output_shape=tuple(shapes[tout][1:]), steps=steps))
        return tuple(out)

    def __repr__(self):
        return (f"GraphModel({self.name!r}, input_shape={self.input_shape}, "
                f"nodes={len(self.graph.nodes)}, layers={len(self.layers)})")

    # ---- descriptors (what the planners read) -----------------------------------------
    @property
    def nodes(self):
        return self.graph.nodes

    def summary(self):
        rows = [f"{self.name}: input {self.input_shape}, {len(self.graph.nodes)} nodes "
                f"({len(self.source_graph.nodes)} before planning), {len(self.layers)} "
                f"segments, {self.flops / 1e9:.3f} GFLOP/image"]
        for layer in self.layers:
            rows.append(f"{layer.index:>4} {layer.kind:<10} {str(layer.output_shape):<18} "
                        f"{layer.flops / 1e6:>9.1f} MFLOP  {layer.name}")
        return "\n".join(rows)

    # ---- planning -----------------------------------------------------------------------
    def plan(self, batch=1, *, backups=False):
        """The :class:`ExecutionPlan` for ``batch`` images (made once, then cached);
        ``backups``: the one for pools of several clusters, whose arena has room for late
        copies of backed-up tasks (``ExecutionPlan.overlap``)."""
        key = (int(batch), bool(backups))
        p = self._plans.get(key)
        if p is None:
            with self._lock:
                p = self._plans.get(key)
                if p is None:
                    p = self._plans[key] = _plan(self.graph, key[0],
                                                 BACKUP_OVERLAP_NODES if backups else 0)
        return p

    def _acquire(self, batch, pool):
        """An instance for ``batch`` images whose nodes run on ``pool``."""
        key = (batch, pool.nclusters > 1)
        plan = self.plan(batch, backups=key[1])
        with self._lock:
            free = self._free.setdefault(key, [])
            if free:
                return free.pop()
        return _Instance(self.graph, plan, self._conv_weights, self._matvec,
                         self._blocked_weight)

    def _matvec(self, name):
        """Gemm weights ``name`` packed for batch-1 products, once (on the first instance
        that runs one) and shared by the instances."""
        with self._lock:
            p = self._matvecs.get(name)
            if p is None:
                p = self._matvecs[name] = PackedMatVec(self.graph.initializers[name])
        return p

    def _blocked_weight(self, name, kind):
        """Conv weights ``name`` packed for the blocked kernels of ``kind``, once (shared by
        the instances)."""
        with self._lock:
            p = self._blocked_weights.get(name)
            if p is None:
                p = self._blocked_weights[name] = _blocked.PackedBlockedWeight(
                    kind, self.graph.initializers[name])
        return p

    def _release(self, inst):
        with self._lock:
            self._free.setdefault((inst.batch, inst.overlap > 0), []).append(inst)

    # ---- where calls run: all clusters or the fastest alone --------------------------------
    @property
    def cluster_choice(self):
        """"auto", "all" or "fastest" (see the class parameters)."""
        return self._cluster_choice

    @cluster_choice.setter
    def cluster_choice(self, value):
        if not isinstance(value, str) or value not in CLUSTER_CHOICES:
            raise ValueError(f"cluster_choice must be one of {CLUSTER_CHOICES}, not {value!r}")
        self._cluster_choice = value

    def _target(self, pool, batch):
        """Where this call runs: ``(fastest, on_fastest, trial)`` for `_Instance.run` (None,
        None: the whole pool; a pool, None: its fastest cluster alone) and ``(choice,
        candidate, per-node times wanted)`` when the call is one of "auto"'s timed ones,
        ``(choice, None, False)`` once "auto" has decided (the call is timed for
        `_Choice.observe`), else None."""
        mode = self._cluster_choice
        # a capped pool (threadpoolctl) is run as capped
        if pool.nclusters == 1 or mode == "all" or pool.limit < pool.nworkers:
            return None, None, None
        if mode == "fastest":
            return pool.fastest_cluster_pool(), None, None
        key = (batch, pool.limit, emulated_period())
        with self._lock:
            choice = self._choices.setdefault(pool, {}).setdefault(key, _Choice())
            probe = choice.next_probe() if choice.decided else None
            if probe is not None:  # (step 6: a timed call of the probe)
                where, trial = probe, (choice, probe, False)
                mix = choice.on_fastest if probe == choice.choice else choice.per_node
            elif choice.decided:  # (its calls are still timed: _Choice.observe)
                where, trial = choice.choice, (choice, None, False)
                mix = choice.on_fastest
            else:
                where = choice.next_candidate()
                trial, mix = (choice, where, choice.wants_node_times), choice.per_node
        if where == "all":
            return None, None, trial
        return pool.fastest_cluster_pool(), (mix if where == "per node" else None), trial

    def chosen_clusters(self, pool=None, batch=1):
        """Where calls of ``batch`` images on ``pool`` (None: the model's pool, else the
        default pool) run.

        Returns a dict: ``choice`` ("all", "fastest", "per node", or "measuring" while
        "auto" has too few calls); for "auto", the median seconds of its timed calls on all
        clusters (``all_s``), on the fastest alone (``fastest_s``) and with each node where
        it was faster (``per_node_s``, None when no node gained or all did),
        ``nodes_on_fastest`` once decided; None where not measured; ``rechecks``, how
        often a decided choice was found slower than another candidate and measured again
        (`CHOICE_RECHECK_CALLS`); and ``refreshes``, how often it was measured again on
        schedule (`CHOICE_REFRESH_S`).
        """
        from asymo.runtime.pool import get_pool

        pool = pool if pool is not None else self.pool if self.pool is not None else get_pool()
        mode = self._cluster_choice
        fixed = {"all_s": None, "fastest_s": None, "per_node_s": None,
                 "nodes_on_fastest": None, "rechecks": 0, "refreshes": 0}
        if pool.nclusters == 1 or mode == "all" or pool.limit < pool.nworkers:
            return {"choice": "all", **fixed}
        if mode == "fastest":
            return {"choice": "fastest", **fixed}
        with self._lock:
            choice = self._choices.get(pool, {}).get((batch, pool.limit, emulated_period()))
            return {"choice": "measuring", **fixed} if choice is None else choice.report()

    # ---- running ------------------------------------------------------------------------
    def _as_input(self, x, info):
        torch_in = False
        if not isinstance(x, np.ndarray):
            if torch_of(x) is not None:
                torch_in = True
                if x.dtype.is_floating_point and str(x.dtype) != "torch.float32":
                    raise TypeError(f"{self.name}: input {info.name!r} must be float32, got "
                                    f"{x.dtype} (use x.float())")
                x = x.detach().cpu().numpy()
            else:
                x = np.asarray(x)
        if x.dtype != np.float32:
            raise TypeError(f"{self.name}: input {info.name!r} must be float32, got dtype "
                            f"{x.dtype} (convert with x.astype(np.float32))")
        want = tuple(info.shape[1:])
        unbatched = False
        if x.ndim == len(want) and tuple(x.shape) == want:
            x, unbatched = x[None], True
        if x.ndim != len(want) + 1 or tuple(x.shape[1:]) != want:
            raise ValueError(f"{self.name}: input {info.name!r} must have shape (N, "
                             f"{', '.join(map(str, want))}), got {tuple(x.shape)}")
        if x.shape[0] < 1:
            raise ValueError(f"{self.name}: input {info.name!r} has an empty batch")
        return x, torch_in, unbatched

    def __call__(self, *inputs, pool=None):
        """Run the model: one array (or tensor) per graph input; returns one array per
        output (a tuple when there are several)."""
        g = self.graph
        if len(inputs) != len(g.inputs):
            raise TypeError(f"{self.name}: expected {len(g.inputs)} input(s) "
                            f"({self.input_names}), got {len(inputs)}")
        xs, torch_in, unbatched = [], False, False
        for x, info in zip(inputs, g.inputs):
            x, t, u = self._as_input(x, info)
            xs.append(x)
            torch_in |= t
            unbatched |= u
        batch = xs[0].shape[0]
        if any(x.shape[0] != batch for x in xs):
            raise ValueError(f"{self.name}: inputs have different batch sizes "
                             f"{[x.shape[0] for x in xs]}")
        with hold(pool if pool is not None else self.pool) as held:
            fastest, on_fastest, trial = self._target(held, batch)
            # the arena of the pool the nodes run on: a call on the fastest cluster alone
            # backs no task up, and takes the tight one
            inst = self._acquire(batch, fastest if fastest is not None and on_fastest is None
                                 else held)
            try:
                for x, info in zip(xs, g.inputs):
                    np.copyto(inst.views[info.name], x)
                timed = trial is not None and trial[1] is not None
                # every node timed only where the choice reads node times (step 1): two clock
                # reads a node, which the calls it compares with do not pay
                times = [0.0] * len(g.nodes) if timed and trial[2] else None
                t0 = time.perf_counter()
                inst.run(0, len(g.nodes) - 1, held, fastest=fastest, on_fastest=on_fastest,
                         times=times)
                if trial is not None:
                    dt = time.perf_counter() - t0
                    with self._lock:
                        if timed:
                            trial[0].record(trial[1], times, dt)
                        else:
                            trial[0].observe(dt)
                outs = [inst.views[t].copy() for t in g.outputs]
            finally:
                self._release(inst)
        if unbatched:
            outs = [o[0] for o in outs]
        if torch_in:
            import torch

            outs = [torch.from_numpy(o) for o in outs]
        return outs[0] if len(outs) == 1 else tuple(outs)

    def materialize(self):
        """Plan batch 1 and make one arena instance for the model's pool now (the weights are
        loaded already)."""
        with hold(self.pool) as held:
            self._release(self._acquire(1, held))
        return self

    def run(self, x, *, pool=None):
        """``model(x)`` (the zoo models' name for it)."""
        return self(x, pool=pool)

    def run_layers(self, x, first, last, *, pool=None):
        """Run segments ``first..last`` (inclusive indices into ``layers``) on the activation
        ``x`` of shape ``(N,) + layers[first].input_shape``; returns the activation after
        ``last`` (a pipeline stage)."""
        nl = len(self.layers)
        for nm, v in (("first", first), ("last", last)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 0 <= v < nl:
                raise IndexError(f"{nm}={v!r} is not a layer index of {self.name} "
                                 f"(0..{nl - 1})")
        if first > last:
            raise ValueError(f"first={first} is after last={last}")
        if len(self.graph.inputs) != 1 or len(self.graph.outputs) != 1:
            raise GraphError(f"{self.name}: run_layers needs one graph input and output")
        a, _, tin, _ = self._segments[first]
        _, b, _, tout = self._segments[last]
        tin = tin or self.input_names[0]
        tout = tout or self.output_names[0]
        x = np.ascontiguousarray(x, dtype=np.float32)
        want = self.layers[first].input_shape
        unbatched = x.shape == tuple(want)
        if unbatched:
            x = x[None]
        if tuple(x.shape[1:]) != tuple(want):
            raise ValueError(f"{self.name}: layer {first} takes (N,) + {want}, got {x.shape}")
        batch = x.shape[0]
        with hold(pool if pool is not None else self.pool) as held:
            inst = self._acquire(batch, held)
            try:
                # a segment boundary inside a chain of the blocked layout holds NCHW8c data:
                # the caller's arrays are NCHW both ways (`_Instance.boundary`)
                buf, into = inst.boundary(tin, True, held)
                np.copyto(buf, x)
                if into is not None:
                    into()
                inst.run(a, b, held)
                buf, out_of = inst.boundary(tout, False, held)
                if out_of is not None:
                    out_of()
                y = buf.copy()
            finally:
                self._release(inst)
        return y[0] if unbatched else y

    def node_range(self, first, last):
        """The node indices ``(a, b)`` (inclusive, into ``graph.nodes``) of segments
        ``first..last``."""
        return self._segments[first][0], self._segments[last][1]

"""Fake sysfs trees for the dvfs tests (plain files in a temporary directory).

The Kirin 970 tree follows the HiKey970 board the AsyMo paper measured: cpus 0-3 are the
Cortex-A53 (little) cluster, policy0, 509-1844 MHz; cpus 4-7 the Cortex-A73 (big) cluster,
policy4, 682-2362 MHz. The paper gives no voltages: the OPP voltages below are illustrative
(shaped like a typical A73/A53 table, with the steep rise above 1.86 GHz such tables have),
used only to exercise the readers and the power model.
"""
from __future__ import annotations

import os
import struct

from asymo.hw.topology import Cluster, Topology

KIRIN_LITTLE_KHZ = (509000, 1018000, 1210000, 1402000, 1556000, 1690000, 1844000)
KIRIN_BIG_KHZ = (682000, 1018000, 1210000, 1364000, 1498000, 1652000, 1863000, 2093000,
                 2362000)
KIRIN_LITTLE_UV = (700000, 730000, 760000, 790000, 820000, 860000, 900000)
KIRIN_BIG_UV = (700000, 740000, 770000, 800000, 830000, 860000, 890000, 990000, 1080000)


def write(path, text, mode=0o644):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text if text.endswith("\n") else text + "\n")
    os.chmod(path, mode)


def write_bytes(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def read(path):
    with open(path) as f:
        return f.read().strip()


def make_policy(root, n, cpus, freqs, *, governor="schedutil",
                governors="userspace ondemand schedutil performance powersave",
                driver="cpufreq-dt", listed=True, setspeed=True, cur=None):
    d = os.path.join(root, "devices/system/cpu/cpufreq", f"policy{n}")
    cl = ",".join(str(c) for c in cpus)
    write(os.path.join(d, "related_cpus"), " ".join(str(c) for c in cpus))
    write(os.path.join(d, "affected_cpus"), " ".join(str(c) for c in cpus))
    write(os.path.join(d, "scaling_driver"), driver, 0o444)
    if governor is not None:
        write(os.path.join(d, "scaling_governor"), governor)
    if governors is not None:
        write(os.path.join(d, "scaling_available_governors"), governors, 0o444)
    if listed:
        write(os.path.join(d, "scaling_available_frequencies"),
              " ".join(str(f) for f in freqs) + " ", 0o444)
    write(os.path.join(d, "cpuinfo_min_freq"), str(min(freqs)), 0o444)
    write(os.path.join(d, "cpuinfo_max_freq"), str(max(freqs)), 0o444)
    write(os.path.join(d, "scaling_min_freq"), str(min(freqs)))
    write(os.path.join(d, "scaling_max_freq"), str(max(freqs)))
    write(os.path.join(d, "scaling_cur_freq"), str(cur or max(freqs)), 0o444)
    if setspeed:
        write(os.path.join(d, "scaling_setspeed"),
              "<unsupported>" if governor != "userspace" else str(cur or max(freqs)))
    for c in cpus:
        cdir = os.path.join(root, "devices/system/cpu", f"cpu{c}")
        os.makedirs(cdir, exist_ok=True)
        link = os.path.join(cdir, "cpufreq")
        if not os.path.lexists(link):
            os.symlink(os.path.join("..", "cpufreq", f"policy{n}"), link)
    del cl
    return d


def kirin_topology(with_policy_names=False):
    return Topology(clusters=(
        Cluster("big", (4, 5, 6, 7), 1.0,
                cpufreq_policy="policy4" if with_policy_names else None),
        Cluster("little", (0, 1, 2, 3), 0.58,
                cpufreq_policy="policy0" if with_policy_names else None),
    ), source="override")


def make_kirin970(root, *, opp="debugfs", governor="schedutil", dpc=None):
    """Kirin 970 cpufreq tree; ``opp`` in {"debugfs", "devicetree", None}."""
    root = os.fspath(root)
    little = make_policy(root, 0, (0, 1, 2, 3), KIRIN_LITTLE_KHZ, governor=governor)
    big = make_policy(root, 4, (4, 5, 6, 7), KIRIN_BIG_KHZ, governor=governor)
    tables = {0: (KIRIN_LITTLE_KHZ, KIRIN_LITTLE_UV), 4: (KIRIN_BIG_KHZ, KIRIN_BIG_UV)}
    if opp == "debugfs":
        for first, (khz, uv) in tables.items():
            base = os.path.join(root, "kernel/debug/opp", f"cpu{first}")
            for f, v in zip(khz, uv):
                d = os.path.join(base, f"opp:{f * 1000}")
                write(os.path.join(d, "rate_hz"), str(f * 1000), 0o444)
                write(os.path.join(d, "available"), "Y", 0o444)
                write(os.path.join(d, "supply-0", "u_volt_target"), str(v), 0o444)
            for c in range(first + 1, first + 4):
                os.symlink(f"cpu{first}", os.path.join(root, "kernel/debug/opp", f"cpu{c}"))
    elif opp == "devicetree":
        dt = os.path.join(root, "firmware/devicetree/base")
        for ph, (first, (khz, uv)) in enumerate(tables.items(), start=0x10):
            tdir = os.path.join(dt, f"opp-table-{first}")
            write_bytes(os.path.join(tdir, "phandle"), struct.pack(">I", ph))
            write_bytes(os.path.join(tdir, "compatible"), b"operating-points-v2\0")
            for f, v in zip(khz, uv):
                od = os.path.join(tdir, f"opp-{f * 1000}")
                write_bytes(os.path.join(od, "opp-hz"), struct.pack(">Q", f * 1000))
                write_bytes(os.path.join(od, "opp-microvolt"), struct.pack(">I", v))
            # a disabled OPP must be ignored
            od = os.path.join(tdir, "opp-9999000000")
            write_bytes(os.path.join(od, "opp-hz"), struct.pack(">Q", 9_999_000_000))
            write_bytes(os.path.join(od, "opp-microvolt"), struct.pack(">I", 1_500_000))
            write_bytes(os.path.join(od, "status"), b"disabled\0")
            for c in range(first, first + 4):
                node = os.path.join(dt, "cpus", f"cpu@{c}")
                write_bytes(os.path.join(node, "device_type"), b"cpu\0")
                write_bytes(os.path.join(node, "operating-points-v2"), struct.pack(">I", ph))
                if dpc is not None:
                    write_bytes(os.path.join(node, "dynamic-power-coefficient"),
                                struct.pack(">I", dpc[first]))
                link = os.path.join(root, "devices/system/cpu", f"cpu{c}", "of_node")
                os.symlink(os.path.relpath(node, os.path.dirname(link)), link)
    return {"little": little, "big": big}


def make_intel_pstate(root, ncpus=4, lo=800000, hi=4200000):
    """intel_pstate in active mode: one policy per cpu, governors performance/powersave, no
    userspace governor, no frequency list, no scaling_setspeed."""
    root = os.fspath(root)
    out = {}
    for c in range(ncpus):
        out[c] = make_policy(root, c, (c,), (lo, hi), governor="powersave",
                             governors="performance powersave", driver="intel_pstate",
                             listed=False, setspeed=False, cur=2000000)
    return out


def make_rapl(root, zones=((0, "package-0", 1000, 262143328850),)):
    root = os.fspath(root)
    for idx, name, energy, rng in zones:
        d = os.path.join(root, "class/powercap", f"intel-rapl:{idx}")
        write(os.path.join(d, "name"), name, 0o444)
        write(os.path.join(d, "energy_uj"), str(energy), 0o400)
        write(os.path.join(d, "max_energy_range_uj"), str(rng), 0o444)
        sub = os.path.join(root, "class/powercap", f"intel-rapl:{idx}:0")
        write(os.path.join(sub, "name"), "core", 0o444)
        write(os.path.join(sub, "energy_uj"), "5", 0o400)
        write(os.path.join(sub, "max_energy_range_uj"), str(rng), 0o444)
    return os.path.join(root, "class/powercap")


def kirin_curves(*, latency_drop=True, measured=True):
    """Energy curves shaped like the paper's Kirin 970 measurements (Fig. 9 and 10).

    compute: time ~ 1/f (8.8 GFLOP/s big, 5.1 little at the top frequency, Table 3);
    memory: DRAM-bound time that barely moves with f, except that the random-access latency
    of the big cluster drops between 1.86 and 2.09 GHz (Fig. 10) when ``latency_drop``;
    power: P_static + n C V^2 f from the illustrative OPP voltages above (memory-bound cores
    switch half as much), a 1.5 W board static power, 4 W / 1.2 W of dynamic power for the
    whole big / little cluster at its top frequency.
    """
    from asymo.dvfs.curves import BenchCurve, ClusterCurves

    def one(name, cpus, khz, uv, flops, bw, dyn_max, drop):
        volts = [u / 1e6 for u in uv]
        fmax = khz[-1]
        c = dyn_max / (4 * volts[-1] ** 2 * fmax * 1e3)
        pc = [1.5 + 4 * c * v * v * f * 1e3 for f, v in zip(khz, volts)]
        pm = [1.5 + 0.5 * 4 * c * v * v * f * 1e3 for f, v in zip(khz, volts)]
        tc = [1.0 / (flops * f / fmax) for f in khz]
        lat = [0.55 if drop and f > 1863000 else 1.0 for f in khz]
        tm = [(a + 0.3 * fmax / f) / bw for a, f in zip(lat, khz)]
        src = "callable:fixture" if measured else "estimate:fixture"
        return ClusterCurves(name, cpus,
                             BenchCurve("compute", khz, tuple(tc), tuple(pc), "flop", None,
                                        measured, measured, src),
                             BenchCurve("memory", khz, tuple(tm), tuple(pm), "byte", 1.999,
                                        measured, measured, src))

    return {"big": one("big", (4, 5, 6, 7), KIRIN_BIG_KHZ, KIRIN_BIG_UV, 8.8e9, 4.6e9, 4.0,
                       latency_drop),
            "little": one("little", (0, 1, 2, 3), KIRIN_LITTLE_KHZ, KIRIN_LITTLE_UV, 5.1e9,
                          0.86e9, 1.2, False)}


# MM shapes of convolutions (ResNet / VGG style, per image) and MV shapes of FC / RNN layers
CONV_SHAPES = [(3136, 576, 64), (784, 1152, 128), (196, 2304, 256), (49, 4608, 512)]
FC_SHAPES = [(1, 4096, 4096), (1, 1024, 4096), (1, 4096, 1000)]


class FakeModel:
    """Anything with ``matmul_shapes()`` is a model for asymo.frequency_plan."""

    def __init__(self, name, shapes):
        self.name = name
        self._shapes = list(shapes)

    def matmul_shapes(self):
        return list(self._shapes)

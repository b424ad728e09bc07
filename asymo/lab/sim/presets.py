"""Built-in descriptions of heterogeneous CPUs this machine cannot be, for the simulator.

Each preset is a :class:`~asymo.hw.topology.Topology` (clusters fastest first, ``source="preset"``)
plus a per-core FP32 GEMM rate, so simulated throughput has a unit. Where every number comes
from is recorded in :attr:`Preset.sources`; the short version:

* ``capacity`` (speed relative to the fastest cluster, what the pool's default split uses):
  for Kirin 970 and Snapdragon 845 the ratio of the per-core matrix-multiply rates AsyMo
  measured (paper 003, Table 3: A73 8.8 / A53 5.1 GFLOP/s; A75 13.0 / A55 5.4 GFLOP/s, i.e.
  the "1.73x" MM capability ratio the paper quotes for Kirin 970). For RK3588 and Pixel 6 the
  Linux scheduler's own figure, ``capacity-dmips-mhz`` x max frequency from the mainline
  device trees (``rk3588-base.dtsi``: A55 530, A76 1024; ``gs101.dtsi``: A55 250, A76 620,
  X1 1024). For the Intel 6P+8E part (Core i7-12700H) the FP32 FMA throughput per cycle x
  max turbo frequency: Golden Cove 2x256-bit FMA (32 FLOP/cycle) at 4.7 GHz, Gracemont
  2x128-bit FMA (16 FLOP/cycle) at 3.5 GHz.
* ``gflops_per_core``: measured MM rates (AsyMo Table 3) for Kirin 970 / Snapdragon 845;
  elsewhere a peak estimate, FMA lanes x 2 x max frequency for the fastest cluster and scaled
  by capacity for the others. These only set the unit of simulated throughput (GFLOP/s);
  speedups do not depend on them.
* caches: AsyMo Table 3 (Kirin 970, Snapdragon 845), the ``*-cache-size`` properties of the
  mainline device trees (RK3588), the project's sysfs fixtures (Pixel 6,
  ``tests/fixtures/make_sysfs.py``) and Intel's product specifications (i7-12700H).

CPU numbers follow Linux on the real device (little cores first on Arm). On the Intel part one
worker per physical P-core is listed (the first SMT thread): a GEMM gains nothing from the
sibling thread.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from asymo.hw.topology import Cache, Cluster, Topology

__all__ = ["Preset", "PRESETS", "get_preset", "preset_names"]

KiB = 1024
MiB = 1024 * 1024


@dataclass(frozen=True)
class Preset:
    """A simulated CPU: its topology, a per-cluster FP32 GEMM rate and where both came from."""

    name: str
    description: str
    topology: Topology
    gflops_per_core: tuple   # per cluster, fastest first
    sources: dict = field(default_factory=dict)

    def to_dict(self):
        return {"name": self.name, "description": self.description,
                "topology": self.topology.to_dict(),
                "gflops_per_core": list(self.gflops_per_core), "sources": dict(self.sources)}


def _cluster(name, cpus, capacity, l1d, l2, l2_shared, l3=None, *, fmax_mhz, fmin_mhz=None):
    cpus = tuple(cpus)
    l2_cpus = cpus if l2_shared else (cpus[0],)
    return Cluster(
        name=name, cpus=cpus, capacity=capacity,
        l1d=Cache(level=1, size=l1d, shared_cpus=(cpus[0],)),
        l2=Cache(level=2, size=l2, shared_cpus=l2_cpus),
        l3=l3,
        min_freq_khz=None if fmin_mhz is None else fmin_mhz * 1000,
        max_freq_khz=fmax_mhz * 1000,
    )


def _dmips(dmips_mhz, fmax_mhz, ref_dmips_mhz, ref_fmax_mhz):
    """Linux's cpu_capacity rule: capacity-dmips-mhz x max frequency, relative to the top."""
    return (dmips_mhz * fmax_mhz) / (ref_dmips_mhz * ref_fmax_mhz)


def _kirin970():
    cap = 5.1 / 8.8
    topo = Topology(source="preset", clusters=(
        _cluster("a73", range(4, 8), 1.0, 64 * KiB, 2 * MiB, True, fmin_mhz=682,
                 fmax_mhz=2362),
        _cluster("a53", range(0, 4), cap, 32 * KiB, 1 * MiB, True, fmin_mhz=509,
                 fmax_mhz=1844),
    ))
    return Preset(
        name="kirin970",
        description="HiSilicon Kirin 970 (HiKey970): 4x Cortex-A73 @2.36 GHz + "
                    "4x Cortex-A53 @1.84 GHz",
        topology=topo, gflops_per_core=(8.8, 5.1),
        sources={"capacity": "AsyMo (paper 003) Table 3 measured MM peak: A73 8.8, A53 5.1 "
                             "GFLOP/s per core (ratio 0.58, the paper's 1.73x); Linux's "
                             "cpu_capacity (capacity-dmips-mhz 592/1024 x 1.84/2.36 GHz) "
                             "would say 0.45",
                 "gflops_per_core": "AsyMo Table 3 (measured with the authors' MM)",
                 "caches": "AsyMo Table 3: A73 64 KB L1d, 2 MB shared L2; A53 32 KB L1d, "
                           "1 MB shared L2",
                 "frequencies": "AsyMo Table 3: 0.68-2.36 GHz / 0.51-1.84 GHz"})


def _sd845():
    cap = 5.4 / 13.0
    l3 = Cache(level=3, size=2 * MiB, shared_cpus=tuple(range(8)))
    topo = Topology(source="preset", clusters=(
        _cluster("gold", range(4, 8), 1.0, 64 * KiB, 256 * KiB, False, l3, fmin_mhz=826,
                 fmax_mhz=2803),
        _cluster("silver", range(0, 4), cap, 32 * KiB, 128 * KiB, False, l3, fmin_mhz=300,
                 fmax_mhz=1766),
    ))
    return Preset(
        name="sd845",
        description="Qualcomm Snapdragon 845: 4x Kryo 385 Gold (Cortex-A75) @2.8 GHz + "
                    "4x Kryo 385 Silver (Cortex-A55) @1.77 GHz",
        topology=topo, gflops_per_core=(13.0, 5.4),
        sources={"capacity": "AsyMo Table 3 measured MM peak: A75 13.0, A55 5.4 GFLOP/s per "
                             "core (ratio 0.42; the paper: 'about a third')",
                 "gflops_per_core": "AsyMo Table 3",
                 "caches": "AsyMo Table 3: 64/32 KB L1d, 256/128 KB private L2, 2 MB shared L3",
                 "frequencies": "AsyMo Table 3: 0.83-2.80 GHz / 0.30-1.77 GHz"})


def _rk3588():
    cap = _dmips(530, 1800, 1024, 2400)
    l3 = Cache(level=3, size=3 * MiB, shared_cpus=tuple(range(8)))
    big_gflops = 4 * 2 * 2 * 2.4   # 2x128-bit FMA pipes: 4 lanes x 2 FLOP x 2 pipes x GHz
    topo = Topology(source="preset", clusters=(
        _cluster("a76", range(4, 8), 1.0, 64 * KiB, 512 * KiB, False, l3, fmin_mhz=408,
                 fmax_mhz=2400),
        _cluster("a55", range(0, 4), cap, 32 * KiB, 128 * KiB, False, l3, fmin_mhz=408,
                 fmax_mhz=1800),
    ))
    return Preset(
        name="rk3588",
        description="Rockchip RK3588: 4x Cortex-A76 @2.4 GHz + 4x Cortex-A55 @1.8 GHz",
        topology=topo, gflops_per_core=(big_gflops, big_gflops * cap),
        sources={"capacity": "mainline rk3588-base.dtsi capacity-dmips-mhz (A55 530, "
                             "A76 1024) x max frequency (1.8 / 2.4 GHz) = 0.39",
                 "gflops_per_core": "estimate: A76 peak 16 FP32 FLOP/cycle x 2.4 GHz; A55 "
                                    "scaled by capacity",
                 "caches": "rk3588-base.dtsi: 64/32 KB L1d, 512/128 KB private L2, "
                           "3 MB shared L3"})


def _pixel6():
    fx1, fa76, fa55 = 2802, 2253, 1803
    cap_mid = _dmips(620, fa76, 1024, fx1)
    cap_little = _dmips(250, fa55, 1024, fx1)
    l3 = Cache(level=3, size=4 * MiB, shared_cpus=tuple(range(8)))
    big_gflops = 4 * 2 * 4 * fx1 / 1000   # X1: 4x128-bit FMA pipes
    topo = Topology(source="preset", clusters=(
        _cluster("x1", (6, 7), 1.0, 64 * KiB, 512 * KiB, False, l3, fmin_mhz=500,
                 fmax_mhz=fx1),
        _cluster("a76", (4, 5), cap_mid, 64 * KiB, 256 * KiB, False, l3, fmin_mhz=400,
                 fmax_mhz=fa76),
        _cluster("a55", range(0, 4), cap_little, 32 * KiB, 64 * KiB, False, l3,
                 fmin_mhz=300, fmax_mhz=fa55),
    ))
    return Preset(
        name="pixel6",
        description="Google Tensor (Pixel 6): 2x Cortex-X1 @2.8 GHz + 2x Cortex-A76 "
                    "@2.25 GHz + 4x Cortex-A55 @1.8 GHz",
        topology=topo,
        gflops_per_core=(big_gflops, big_gflops * cap_mid, big_gflops * cap_little),
        sources={"capacity": "mainline gs101.dtsi capacity-dmips-mhz (A55 250, A76 620, "
                             "X1 1024) x max frequency (1.80 / 2.25 / 2.80 GHz)",
                 "gflops_per_core": "estimate: X1 peak 32 FP32 FLOP/cycle x 2.8 GHz; others "
                                    "scaled by capacity",
                 "caches": "as the project's Pixel 6 sysfs fixture (tests/fixtures/"
                           "make_sysfs.py): X1 512 KB, A76 256 KB, A55 64 KB private L2; "
                           "4 MB shared L3"})


def _intel_6p8e():
    p_flops, e_flops = 32 * 4.7, 16 * 3.5
    cap = e_flops / p_flops
    l3 = Cache(level=3, size=24 * MiB, shared_cpus=tuple(range(20)))
    topo = Topology(source="preset", clusters=(
        _cluster("pcore", (0, 2, 4, 6, 8, 10), 1.0, 48 * KiB, 1280 * KiB, False, l3,
                 fmin_mhz=400, fmax_mhz=4700),
        # E-cores share one 2 MB L2 per module of four; the preset keeps one cache object
        # per cluster, so the L2 is listed as shared by the first module.
        Cluster(name="ecore", cpus=tuple(range(12, 20)), capacity=cap,
                l1d=Cache(level=1, size=32 * KiB, shared_cpus=(12,)),
                l2=Cache(level=2, size=2 * MiB, shared_cpus=tuple(range(12, 16))),
                l3=l3, min_freq_khz=400_000, max_freq_khz=3_500_000),
    ))
    return Preset(
        name="intel-6p8e",
        description="Intel Core i7-12700H class: 6 Golden Cove P-cores @4.7 GHz + "
                    "8 Gracemont E-cores @3.5 GHz (one worker per physical core)",
        topology=topo, gflops_per_core=(p_flops, e_flops),
        sources={"capacity": "FP32 FMA peak: P-core 2x256-bit FMA = 32 FLOP/cycle x 4.7 GHz, "
                             "E-core 2x128-bit FMA = 16 FLOP/cycle x 3.5 GHz (ratio 0.37); "
                             "all-core turbo is lower on the real part",
                 "gflops_per_core": "estimate: the peaks above",
                 "caches": "Intel i7-12700H specifications: P 48 KB L1d + 1.25 MB L2, "
                           "E 32 KB L1d + 2 MB L2 per 4-core module, 24 MB L3"})


_BUILDERS = {
    "kirin970": _kirin970,
    "sd845": _sd845,
    "rk3588": _rk3588,
    "pixel6": _pixel6,
    "intel-6p8e": _intel_6p8e,
}
_ALIASES = {"kirin-970": "kirin970", "snapdragon845": "sd845", "snapdragon-845": "sd845",
            "pixel-6": "pixel6", "tensor": "pixel6", "i7-12700h": "intel-6p8e",
            "intel": "intel-6p8e"}

PRESETS = {name: build() for name, build in _BUILDERS.items()}


def preset_names():
    """Names of the built-in presets."""
    return list(PRESETS)


def get_preset(name):
    """The preset called ``name`` (case-insensitive; a few aliases accepted)."""
    if isinstance(name, Preset):
        return name
    if not isinstance(name, str):
        raise TypeError(f"preset name must be a string, not {type(name).__name__}")
    key = name.strip().lower()
    key = _ALIASES.get(key, key)
    try:
        return PRESETS[key]
    except KeyError:
        raise ValueError(f"unknown CPU preset {name!r}; choose one of "
                         f"{', '.join(PRESETS)}") from None

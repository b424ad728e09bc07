"""calibrate_energy end to end on a fake cpufreq tree, with the real micro-benchmarks."""
import json
import os

import pytest

import asymo
from asymo.dvfs import (CallableMeter, CpuFreq,
                        data_reuse)
from asymo.calibrate.energy import (CALIBRATE_ENERGY_HELP, _pick_freqs, calibrate_energy,
                                    format_calibration)
from asymo.dvfs.curves import curves_from_section
from asymo.profile import Profile, load_profile
from asymo.hw.topology import Cluster, Topology
from asymo.calibrate.energy_kernels import memory_matrix_shape

from _dvfs_fakes import (CONV_SHAPES, KIRIN_BIG_KHZ, KIRIN_LITTLE_KHZ, make_policy, read)

usable = sorted(os.sched_getaffinity(0))


def board_power(root):
    """A fake external meter: 1 W plus 1 W per GHz set on each userspace-governed policy, so
    the stored curves show whether each point ran at the frequency it claims."""
    def watts():
        w = 1.0
        for n in (0, 1):
            d = os.path.join(root, "devices/system/cpu/cpufreq", f"policy{n}")
            if os.path.exists(d) and read(f"{d}/scaling_governor") == "userspace":
                w += int(read(f"{d}/scaling_setspeed")) / 1e6
        return w
    return watts


def test_calibrate_energy_measures_stores_and_restores(tmp_path):
    cpu_a, cpu_b = usable[0], usable[-1]
    if cpu_a == cpu_b:
        pytest.skip("needs two usable cpus")
    root = str(tmp_path / "sys")
    big = make_policy(root, 0, (cpu_a,), KIRIN_BIG_KHZ)
    little = make_policy(root, 1, (cpu_b,), KIRIN_LITTLE_KHZ)
    topo = Topology(clusters=(Cluster("big", (cpu_a,), 1.0), Cluster("little", (cpu_b,), 0.5)))
    cf = CpuFreq(topo, sysfs_root=root)
    meter = CallableMeter(board_power(root), kind="power", interval_s=0.002, name="fake-board")
    prof = Profile.new(topo, path=str(tmp_path / "profile.json"))
    res = calibrate_energy(topo, cf, meter, progress=False, profile=prof,
                           frequencies={"big": [682000, 2362000], "little": [509000, 1844000]},
                           duration_s=0.03, repeats=1, settle_s=0, memory_bytes=1 << 20)
    assert res["status"] == "ok" and res["measured_energy"]
    assert res["meter"] == {"source": "callable:fake-board", "measured": True}
    # everything put back
    assert not cf.changed
    assert read(f"{big}/scaling_governor") == read(f"{little}/scaling_governor") == "schedutil"
    # stored in the profile, on disk, under "energy"
    assert res["profile_path"] == str(tmp_path / "profile.json")
    on_disk = load_profile(res["profile_path"], topo)
    curves = curves_from_section(on_disk.sections["energy"], topo)
    b = curves["big"]
    assert b.freqs_khz == (682000, 2362000) and b.source == "measured"
    # power was read while each frequency was set (1 W + f in GHz, only this cluster's policy)
    assert b.compute.power_w == pytest.approx((1.682, 3.362), rel=1e-6)
    assert curves["little"].memory.power_w == pytest.approx((1.509, 2.844), rel=1e-6)
    m, k = memory_matrix_shape(1 << 20)
    assert b.memory.reuse == pytest.approx(data_reuse(m, k, 1)) and b.memory.reuse < 2
    assert all(t > 0 for t in b.compute.time_per_unit_s + b.memory.time_per_unit_s)
    assert 1e8 < b.peak_flops < 1e13 and 1e7 < b.peak_bytes < 1e12
    text = format_calibration(res)
    assert "measured" in text and "big: 2 frequencies 682-2362 MHz" in text
    # the plan now uses these measured curves
    plan = asymo.frequency_plan(CONV_SHAPES, cpufreq=cf, profile=on_disk)
    assert not plan.report.estimated
    json.dumps(res)


def test_calibrate_energy_without_cpufreq_says_so(tmp_path):
    topo = Topology(clusters=(Cluster("c0", (usable[0],), 1.0),))
    prof = Profile.new(topo, path=str(tmp_path / "p.json"))
    res = calibrate_energy(topo, CpuFreq(topo, sysfs_root=str(tmp_path)), progress=False,
                           profile=prof)
    assert res["status"] == "unavailable" and res["clusters"]["c0"]["skipped"]
    assert any("cannot be set" in m for m in res["messages"])
    assert any("ESTIMATED" in m for m in res["messages"])
    assert not os.path.exists(tmp_path / "p.json") and "energy" not in prof.sections
    assert "ESTIMATED" in CALIBRATE_ENERGY_HELP


def test_frequency_points_for_listed_and_continuous_drivers():
    assert _pick_freqs(KIRIN_BIG_KHZ, True, 12) == list(KIRIN_BIG_KHZ)
    five = _pick_freqs(KIRIN_BIG_KHZ, True, 5)
    assert len(five) == 5 and five[0] == 682000 and five[-1] == 2362000
    cont = _pick_freqs((800000, 4200000), False, 6)
    assert cont[0] == 800000 and cont[-1] == 4200000 and len(cont) == 6
    assert all(f % 100000 == 0 for f in cont)

"""Energy meters on fake sysfs / procfs trees, and the power model (labelled estimate)."""
import json
import os
import time

import pytest

from asymo.dvfs import (CallableMeter, CsvTraceMeter, HwmonMeter, MeterUnavailable,
                        PowerModel, PowerModelMeter, RaplMeter, detect_meter, integrate_power)
from asymo.dvfs.power_model import (DEFAULT_V_MAX, DEFAULT_V_MIN, read_opp_debugfs,
                                    read_opp_devicetree)
from asymo.hw.topology import Cluster, Topology

from _dvfs_fakes import (KIRIN_BIG_KHZ, KIRIN_BIG_UV, KIRIN_LITTLE_KHZ, KIRIN_LITTLE_UV,
                         kirin_topology, make_kirin970, make_rapl, write)


def set_energy(root, idx, uj):
    write(os.path.join(root, "class/powercap", f"intel-rapl:{idx}", "energy_uj"), str(uj), 0o400)


# ------------------------------------------------------------------------------------ RAPL

def test_rapl_difference_and_subzones_ignored(tmp_path):
    make_rapl(tmp_path, zones=((0, "package-0", 1000, 10**9), (1, "package-1", 50, 10**9)))
    m = RaplMeter(str(tmp_path))
    assert m.measured and m.source == "rapl:package-0,package-1"
    tok = m.start()
    set_energy(tmp_path, 0, 1000 + 2_500_000)
    set_energy(tmp_path, 1, 50 + 500_000)
    r = m.stop(tok)
    assert r.energy_j == pytest.approx(3.0, abs=1e-12)
    assert r.measured and r.source.startswith("rapl:")
    only = RaplMeter(str(tmp_path), zones=["package-1"])
    assert only.source == "rapl:package-1"


def test_rapl_wraps_at_max_energy_range(tmp_path):
    rng = 262_143_328_850
    make_rapl(tmp_path, zones=((0, "package-0", rng - 1000, rng),))
    m = RaplMeter(str(tmp_path))
    tok = m.start()
    set_energy(tmp_path, 0, 500)  # wrapped once: 1000 up to the range, 500 after it
    assert m.stop(tok).energy_j == pytest.approx(1500e-6, abs=1e-12)
    # two wraps are both unfolded as long as the counter is read in between
    tok = m.start()
    set_energy(tmp_path, 0, rng - 10)
    m.read_uj()
    set_energy(tmp_path, 0, 20)
    assert m.stop(tok).energy_j == pytest.approx((rng - 10 - 500 + 30) * 1e-6, rel=1e-12)


def test_rapl_absent(tmp_path):
    with pytest.raises(MeterUnavailable, match="no RAPL"):
        RaplMeter(str(tmp_path))


# ----------------------------------------------------------------------------------- hwmon

def test_hwmon_energy_prefers_socket_counters(tmp_path):
    d = tmp_path / "class/hwmon/hwmon0"
    write(str(d / "name"), "amd_energy")
    write(str(d / "energy1_input"), "1000000")
    write(str(d / "energy1_label"), "Ecore000")
    write(str(d / "energy2_input"), "7000000")
    write(str(d / "energy2_label"), "Esocket0")
    m = HwmonMeter(str(tmp_path))
    assert m.kind == "energy" and m.source == "hwmon:hwmon0/energy2_input"
    tok = m.start()
    write(str(d / "energy1_input"), "9000000")
    write(str(d / "energy2_input"), "9500000")
    r = m.stop(tok)
    assert r.energy_j == pytest.approx(2.5) and r.measured
    tok = m.start()
    write(str(d / "energy2_input"), "100")
    with pytest.raises(MeterUnavailable, match="backwards"):
        m.stop(tok)


def test_hwmon_power_is_integrated(tmp_path):
    d = tmp_path / "class/hwmon/hwmon3"
    write(str(d / "power1_input"), "2500000")  # 2.5 W
    m = HwmonMeter(str(tmp_path), interval_s=0.005)
    assert m.kind == "power"
    with m.measure() as meas:
        time.sleep(0.05)
    r = meas.reading
    assert r.detail["samples"] >= 3
    assert r.energy_j == pytest.approx(2.5 * r.elapsed_s, rel=1e-9)


def test_hwmon_absent(tmp_path):
    with pytest.raises(MeterUnavailable):
        HwmonMeter(str(tmp_path))


# -------------------------------------------------------------------------------- callable

def test_callable_energy_and_power():
    counter = iter([10.0, 13.25])
    m = CallableMeter(lambda: next(counter), kind="energy", name="board")
    r = m.stop(m.start())
    assert r.energy_j == 3.25 and r.measured and r.source == "callable:board"
    est = CallableMeter(lambda: 4.0, kind="power", interval_s=0.005, measured=False)
    with est.measure() as meas:
        time.sleep(0.03)
    assert meas.reading.energy_j == pytest.approx(4.0 * meas.reading.elapsed_s, rel=1e-9)
    assert not meas.reading.measured and meas.reading.source.startswith("estimate:")
    with pytest.raises(ValueError):
        CallableMeter(lambda: 1.0, kind="volts")


def test_integrate_power_matches_analytic():
    times = [0.5 * i for i in range(7)]  # 0 .. 3 s
    watts = [3.0 * t for t in times]
    # p = 3t: integral over [0.7, 2.6] = 1.5 * (2.6^2 - 0.7^2)
    assert integrate_power(times, watts, 0.7, 2.6) == pytest.approx(1.5 * (2.6**2 - 0.7**2))
    with pytest.raises(ValueError, match="cover"):
        integrate_power(times, watts, 0.0, 3.5)


# ------------------------------------------------------------------------------- CSV trace

def test_csv_trace_power_and_energy_columns(tmp_path):
    p = tmp_path / "trace.csv"
    rows = ["# Monsoon export", "timestamp,power_mw"]
    rows += [f"{100 + 0.1 * i:.1f},{2000 + 100 * i}" for i in range(21)]  # 2 W + 1 W/s
    p.write_text("\n".join(rows) + "\n")
    m = CsvTraceMeter(p)
    # P(t) = 2 + (t - 100) W on [100.25, 101.25]
    assert m.energy_between(100.25, 101.25) == pytest.approx(2.0 + (1.25**2 - 0.25**2) / 2)
    q = tmp_path / "energy.csv"
    q.write_text("time,energy_j\n0,5\n1,6\n2,8\n")
    assert CsvTraceMeter(q).energy_between(0.5, 1.5) == pytest.approx(7.0 - 5.5)


def test_csv_trace_live_measurement_monotonic_clock(tmp_path):
    now = time.monotonic()
    p = tmp_path / "live.csv"
    p.write_text("timestamp,power_w\n"
                 + "".join(f"{now - 1 + 0.01 * i},3.0\n" for i in range(400)))
    m = CsvTraceMeter(p, clock="monotonic", wait_s=0.2)
    with m.measure() as meas:
        time.sleep(0.02)
    r = meas.reading
    assert r.measured and r.source == f"csv:{p}"
    assert r.energy_j == pytest.approx(3.0 * (r.detail["t1"] - r.detail["t0"]), rel=1e-9)


def test_csv_trace_errors(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("timestamp,power_w\n1,2\nx,3\n")
    with pytest.raises(ValueError, match="line 3"):
        CsvTraceMeter(bad).read_trace()
    back = tmp_path / "back.csv"
    back.write_text("timestamp,power_w\n2,2\n1,3\n")
    with pytest.raises(ValueError, match="backwards"):
        CsvTraceMeter(back).read_trace()
    nocol = tmp_path / "nocol.csv"
    nocol.write_text("timestamp,volts\n1,2\n")
    with pytest.raises(ValueError, match="no power or energy column"):
        CsvTraceMeter(nocol).read_trace()
    short = tmp_path / "short.csv"
    short.write_text("timestamp,power_w\n0,1\n1,1\n")  # realtime clock: far in the past
    m = CsvTraceMeter(short, wait_s=0.05)
    with pytest.raises(MeterUnavailable, match="covers"):
        m.stop(m.start())
    with pytest.raises(MeterUnavailable):
        CsvTraceMeter(tmp_path / "missing.csv")


# ---------------------------------------------------------------------------- power model

def test_opp_tables_from_debugfs_and_devicetree(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    make_kirin970(a, opp="debugfs")
    make_kirin970(b, opp="devicetree", dpc={0: 140, 4: 530})
    want_big = tuple((f, v / 1e6) for f, v in zip(KIRIN_BIG_KHZ, KIRIN_BIG_UV))
    want_little = tuple((f, v / 1e6) for f, v in zip(KIRIN_LITTLE_KHZ, KIRIN_LITTLE_UV))
    assert read_opp_debugfs(str(a), 5) == want_big
    assert read_opp_debugfs(str(a), 0) == want_little
    pts, dpc, _ = read_opp_devicetree(str(b), 6)
    assert pts == want_big and dpc == 530  # the disabled 9.999 GHz OPP is skipped
    pm = PowerModel.from_system(kirin_topology(), str(b))
    assert pm["big"].voltage_source.startswith("devicetree:")
    assert pm["big"].c_eff == pytest.approx(530e-12)
    pm2 = PowerModel.from_system(kirin_topology(), str(a))
    assert pm2["little"].voltage_source.startswith("debugfs:")
    assert pm2["little"].capacitance_source.startswith("default:")


def test_power_model_formula_and_sources(tmp_path):
    make_kirin970(tmp_path, opp=None)
    topo = kirin_topology()
    user = {"big": {682000: 0.7, 2362000: 1.1}}
    from asymo.dvfs import CpuFreq
    pm = PowerModel.from_system(topo, str(tmp_path), opp_tables=user,
                                cpufreq=CpuFreq(topo, str(tmp_path)))
    big, little = pm["big"], pm["little"]
    assert big.voltage_source == "user-table"
    assert little.voltage_source.startswith("default:")
    assert little.opp == ((509000, DEFAULT_V_MIN), (1844000, DEFAULT_V_MAX))
    assert big.voltage(1522000) == pytest.approx(0.9)  # linear between OPPs
    f = 1863000
    v = big.voltage(f)
    assert big.power_w(f) == pytest.approx(big.p_static_w + 4 * big.c_eff * v * v * f * 1e3)
    assert big.power_w(f, busy_cores=0) == big.p_static_w
    assert not pm.measured and pm.source.startswith("estimate:")
    json.dumps(pm.to_dict())
    with pytest.raises(ValueError, match="volts"):
        PowerModel.from_system(topo, str(tmp_path), opp_tables={"big": {682000: 700}})


def test_power_model_meter_is_an_estimate_from_proc_stat(tmp_path):
    make_kirin970(tmp_path, opp="debugfs")
    topo = kirin_topology()
    pm = PowerModel.from_system(topo, str(tmp_path))
    proc = tmp_path / "proc"
    proc.mkdir()
    hz = os.sysconf("SC_CLK_TCK")

    def stat(busy):
        lines = ["cpu  0 0 0 0 0 0 0 0"]
        for cpu in range(8):
            lines.append(f"cpu{cpu} {busy.get(cpu, 0)} 0 0 1000 7 0 0 0")
        (proc / "stat").write_text("\n".join(lines) + "\n")

    stat({})
    m = PowerModelMeter(pm, topo, procfs_root=str(proc))
    tok = m.start()
    stat({4: hz // 100, 5: hz // 100})  # cpu4 and cpu5 busy 10 ms each (user time)
    time.sleep(0.03)  # busy time is capped at elapsed time x cores (jiffy rounding)
    r = m.stop(tok)
    assert not r.measured and r.source.startswith("estimate:power-model")
    big, little = pm["big"], pm["little"]
    want = (big.p_static_w + little.p_static_w) * r.elapsed_s \
        + 2 * (hz // 100) / hz * big.core_dynamic_w(2362000)
    assert r.energy_j == pytest.approx(want, rel=1e-9)
    assert r.label == "estimated" and "estimated" in str(r)


def test_detect_meter_falls_back_to_labelled_estimate(tmp_path):
    make_kirin970(tmp_path, opp="debugfs")
    m = detect_meter(str(tmp_path), kirin_topology())
    assert isinstance(m, PowerModelMeter) and not m.measured
    assert m.source.startswith("estimate:")
    make_rapl(tmp_path)
    assert isinstance(detect_meter(str(tmp_path), kirin_topology()), RaplMeter)


def test_default_frequency_range_without_any_information():
    topo = Topology(clusters=(Cluster("c0", (0,), 1.0),))
    pm = PowerModel.from_system(topo, "/nonexistent-sysfs")
    assert pm["c0"].voltage_source.startswith("default:")
    assert pm.source == "estimate:power-model(voltages: default)"

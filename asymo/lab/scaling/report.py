"""Text of the scaling benchmark's reports: numbers in table columns and the simulator's
validation (what :func:`~asymo.lab.scaling.validate.validate_sim` returns), for the sweep's
table (:meth:`asymo.lab.scaling.result.ScalingResult.table`)."""
from __future__ import annotations

from asymo.lab.sim.calibrate import format_calibration

__all__ = ["format_number", "format_validation"]


def format_number(v):
    """A throughput in a table column: three significant figures or so, "-" for None."""
    if v is None:
        return "-"
    if v >= 100:
        return f"{v:.0f}"
    if v >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def format_validation(val):
    """The validation :func:`asymo.lab.scaling.validate.validate_sim` returned, as text lines."""
    model = val.get("model", {})
    emu = ", ".join(f"cpu {e['cpu']} stopped {e['stopped']:.0%} of every "
                    f"{e['period_s'] * 1e3:g} ms" for e in model.get("emulator", []))
    lines = ["simulator vs measurement. The simulator is given only the calibration, measured "
             "in runs separate from the points predicted: each workload's pool jobs traced "
             "task by task as each cluster with the submitting thread's work between jobs; "
             "no-op jobs for the overheads; the workload's co-running factor"
             + (f"; the emulator's duty cycle ({emu}) plus the time per period the workload "
                "loses beyond it" if emu else "") + "."]
    cal = val.get("calibration")
    if cal and cal.get("schema"):
        lines.extend(format_calibration(cal))
    for name, w in val["workloads"].items():
        lines.append("")
        av = ", ".join(f"cpu {c} {a:.3f}" for c, a in w.get("availability", {}).items())
        cr = w.get("corun_factor")
        lines.append(f"{name} [{w['unit']}]  {w.get('jobs', 0)} pool jobs, "
                     f"{w.get('tasks', 0)} tasks per run; submitting thread's own work "
                     f"{w.get('serial_s', 0.0) * 1e3:.2f} ms per run"
                     + (f"; availability {av}" if av else "")
                     + (f"; co-running factor {cr:.3f}" if cr is not None else ""))
        lines.append(f"{'policy':<10}{'cores':>6}{'measured':>12}{'simulated':>12}"
                     f"{'error':>9}{'best run':>12}{'error':>9}{'duty only':>11}"
                     f"{'speedup':>10}")
        for r in w["points"]:
            sp = r.get("error_speedup")
            lines.append(f"{r['policy']:<10}{r['cores']:>6}{format_number(r['measured']):>12}"
                         f"{format_number(r['simulated']):>12}{r['error'] * 100:>8.1f}%"
                         f"{format_number(r['measured_best']):>12}{r['error_vs_best'] * 100:>8.1f}%"
                         f"{r.get('error_duty_only', float('nan')) * 100:>10.1f}%"
                         + (f"{sp * 100:>9.1f}%" if sp is not None and r["cores"] > 1
                            else f"{'':>10}"))
        ok = "within" if w["max_abs_error"] <= val["tolerance"] else "OUTSIDE"
        lines.append(f"largest |error| {w['max_abs_error'] * 100:.1f}% ({ok} the "
                     f"{val['tolerance'] * 100:.0f}% target)")
    lines.append("error = (simulated - measured) / measured, measured = median of the "
                 "undisturbed runs; best run = the fastest run; duty only = the error of the "
                 "simulator without the measured availability and co-running factor (nominal "
                 "duty cycle, cores independent); speedup = the error of the simulated "
                 "speedup over the same policy's 1-core point (a diagnostic: it takes the "
                 "sweep's own 1-core figure as the level).")
    lines.append("one sweep: on a shared or virtual machine the same point moves by 10-20% "
                 "from sweep to sweep (compare the 1-core rows, which every policy runs "
                 "alike); pool several sweeps' --json files with "
                 "bench/sim_validation_summary.py before judging the model.")
    return lines

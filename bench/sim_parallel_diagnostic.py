"""Where a workload's real parallel run spends the time the simulator does not predict.

Runs one workload on the whole (emulated) machine with one pool policy, ``--runs`` times, and
prints per run the wall time, each worker's time inside tasks (the pool's ``busy_s``), tasks
run and sleeps, next to the simulator's prediction from a calibration file written by
``asymo bench scaling --calibrate-sim`` (same emulator settings). The difference between the
wall time and (the slowest worker's task time + the submitting thread's traced work) is time
in neither: joining jobs, waking workers.

    flock /tmp/asymo-bench.lock python3 bench/sim_parallel_diagnostic.py \
        --workload models --policy even --calibration docs/sim-calibration-emulated.json
"""
import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", default="models")
    ap.add_argument("--policy", default="even", choices=["asymo", "even", "shared", "steal"])
    ap.add_argument("--calibration", required=True, help="JSON from --calibrate-sim")
    ap.add_argument("--emulate", default="1:0.5")
    ap.add_argument("--period", type=float, default=None, help="emulator period (s); "
                    "default: the calibration's")
    ap.add_argument("--runs", type=int, default=30)
    args = ap.parse_args(argv)

    from asymo.lab import scaling
    from asymo.hw import topology as topo
    from asymo.lab.emulate import slow_cores
    from asymo.lab.sim import Overheads
    from asymo.lab.sim import calibrate as simcal

    spec = scaling.parse_emulate(args.emulate)
    with open(args.calibration) as f:
        cal = json.load(f)
    period = args.period or cal.get("emulator_period_s") or 1e-3
    wl = scaling.make_workloads([args.workload])[0]
    with slow_cores(spec, period=period):
        t = topo.detect()
        simcal.check_calibration(cal, t)
        with wl.runner(args.policy, t) as run:
            pool = scaling._OPEN_POOLS[-1]
            with scaling._pinned_thread(t.cpus[0]):
                for _ in range(3):
                    run()
                rows = []
                for _ in range(args.runs):
                    pool.reset_stats()
                    t0 = time.perf_counter()
                    run()
                    wall = time.perf_counter() - t0
                    st = pool.stats()["workers"]
                    rows.append((wall, [w["busy_s"] for w in st], [w["tasks_run"] for w in st],
                                 [w["sleeps"] for w in st]))
        jobs, itf = simcal.sim_inputs(cal, args.workload, t.ncpus, t, emulator_period=period)
        ov = scaling._noop_overheads(cal, t, scaling._duty_cycles(t, period))[args.policy]
        res = scaling._sim_mean(t, jobs, args.policy,
                                Overheads(job=ov["job"], task=ov["task"], steal=ov["steal"]),
                                itf)
    print(f"{args.workload}, policy {args.policy}, emulated {args.emulate}, period "
          f"{period * 1e3:g} ms, {args.runs} runs (sorted by wall time, every 5th shown)")
    rows.sort()
    for wall, busy, tasks, sleeps in rows[::5]:
        print(f"  wall {wall * 1e3:7.2f} ms  in tasks per worker "
              f"{[round(b * 1e3, 2) for b in busy]} ms  tasks {tasks}  sleeps {sleeps}")
    med = statistics.median(r[0] for r in rows)
    busy_med = [statistics.median(r[1][i] for r in rows) for i in range(len(rows[0][1]))]
    serial = sum(j.delay for j in jobs)
    print(f"  median wall {med * 1e3:.2f} ms; median in tasks {[round(b * 1e3, 2) for b in busy_med]}"
          f" ms")
    print(f"simulated: {res.makespan * 1e3:.2f} ms; in tasks "
          f"{[round(float(b) * 1e3, 2) for b in res.busy]} ms; tasks {list(map(int, res.tasks_run))}; "
          f"submitting thread's traced work {serial * 1e3:.2f} ms in {len(jobs) - 1} jobs")
    print(f"wall - (slowest worker in tasks + traced serial work): "
          f"{(med - max(busy_med) - serial) * 1e3:.2f} ms per run")
    return 0


if __name__ == "__main__":
    sys.exit(main())

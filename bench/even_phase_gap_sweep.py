"""Phase locking of back-to-back `even` jobs with the emulator (issue 9): the submitter spins
an extra gap before each 2-task job (its own task ~20 us, core 1's ~400 us of work at speed
0.5) and the time outside core 1's task (wall - worker 1's busy) is printed per extra gap.

    flock /tmp/asymo-bench.lock timeout 120 python3 bench/even_phase_gap_sweep.py 0.0005

Measured 2026-11-21 ~22:27 UTC (2-core Zen 4 VM, load average ~2, 100 jobs per gap),
P = 0.5 ms, two runs (the second with the simulator beside it; its 100 us row was disturbed,
worker 1's task took 1060 us instead of ~620):

    extra gap us                    0    50   100   150   200   250
    run 1 wall med us             979   934   861   816   782  1000
    run 1 wall-longest (med us)   291   254   192   138   109   142
    run 2 wall med us             964   924  (1408)  853   756   729
    run 2 sim, back to back       829   869   840   802   755   668
    run 2 sim, b2b + 54 us wake   953   914   840   802   755   792

The time outside the task falls one-for-one with the extra gap, and wall + gap stays near two
periods (~1000 us): each job starts inside a stop of core 1 and waits for it to end (a start
wait set by where the previous job ended), not a fixed join cost. asymo.lab.sim comes within
about 6% (one row: +9%) only when (1) it runs the calls back to back instead of one call at
spread phases, and (2) the submitter's wake-up after sleeping on the job (54 us, measured
without the emulator as bench/even_join_diagnostic.py's "submitter short" - "equal"
difference) delays the next job; without (2) it is 14% low at the sweep's own gap.
"""
import os
import statistics
import sys
import time
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import numpy as np
from asymo.lab import scaling
from asymo.hw import topology as topo
from asymo.lab.emulate import slow_cores
from asymo.lab.sim.calibrate import spin_pair_task, time_pair_job
spin = spin_pair_task(); buf = np.zeros(4)
P = float(sys.argv[1])
with slow_cores({1: 0.5}, period=P):
    t = topo.detect()
    with scaling._open_pool(t, "even") as pool, scaling._pinned_thread(0):
        def job(i0, i1):
            return time_pair_job(pool, spin, buf, i0, i1)
        for _ in range(20): job(1e5, 10)
        per = statistics.median(job(1e5, 10)[1][0] for _ in range(20)) / 1e5
        n = int(400e-6 / per)
        L = float(sys.argv[2]) if len(sys.argv) > 2 else 54e-6   # submitter wake-up (s)
        from asymo.lab.sim import DutyCycle, Job, simulate
        for extra in (0, 50, 100, 150, 200, 250):
            rows = []
            c0 = time.perf_counter()
            for _ in range(100):
                e = time.perf_counter() + extra * 1e-6
                while time.perf_counter() < e: pass
                rows.append(job(n // 20, n))
            over = [r[0] - max(r[1]) for r in rows]
            gap = (time.perf_counter() - c0) / 100 - statistics.fmean(r[0] for r in rows)
            sims = []
            for wake in (0.0, L):
                sj = Job(costs=[[n // 20 * per] * 2, [n * per] * 2], split=[1, 1], delay=gap + wake)
                sims.append(statistics.fmean(simulate(t, [sj] * 100, policy="even", interference=[
                    DutyCycle(cpu=1, busy=0.5, period=P, phase=P * i / 8)]).makespan / 100
                    for i in range(8)) - gap)
            print(f"P={P*1e3:g}ms extra gap {extra:3d} us: wall med {statistics.median(r[0] for r in rows)*1e6:.0f} us, "
                  f"w1 busy med {statistics.median(r[1][1] for r in rows)*1e6:.0f}, wall-longest q {[round(q*1e6) for q in statistics.quantiles(over, n=4)]}; "
                  f"sim back to back: {sims[0]*1e6:.0f} us, with wake {L*1e6:.0f} us: {sims[1]*1e6:.0f} us (gap {gap*1e6:.0f} us)")

#!/bin/sh
# Reproduce the scaling figures in README.md ("Scaling: measured and simulated").
#
#   1. the simulator's inputs for this machine under the asymmetry emulator (core 1 at half
#      speed, emulator period $PERIOD), measured in a run of their own (--calibrate-sim);
#      `--validate-sim --sim-calibration FILE` compares a later sweep with them;
#   2. the measured sweep under the same emulator, compared with the simulator fed only by
#      its calibration, measured in runs of its own interleaved with the sweep's rounds
#      (--validate-sim): the machine's drift then hits both alike;
#   3. the same validation at a short emulator period ($SHORT_PERIOD, pool policies only;
#      run with SHORT_PERIOD=0.001 OUT=... for a long one);
#   4. simulated for a Kirin 970 (4x A73 + 4x A53), the CPU of AsyMo's Fig. 11;
#   5. repeated validations ($SWEEPS sweeps at each of $PERIODS, pool policies only; every
#      sweep its own locked run, so other work can run between them), written to
#      $OUT/sim-validation/ and pooled by bench/sim_validation_summary.py: one sweep on a
#      shared VM moves by up to ~15% from the next, so the README's tables pool several.
#
# Every measurement takes the shared benchmark lock (each step a few minutes) so they never
# overlap other benchmarks; set STEPS to run only some of them, e.g. STEPS="1 2".
set -eu
cd "$(dirname "$0")/.."
OUT=${OUT:-docs}
REPEATS=${REPEATS:-7}
# each sample at least this long: several calls of a whole model on an already warm pool
# (a 30 ms SqueezeNet call sampled once right after the pool opens reads ~10% slow)
MIN_TIME=${MIN_TIME:-0.1}
PERIOD=${PERIOD:-0.0005}     # asymo.lab.emulate.DEFAULT_PERIOD
SHORT_PERIOD=${SHORT_PERIOD:-0.00025}
WORKLOADS=${WORKLOADS:-spin,matmul,conv2d,models}
STEPS=${STEPS:-1 2 3 4}
SWEEPS=${SWEEPS:-2}
PERIODS=${PERIODS:-0.0005 0.001 0.00025}
LOCK="flock /tmp/asymo-bench.lock timeout 900"
mkdir -p "$OUT"
for step in $STEPS; do
  case $step in
  1) $LOCK python3 -m asymo bench scaling --emulate 1:0.5 --emulator-period "$PERIOD" \
         --workload "$WORKLOADS" --repeats "$REPEATS" --min-time "$MIN_TIME" --no-progress \
         --calibrate-sim "$OUT/sim-calibration-emulated.json" ;;
  2) $LOCK python3 -m asymo bench scaling --emulate 1:0.5 --emulator-period "$PERIOD" \
         --workload "$WORKLOADS" --repeats "$REPEATS" --min-time "$MIN_TIME" --no-progress --validate-sim \
         --json "$OUT/scaling-measured-emulated.json" \
         --plot "$OUT/scaling-measured-emulated.png" ;;
  3) $LOCK python3 -m asymo bench scaling --emulate 1:0.5 --emulator-period "$SHORT_PERIOD" \
         --workload "$WORKLOADS" --repeats "$REPEATS" --min-time "$MIN_TIME" --no-progress --validate-sim \
         --policies asymo,even,shared,steal \
         --json "$OUT/scaling-validation-emulated-short.json" ;;
  4) python3 -m asymo bench scaling --simulate kirin970 --workload "$WORKLOADS" --no-progress \
         --json "$OUT/scaling-simulated-kirin970.json" \
         --plot "$OUT/scaling-simulated-kirin970.png" ;;
  5) mkdir -p "$OUT/sim-validation"
     for i in $(seq "$SWEEPS"); do
       for p in $PERIODS; do
         f="$OUT/sim-validation/p$(python3 -c "print(f'{$p * 1e3:g}')")ms-$i.json"
         $LOCK python3 -m asymo bench scaling --emulate 1:0.5 --emulator-period "$p" \
             --workload "$WORKLOADS" --repeats "$REPEATS" --min-time "$MIN_TIME" --no-progress \
             --validate-sim --policies asymo,even,shared,steal --json "$f" > /dev/null
         gzip -9f "$f"
       done
     done
     python3 bench/sim_validation_summary.py "$OUT"/sim-validation/*.json.gz ;;
  *) echo "unknown step $step" >&2; exit 2 ;;
  esac
done

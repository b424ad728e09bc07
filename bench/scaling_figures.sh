#!/bin/sh
# Reproduce the scaling figures in README.md ("Scaling: measured and simulated").
#
#   1. measured on this machine under the asymmetry emulator (core 1 at half speed), with the
#      simulator calibrated and compared side by side (--validate-sim);
#   2. simulated for a Kirin 970 (4x A73 + 4x A53), the CPU of AsyMo's Fig. 11.
#
# Measurements take the shared benchmark lock so they never overlap other benchmarks.
set -eu
cd "$(dirname "$0")/.."
OUT=${OUT:-docs}
REPEATS=${REPEATS:-7}
WORKLOADS=${WORKLOADS:-spin,matmul,conv2d,models}
mkdir -p "$OUT"
flock /tmp/asymo-bench.lock python3 -m asymo bench scaling --emulate 1:0.5 \
    --workload "$WORKLOADS" --repeats "$REPEATS" --validate-sim \
    --json "$OUT/scaling-measured-emulated.json" --plot "$OUT/scaling-measured-emulated.png"
python3 -m asymo bench scaling --simulate kirin970 --workload "$WORKLOADS" \
    --json "$OUT/scaling-simulated-kirin970.json" --plot "$OUT/scaling-simulated-kirin970.png"

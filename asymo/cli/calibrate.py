"""``asymo calibrate``: measure this CPU once; asymo's plans use the result automatically.

Runs the GEMM calibration of `asymo.calibrate.gemm` (AsyMo's cost model, split ratios, report)
and, with ``--energy``, the energy-frequency curves of `asymo.dvfs` (`asymo.calibrate.energy`),
and writes both into the profile (``--profile`` / env ASYMO_PROFILE / the XDG cache).
"""
from __future__ import annotations

import argparse
import os
import sys
import warnings

_EPILOG = """\
what is measured: the AsyMo data set (15 MM sizes from VGG-16 and MobileNet V1
convolutions, 20 MV sizes) over a range of block sizes, about 270 settings per cluster, each
cluster alone on its own cores; then every candidate block size of shapes outside the
training set, to report how close the cost model's choice comes to the best. The cost model
(the paper's Table 2, and an extended one) is fitted per cluster with 10-fold
cross-validation; the split ratios (MM and MV) come from each cluster's measured speed.

--quick measures fewer block settings, repeats and held-out shapes (about a minute or two);
the full set takes a few minutes. Measurements are saved as they are made: an interrupted run
(Ctrl-C) resumes where it stopped when started again with the same options.

Timings are the minimum of interleaved samples; rounds during which another process used the
cluster's cpus do not end the measurement early. For comparable figures keep the machine
otherwise idle. Under `asymo emulate` the profile belongs to the emulated topology (its own
fingerprint).

environment: ASYMO_PROFILE (profile path), ASYMO_TOPOLOGY (topology override),
ASYMO_CALIBRATION_SET=tiny (a few small shapes: for tests of the tooling only).
"""


def register(sub):
    p = sub.add_parser("calibrate", help="measure this CPU: GEMM cost model and split ratios "
                                         "(and, with --energy, energy-frequency curves)",
                       description="Calibrate asymo on this CPU: fit AsyMo's block-size cost "
                                   "model per cluster, measure the split ratios between "
                                   "clusters, and store them in the calibration profile that "
                                   "asymo.matmul and asymo.plan_matmul use automatically.",
                       epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="a smaller run (fewer settings and repeats); good enough to start")
    p.add_argument("--profile", default=None, metavar="PATH",
                   help="profile file to write (default: env ASYMO_PROFILE, else "
                        "$XDG_CACHE_HOME/asymo/profile-<cpu fingerprint>.json)")
    p.add_argument("--topology", default=None, metavar="SPEC",
                   help="explicit topology, e.g. 'big:0-3@1.0,little:4-7@0.45' (default: "
                        "detected, or env ASYMO_TOPOLOGY)")
    p.add_argument("--restart", action="store_true",
                   help="discard the measurements of an interrupted run instead of resuming")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true",
                   help="print what was stored (JSON) instead of the report")
    try:
        from asymo.calibrate.energy import CALIBRATE_ENERGY_HELP
    except ImportError:  # pragma: no cover - a build without dvfs
        CALIBRATE_ENERGY_HELP = None
    if CALIBRATE_ENERGY_HELP:
        p.add_argument("--energy", action="store_true",
                       help="also " + CALIBRATE_ENERGY_HELP[0].lower() + CALIBRATE_ENERGY_HELP[1:])
    p.set_defaults(func=run)


def run(args):
    from asymo.calibrate import gemm as calibration
    from asymo.calibrate import gemm_set as calibration_set
    from asymo import profile as prof
    from asymo.hw import topology as topo

    try:
        t = topo.detect(override=args.topology)
    except topo.TopologyError as exc:
        print(f"asymo calibrate: error: {exc}", file=sys.stderr)
        return 2
    set_name = os.environ.get(calibration_set.SET_ENV_VAR) or ("quick" if args.quick else "full")
    try:
        calibration_set.get_set(set_name)
    except ValueError as exc:
        print(f"asymo calibrate: error: {exc}", file=sys.stderr)
        return 2
    path = prof.profile_path(t, args.profile)
    if args.profile is not None:
        # a path the user gave is checked before minutes of measuring, not when saving (its
        # directory is not made: a mistyped one should not appear)
        from asymo.cli.options import check_output

        try:
            check_output(path, "--profile")
        except ValueError as exc:
            print(f"asymo calibrate: error: {exc}", file=sys.stderr)
            return 2
    print(f"asymo calibrate: {set_name} set on topology {t.to_spec()}"
          + (f" (emulated: {dict(sorted(t.emulated.items()))})" if t.emulated else "")
          + f"; profile {path}", file=sys.stderr)
    with warnings.catch_warnings():
        # an unusable old profile is about to be replaced: say so once, plainly
        warnings.simplefilter("ignore", prof.ProfileWarning)
        existing = prof.load_profile(path, t)
    if existing is None and os.path.exists(path):
        print(f"asymo calibrate: note: {path} is unusable (corrupt, another CPU or version); "
              "it will be replaced", file=sys.stderr)
    try:
        section = calibration.calibrate_gemm(
            t, set_name=set_name, path=path, resume=not args.restart,
            progress=not args.no_progress, profile=existing)
    except KeyboardInterrupt:
        print(f"asymo calibrate: interrupted; the measurements so far are in "
              f"{calibration.partial_path(path)}; run the same command again to resume",
              file=sys.stderr)
        return 130
    energy = None
    if getattr(args, "energy", False):
        from asymo.calibrate.energy import calibrate_energy, format_calibration
        profile = prof.load_profile(path, t) or prof.Profile.new(t, path)
        energy = calibrate_energy(t, progress=not args.no_progress, profile=profile)
    if args.json:
        from asymo.cli.options import json_text

        out = {"gemm": section}
        if energy is not None:
            out["energy"] = energy
        print(json_text(out, indent=1, default=str))
    else:
        print(calibration.format_report(section))
        if energy is not None:
            print(format_calibration(energy))
        print(f"saved to {section.get('path', path)}")
    return 0

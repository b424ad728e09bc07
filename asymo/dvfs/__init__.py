"""Least-energy CPU frequency for DL inference (AsyMo sections 3.2, 4.4 and 5).

* ``CpuFreq``: read and set per-cluster CPU frequencies through Linux cpufreq, restoring
  everything on every exit path.
* meters: ``RaplMeter``, ``HwmonMeter``, ``CallableMeter``, ``CsvTraceMeter`` measure energy;
  ``PowerModelMeter`` estimates it from ``PowerModel`` (``P = P_static + C V^2 f``).
* curves: energy-frequency curves of a compute-bound and a memory-bound micro-benchmark per
  cluster, measured by `asymo.calibrate.energy` (``asymo calibrate --energy``) or estimated.
* selection: data reuse (AsyMo Eq. 2) per op and per model, least-energy frequency per
  cluster, ``frequency_plan(model, mode="energy")`` and its report.

Anything estimated rather than measured says so (``measured=False``, ``source`` starting
with ``estimate:``, ``report.estimated``).
"""
from asymo.dvfs.cpufreq import (CpuFreq, CpuFreqError, CpuFreqPermissionError,  # noqa: F401
                                FrequencyChange, PolicyInfo)
from asymo.dvfs.meters import (CallableMeter, CsvTraceMeter, HwmonMeter, Meter,  # noqa: F401
                               MeterReading, MeterUnavailable, PowerModelMeter, RaplMeter,
                               available_meters, detect_meter, integrate_power)
from asymo.dvfs.power_model import ClusterPower, PowerModel, read_opp_table  # noqa: F401
from asymo.dvfs.curves import (BenchCurve, ClusterCurves, CurveFormatError,  # noqa: F401
                               estimate_curves, load_curves)
from asymo.dvfs.selection import (DvfsWarning, FrequencyPlan, FrequencyReport,  # noqa: F401
                                  compute_weight, data_reuse, frequency_plan,
                                  least_energy_frequency, model_reuse, plan_frequencies,
                                  predict_cluster)

__all__ = [
    "CpuFreq", "CpuFreqError", "CpuFreqPermissionError", "FrequencyChange", "PolicyInfo",
    "Meter", "MeterReading", "MeterUnavailable", "RaplMeter", "HwmonMeter", "CallableMeter",
    "CsvTraceMeter", "PowerModelMeter", "available_meters", "detect_meter", "integrate_power",
    "ClusterPower", "PowerModel", "read_opp_table",
    "BenchCurve", "ClusterCurves", "CurveFormatError", "estimate_curves", "load_curves",
    "DvfsWarning", "FrequencyPlan", "FrequencyReport", "compute_weight", "data_reuse",
    "frequency_plan", "least_energy_frequency", "model_reuse", "plan_frequencies",
    "predict_cluster",
]

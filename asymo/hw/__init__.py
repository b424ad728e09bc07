"""Machine facts: CPU topology from sysfs, per-cluster CPU load, the environment.

Standard library only; every reader takes a sysfs root and an explicit override, so each path
is testable on a machine that lacks the hardware.
"""

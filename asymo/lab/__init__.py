"""The lab: tools for studying asymo on machines it is not running on.

``emulate`` (an asymmetric CPU on a symmetric one), ``sim`` (a discrete-event model of the
pool), ``scaling`` (scaling sweeps, measured or simulated) and their helpers. Nothing outside
this package imports it, except the command line's ``emulate`` and ``bench`` commands.

Inside, imports flow one way, lowest first: ``occupier``, ``loadmon``, ``speedprobe`` and
``emulate``; ``machine`` (pinned threads, open pools, affinity, load average, emulated cores)
and ``sampling`` (undisturbed samples in interleaved rounds); ``sim`` (the model, traces and
its calibration); ``scaling`` (workloads, results, sweeps and the simulator's validation).
"""

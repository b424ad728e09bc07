"""The lab: tools for studying asymo on machines it is not running on.

``emulate`` (an asymmetric CPU on a symmetric one), ``sim`` (a discrete-event model of the
pool), ``scaling`` (scaling sweeps, measured or simulated) and their helpers. Nothing outside
this package imports it, except the command line's ``emulate`` and ``bench`` commands.
"""

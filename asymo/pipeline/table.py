"""The time matrix ``T`` of Pipe-it (paper 000, Table II): execution time of every layer on
every core configuration.

``LayerTimes`` is plain data: a ``(W, C)`` array of seconds for ``W`` layers (the model's chain
of major layers) and ``C`` core configurations, the bytes each layer outputs (for the transfer
cost ``k * B`` of paper 004), optionally the kernel-level time of each layer on all cores, and
a ``source`` label that says whether the numbers were measured or predicted (and from what).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from asymo.pipeline.configs import CoreConfig

__all__ = ["LayerTimes"]


@dataclass
class LayerTimes:
    """Per-layer execution time (seconds) for each core configuration.

    Parameters
    ----------
    configs : sequence of CoreConfig
        Column labels.
    times : array_like, shape (W, len(configs))
        ``times[l, c]`` is the time of layer ``l`` on ``configs[c]``; must be finite and >= 0.
    layer_names : sequence of str, optional
    out_bytes : array_like, shape (W,), optional
        Size of each layer's output activation for one image (the data a stage boundary after
        that layer hands over).
    kernel_level : array_like, shape (W,), optional
        Time of each layer with every core of the machine in one pool (the kernel-level
        baseline).
    source : str
        Where the numbers come from, e.g. ``"measured"``, ``"predicted (calibrated)"``,
        ``"predicted (default model scaled by capacity)"``.
    """

    configs: tuple
    times: np.ndarray
    layer_names: tuple = ()
    out_bytes: np.ndarray = None
    kernel_level: np.ndarray = None
    source: str = "unspecified"
    _index: dict = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self):
        self.configs = tuple(self.configs)
        for c in self.configs:
            if not isinstance(c, CoreConfig):
                raise TypeError(f"configs must be CoreConfig, got {type(c).__name__}")
        if len(set(self.configs)) != len(self.configs):
            raise ValueError("configs contains a core configuration twice")
        t = np.asarray(self.times, dtype=np.float64)
        if t.ndim != 2 or t.shape[1] != len(self.configs):
            raise ValueError(f"times must have shape (layers, {len(self.configs)}), "
                             f"got {t.shape}")
        if t.shape[0] == 0:
            raise ValueError("times has no layers")
        if not np.all(np.isfinite(t)) or np.any(t < 0):
            raise ValueError("times must be finite and non-negative")
        self.times = t
        W = t.shape[0]
        self.layer_names = tuple(self.layer_names) or tuple(f"l{i + 1}" for i in range(W))
        if len(self.layer_names) != W:
            raise ValueError(f"{len(self.layer_names)} layer names for {W} layers")
        if self.out_bytes is None:
            self.out_bytes = np.zeros(W)
        self.out_bytes = np.asarray(self.out_bytes, dtype=np.float64)
        if self.out_bytes.shape != (W,) or np.any(self.out_bytes < 0):
            raise ValueError(f"out_bytes must be {W} non-negative numbers")
        if self.kernel_level is not None:
            k = np.asarray(self.kernel_level, dtype=np.float64)
            if k.shape != (W,) or not np.all(np.isfinite(k)) or np.any(k < 0):
                raise ValueError(f"kernel_level must be {W} finite non-negative numbers")
            self.kernel_level = k
        self._index = {c: i for i, c in enumerate(self.configs)}

    @property
    def nlayers(self):
        return self.times.shape[0]

    def has(self, config):
        return config in self._index

    def T(self, config):
        """Times of all layers on ``config`` (Pipe-it's ``T^{P_i}``), shape (W,)."""
        try:
            return self.times[:, self._index[config]]
        except KeyError:
            raise KeyError(f"no times for core configuration {config}; the table has "
                           f"{[c.label() for c in self.configs]}") from None

    def stage_time(self, config, start, stop):
        """Pipe-it Eq. 9: time of layers ``[start, stop)`` on ``config`` (0 when empty)."""
        if stop <= start:
            return 0.0
        return float(self.T(config)[start:stop].sum())

    def subset(self, configs):
        """A table restricted to ``configs`` (in that order)."""
        configs = tuple(configs)
        cols = [self._index[c] for c in configs]
        return LayerTimes(configs, self.times[:, cols], self.layer_names, self.out_bytes,
                          self.kernel_level, self.source)

    def to_dict(self):
        return {"configs": [c.to_list() for c in self.configs],
                "times": self.times.tolist(),
                "layer_names": list(self.layer_names),
                "out_bytes": self.out_bytes.tolist(),
                "kernel_level": None if self.kernel_level is None
                else self.kernel_level.tolist(),
                "source": self.source}

    @classmethod
    def from_dict(cls, d):
        if not isinstance(d, dict):
            raise ValueError("a LayerTimes description must be a JSON object")
        try:
            return cls(configs=[CoreConfig.from_list(c) for c in d["configs"]],
                       times=d["times"], layer_names=d.get("layer_names", ()),
                       out_bytes=d.get("out_bytes"), kernel_level=d.get("kernel_level"),
                       source=str(d.get("source", "unspecified")))
        except KeyError as exc:
            raise ValueError(f"LayerTimes description lacks {exc}") from None

"""The calibration profile: one versioned JSON file per CPU.

The profile holds everything asymo measures about a CPU (cost models, split ratios, energy
curves), as named sections of plain JSON data. It is keyed by a CPU fingerprint (model name,
topology, cpu ids, emulation state); a file that is corrupt, foreign (another CPU) or of
another version is reported with a warning and ignored, so callers fall back to defaults.
JSON only: nothing read from disk is ever unpickled or executed.

Location: ``--profile PATH`` / env ``ASYMO_PROFILE``, else
``$XDG_CACHE_HOME/asymo/profile-<fingerprint>.json`` (``~/.cache`` by default).
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
import threading
import warnings
from dataclasses import dataclass, field

from asymo.hw.topology import cpu_model_name

__all__ = ["PROFILE_VERSION", "Profile", "ProfileWarning", "cpu_fingerprint", "profile_path",
           "load_profile", "save_profile", "active_profile", "reset_active_profile"]

PROFILE_VERSION = 1
ENV_VAR = "ASYMO_PROFILE"


class ProfileWarning(UserWarning):
    """A calibration profile could not be used; defaults are used instead."""


def cpu_fingerprint(topology=None):
    """Return ``(digest, description)`` identifying this CPU as asymo sees it."""
    if topology is None:
        from asymo.hw.topology import detect
        topology = detect()
    desc = {
        "model": cpu_model_name(),
        "clusters": [{"cpus": list(c.cpus), "capacity": round(c.capacity, 3)}
                     for c in topology.clusters],
        "emulated": {str(k): round(v, 3) for k, v in sorted(topology.emulated.items())},
    }
    digest = hashlib.sha256(json.dumps(desc, sort_keys=True).encode()).hexdigest()[:16]
    return digest, desc


def profile_path(topology=None, path=None):
    """Where the profile for ``topology`` lives (explicit path > env > XDG cache)."""
    if path:
        return os.fspath(path)
    if os.environ.get(ENV_VAR):
        return os.environ[ENV_VAR]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    digest, _ = cpu_fingerprint(topology)
    return os.path.join(base, "asymo", f"profile-{digest}.json")


@dataclass
class Profile:
    """In-memory profile: fingerprint plus named sections of JSON data."""

    fingerprint: str
    cpu: dict
    sections: dict = field(default_factory=dict)
    path: str = ""
    version: int = PROFILE_VERSION

    def to_dict(self):
        return {"format": "asymo-profile", "version": self.version,
                "fingerprint": self.fingerprint, "cpu": self.cpu, "sections": self.sections}

    @classmethod
    def new(cls, topology=None, path=None):
        digest, desc = cpu_fingerprint(topology)
        return cls(fingerprint=digest, cpu=desc, path=profile_path(topology, path))


def load_profile(path=None, topology=None, *, warn_missing=False):
    """Read and validate a profile; return None (with a ProfileWarning) if it cannot be used."""
    from asymo.profile.files import loads_bounded, read_regular_file

    path = profile_path(topology, path)
    try:
        # only a regular file, size-limited, never blocking (a FIFO, /dev/zero, /dev/urandom)
        raw = read_regular_file(path)
    except FileNotFoundError:
        if warn_missing:
            warnings.warn(f"no calibration profile at {path}; using defaults "
                          "(run `asymo calibrate`)", ProfileWarning, stacklevel=2)
        return None
    except (OSError, ValueError) as exc:
        warnings.warn(f"cannot read calibration profile {path} ({exc}); using defaults",
                      ProfileWarning, stacklevel=2)
        return None
    try:
        data = loads_bounded(raw)
        if not isinstance(data, dict) or data.get("format") != "asymo-profile":
            raise ValueError("not an asymo profile")
        if not isinstance(data.get("sections"), dict):
            raise ValueError("missing sections")
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        warnings.warn(f"calibration profile {path} is corrupt ({exc}); using defaults",
                      ProfileWarning, stacklevel=2)
        return None
    if data.get("version") != PROFILE_VERSION:
        warnings.warn(f"calibration profile {path} has version {data.get('version')!r}, this "
                      f"asymo reads version {PROFILE_VERSION}; using defaults (re-run "
                      "`asymo calibrate`)", ProfileWarning, stacklevel=2)
        return None
    digest, _ = cpu_fingerprint(topology)
    if data.get("fingerprint") != digest:
        warnings.warn(f"calibration profile {path} was made on another CPU or topology "
                      f"({data.get('cpu')!r}); using defaults (re-run `asymo calibrate`)",
                      ProfileWarning, stacklevel=2)
        return None
    return Profile(fingerprint=digest, cpu=data.get("cpu", {}), sections=data["sections"],
                   path=path, version=PROFILE_VERSION)


def save_profile(profile, path=None):
    """Write atomically (temp file + rename) so a crash never leaves half a profile."""
    path = os.fspath(path or profile.path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".profile-", dir=os.path.dirname(os.path.abspath(path)))
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(profile.to_dict(), f, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    profile.path = path
    reset_active_profile()
    return path


_active_lock = threading.Lock()
_active = {}


def active_profile(topology=None):
    """The profile matching the current CPU, loaded once and cached (None: use defaults)."""
    key = (profile_path(topology), cpu_fingerprint(topology)[0])
    with _active_lock:
        if key not in _active:
            _active[key] = load_profile(key[0], topology)
        return _active[key]


def reset_active_profile():
    with _active_lock:
        _active.clear()

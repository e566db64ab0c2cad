"""The environment of a child process run as a newcomer runs it: no ``CKPTSTORE_*`` setting of
the test run, a fresh ``CKPTSTORE_HOME`` (so the default storage and registry are its own) and
this repository importable."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def fresh_home_env(home: Path, **extra: str) -> dict[str, str]:
    """``os.environ`` without ``CKPTSTORE_*``, with ``CKPTSTORE_HOME=home`` and ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CKPTSTORE_")}
    env.update(CKPTSTORE_HOME=str(home), PYTHONPATH=str(ROOT), **extra)
    return env

"""The environment of a process that runs the repository's Keras code, and where the suite's JAX
and PyTorch are.

``scripts/setup.sh --test`` installs JAX into ``.venv-jax/`` at the repository root, outside the
venv's site-packages: with JAX importable, ``import tensorflow`` imports it too
(``tensorflow/lite/python/util.py`` tries ``from jax import jit``), about 1.3 CPU-seconds more in
each of the hundreds of TensorFlow processes the suite starts (measured: docs/development.md).
Only processes that run Keras on JAX get the folder on ``PYTHONPATH`` (:func:`keras_env`,
:func:`repo_pythonpath`). A JAX installed the usual way (``pip install "jax[cpu]"``) works too. PyTorch (its CPU build)
goes into ``.venv-torch/`` the same way, for the processes on ``KERAS_BACKEND=torch``.
"""

from __future__ import annotations

import importlib.util
import os

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
#: ``pip install --target`` folder of jax, jaxlib and scipy (scripts/setup.sh --test).
JAX_DIR = os.path.join(REPO, ".venv-jax")
#: ``pip install --target`` folder of torch (its CPU wheel; scripts/setup.sh --test).
TORCH_DIR = os.path.join(REPO, ".venv-torch")
#: Keras backend -> (its package, the folder the suite installs it into).
_INSTALLED = {"jax": ("jax", JAX_DIR), "torch": ("torch", TORCH_DIR)}


def backend_missing(backend: str) -> str | None:
    """Why a process on ``KERAS_BACKEND=backend`` (jax or torch) cannot start here, or None."""
    package, folder = _INSTALLED[backend]
    if os.path.isdir(os.path.join(folder, package)) or importlib.util.find_spec(package):
        return None
    return f"{package} is not installed: {folder} is missing (run `bash scripts/setup.sh --test`)"


def jax_missing() -> str | None:
    """Why a process on ``KERAS_BACKEND=jax`` cannot start here, or None when it can."""
    return backend_missing("jax")


def torch_missing() -> str | None:
    """Why a process on ``KERAS_BACKEND=torch`` cannot start here, or None when it can."""
    return backend_missing("torch")


def require_backend(backend: str) -> None:
    """Skips the calling test without ``backend``'s package (with ``CI=true`` the skip fails:
    ci_skips.py)."""
    import pytest  # here, not at the top: benchmarks import this module without pytest's plugins

    reason = backend_missing(backend)
    if reason:
        pytest.skip(reason)


def require_jax() -> None:
    """Skips the calling test without JAX (with ``CI=true`` the skip fails: ci_skips.py)."""
    require_backend("jax")


def require_torch() -> None:
    """Skips the calling test without PyTorch (with ``CI=true`` the skip fails: ci_skips.py)."""
    require_backend("torch")


def repo_pythonpath(backend: str | None) -> str:
    """``PYTHONPATH`` for a child on ``backend``: the repository, and on JAX (PyTorch)
    ``.venv-jax`` (``.venv-torch``) too."""
    extra = _INSTALLED.get(backend or "")
    return os.pathsep.join([REPO, extra[1]] if extra else [REPO])


def keras_env(backend: str | None = None, **extra: str) -> dict[str, str]:
    """``os.environ`` plus ``extra`` for a child running the repository's Keras code on
    ``backend`` (default: this process's ``KERAS_BACKEND``); ``PYTHONPATH`` from
    :func:`repo_pythonpath`, so a TensorFlow child started from a JAX process does not see JAX."""
    env = dict(os.environ, **extra)
    if backend:
        env["KERAS_BACKEND"] = backend
    env["PYTHONPATH"] = repo_pythonpath(env.get("KERAS_BACKEND"))
    return env

#!/usr/bin/env bash
# Creates .venv and installs ckptstore (editable) with its dependencies.
#   bash scripts/setup.sh          # library + main job
#   bash scripts/setup.sh --test   # plus the test and docs extras (moto, fake-gcs-server, psycopg,
#                                  # pytest, ruff, mkdocs: tests/docs builds the site), and JAX
#                                  # into .venv-jax/ (PyTorch into .venv-torch/) for the tests
#                                  # that run Keras on JAX (PyTorch)
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
  .venv/bin/python -m pip install -q --upgrade pip
fi
# --no-compile: pip would byte-compile all ~20,000 .py files of the dependencies (~70 CPU-s on one
# core); Python compiles what a process imports, when it first imports it.
PIP_INSTALL=(.venv/bin/python -m pip install -q --no-compile)

# JAX and PyTorch for the tests on KERAS_BACKEND=jax / torch, outside the venv: with JAX in
# site-packages every `import tensorflow` imports it (tensorflow/lite/python/util.py tries
# `from jax import jit`), ~1.3 CPU-seconds in each of the suite's hundreds of TensorFlow processes
# (docs/development.md). Only the JAX / torch runs put .venv-jax / .venv-torch on PYTHONPATH
# (tests/_helpers/jax_env.py). --no-deps: numpy, ml_dtypes and opt_einsum are the venv's
# (TensorFlow's; never a second numpy here); scipy goes to .venv-jax, as TensorFlow imports it if
# found. torch's runtime dependencies (filelock, sympy, networkx, jinja2, fsspec,
# typing_extensions, mpmath) all come with the test extras (ray, moto[server], mkdocs, ckptstore).
# torch is pinned to its CPU build: 2.13.0 from the local CPU wheel took 9.6 CPU-s and 700 MB
# (docs/concepts/exact-resume.md); an unpinned torch would pull a multi-GB CUDA build.
# Each goes into its own folder, beside the main install (CI's machine has 2 cores).
target_pids=()
target_install() {  # FOLDER PINS...: pip install --target FOLDER, unless its stamp names the pins
  local dir="$1"; shift
  # The wheels are built for one Python: the stamp names it with the pins.
  local want
  want="$(.venv/bin/python -c 'import sys; print(sys.implementation.cache_tag)') $*"
  if [ "$(cat "$dir/.installed" 2>/dev/null)" != "$want" ]; then
    rm -rf "$dir"
    ( "${PIP_INSTALL[@]}" --no-deps --target "$dir" "$@" && echo "$want" > "$dir/.installed" ) &
    target_pids+=($!)
  fi
}
if [ "${1:-}" = "--test" ]; then
  target_install .venv-jax jax==0.10.2 jaxlib==0.10.2 scipy==1.17.1
  target_install .venv-torch torch==2.13.0
fi

extras=""
[ "${1:-}" = "--test" ] && extras="[test,docs]"
# A stamp keeps re-runs fast: reinstall only when pyproject.toml changed.
stamp=".venv/.ckptstore-installed${extras}"
# An install with the test extras also satisfies a plain one.
full=".venv/.ckptstore-installed[test,docs]"
[ -z "$extras" ] && [ -f "$full" ] && [ ! pyproject.toml -nt "$full" ] && stamp="$full"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  "${PIP_INSTALL[@]}" -e ".${extras}"
  touch "$stamp"
fi
for pid in "${target_pids[@]}"; do wait "$pid"; done

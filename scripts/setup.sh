#!/usr/bin/env bash
# Creates .venv and installs ckptstore (editable) with its dependencies.
#   bash scripts/setup.sh          # library + main job
#   bash scripts/setup.sh --test   # plus the test and docs extras (moto, fake-gcs-server, psycopg,
#                                  # pytest, ruff, mkdocs: tests/docs builds the site), and JAX
#                                  # into .venv-jax/ for the tests that run Keras on JAX
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

# JAX for the tests on KERAS_BACKEND=jax, outside the venv: with JAX in site-packages every
# `import tensorflow` imports it (tensorflow/lite/python/util.py tries `from jax import jit`),
# ~1.3 CPU-seconds in each of the suite's hundreds of TensorFlow processes (docs/development.md).
# Only the JAX runs put .venv-jax on PYTHONPATH (tests/_helpers/jax_env.py). --no-deps: numpy, ml_dtypes and opt_einsum are the venv's
# (TensorFlow's; never a second numpy here); scipy goes here too, as TensorFlow imports it if found.
# It goes into its own folder, so it installs beside the main install (CI's machine has 2 cores).
jax_pid=""
if [ "${1:-}" = "--test" ]; then
  jax_pins="jax==0.10.2 jaxlib==0.10.2 scipy==1.17.1"
  # The wheels are built for one Python: the stamp names it with the pins.
  want="$(.venv/bin/python -c 'import sys; print(sys.implementation.cache_tag)') $jax_pins"
  if [ "$(cat .venv-jax/.installed 2>/dev/null)" != "$want" ]; then
    rm -rf .venv-jax
    # shellcheck disable=SC2086 # the pins are separate words
    ( "${PIP_INSTALL[@]}" --no-deps --target .venv-jax $jax_pins &&
      echo "$want" > .venv-jax/.installed ) &
    jax_pid=$!
  fi
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
[ -z "$jax_pid" ] || wait "$jax_pid"

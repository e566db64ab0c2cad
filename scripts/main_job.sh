#!/usr/bin/env bash
# The main job, from nothing: a real Keras training run on the embedded default (local storage +
# SQLite under ./runs/main_job): train, interrupt with SIGTERM, resume to the end, load the final
# checkpoint by UUID and predict. Exits non-zero if any step fails.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=2
exec .venv/bin/python examples/iris/main_job.py --workdir runs/main_job "$@"

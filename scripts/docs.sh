#!/usr/bin/env bash
# The documentation site (mkdocs.yml, pages in docs/):
#   bash scripts/docs.sh serve    # live preview on http://127.0.0.1:8000/
#   bash scripts/docs.sh build    # static site in site/, --strict as CI builds it
# Installs the docs extra into .venv first (scripts/setup.sh --test does too).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || bash scripts/setup.sh
.venv/bin/python -c "import mkdocs, mkdocstrings, mkdocs_click, material" 2>/dev/null \
  || .venv/bin/python -m pip install -q -e ".[docs]"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
case "${1:-serve}" in
  serve) shift || true; exec .venv/bin/mkdocs serve "$@" ;;
  build) shift; exec .venv/bin/mkdocs build --strict "$@" ;;
  *) echo "usage: bash scripts/docs.sh [serve|build] [mkdocs options]" >&2; exit 2 ;;
esac

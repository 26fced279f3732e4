#!/usr/bin/env bash
# The test command (README): sets up .venv if needed, then runs the whole suite, slow tests too.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
exec .venv/bin/python -m pytest "$@"

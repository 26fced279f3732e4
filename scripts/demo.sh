#!/usr/bin/env bash
# The main job (README): sets up .venv if needed, then diagnoses the bundled example script and
# proves the report's patch by running it (--verify: a patched scratch copy and the original
# run side by side; the example itself is never changed).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
set +e
.venv/bin/gradient-doctor check examples/buggy_train.py --verify "$@"
rc=$?
# Exit 1 means "findings at or above --fail-on": the expected outcome for a buggy example.
[ "$rc" -le 1 ] && exit 0 || exit "$rc"

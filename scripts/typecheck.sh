#!/usr/bin/env bash
# mypy over the four packages under their installed names (gradient_doctor.*).
# The repository keeps them as top-level folders and setup.py maps them onto the namespace;
# mypy cannot follow that mapping (an editable-install import hook), so it reads them through
# a temporary folder of symlinks that has the installed layout.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
mkdir "$root/gradient_doctor"
touch "$root/gradient_doctor/__init__.py"
for folder in knowledge probes templates skill_server; do
  ln -s "$PWD/$folder" "$root/gradient_doctor/$folder"
done
cd "$root"
exec "$OLDPWD/.venv/bin/mypy" --config-file "$OLDPWD/pyproject.toml" -p gradient_doctor "$@"

#!/usr/bin/env bash
# Set up (or refresh) the project's virtual environment from scratch on a bare machine:
# pinned Python packages (core + ROS 2 wheels), the rosidl message package, and this
# package (editable, so `tensegrity_engine` maps to engine/). Idempotent and quick when
# nothing changed. Usage: tools/setup.sh [VENV_DIR]   (default: .venv in the repo)
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${1:-$repo/.venv}"
python="${PYTHON:-python3}"

if [ ! -x "$venv/bin/python" ]; then
  echo "setup: creating virtual environment $venv"
  "$python" -m venv "$venv"
fi
stamp="$venv/.tensegrity_requirements.sha"
want="$(cat "$repo/requirements.txt" "$repo/tools/ros/requirements.txt" | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "setup: installing pinned requirements"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$repo/requirements.txt"
  echo "$want" > "$stamp"
fi
VENV="$venv" bash "$repo/tools/ros/build_interfaces.sh"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps -e "$repo"
echo "setup: ready ($venv)"

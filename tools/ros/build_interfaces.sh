#!/usr/bin/env bash
# Build the tensegrity_ros_interfaces ROS 2 message package (msg/tensegrity_ros_interfaces)
# into a wheel with rosidl + scikit-build-core against the PyPI ROS 2 wheels, and
# pip-install it into the venv (the venv is the ROS prefix).
#
# Usage:  source VENV/bin/activate && bash tools/ros/build_interfaces.sh
#    or:  VENV=/path/to/venv bash tools/ros/build_interfaces.sh
# Prereq: pip install -r tools/ros/requirements.txt   (into that venv)
# Env:    VENV                venv to use (default: $VIRTUAL_ENV)
#         TRI_BUILD_DIR       build dir (default: <repo>/.build/ros_interfaces, git-ignored)
#         FORCE=1             rebuild + reinstall even if up to date
# Idempotent: skips when the installed build matches the sources (hash stamp in the venv).
set -euo pipefail

die() { echo "build_interfaces.sh: ERROR: $*" >&2; exit 1; }
log() { echo "build_interfaces.sh: $*"; }

t_start=$(date +%s.%N)
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
pkg="$repo/msg/tensegrity_ros_interfaces"
[ -f "$pkg/package.xml" ] || die "interface package not found at $pkg"

venv="${VENV:-${VIRTUAL_ENV:-}}"
[ -n "$venv" ] || die "no venv: activate one or set VENV=/path/to/venv"
venv="$(cd "$venv" 2>/dev/null && pwd)" || die "venv dir does not exist: ${VENV:-${VIRTUAL_ENV:-}}"
py="$venv/bin/python"
[ -x "$py" ] || die "$py not found or not executable (is $venv a venv?)"

# Use this venv's ROS libs even when called from a process bootstrapped for
# another venv (ros-wheels-bootstrapper re-execs python only when unset).
unset _ROS_WHEELS_BOOTSTRAP_COMPLETE
export VIRTUAL_ENV="$venv"
export PATH="$venv/bin:$PATH"
export AMENT_PREFIX_PATH="${AMENT_PREFIX_PATH:-$venv}"
export CMAKE_PREFIX_PATH="${CMAKE_PREFIX_PATH:-$venv}"

# ---- prerequisites -----------------------------------------------------------
hint="install them with: $py -m pip install -r $here/requirements.txt"
command -v cmake >/dev/null || die "cmake not on PATH (need >= 3.20; apt-get install cmake, or pip install cmake)"
"$py" -c 'import sys; sys.exit(0 if sys.version_info[:2] >= (3, 8) else 1)' \
  || die "$py is too old"
missing=""
for mod in scikit_build_core ament_package catkin_pkg rclpy numpy em lark; do
  "$py" -c "import $mod" >/dev/null 2>&1 || missing="$missing $mod(python)"
done
for share in ament_cmake rosidl_default_generators rosidl_core_generators \
             ament_cmake_include_directories ament_cmake_ros_core std_msgs; do
  [ -d "$venv/share/$share" ] || missing="$missing $share(share/)"
done
[ -z "$missing" ] || die "missing in $venv:$missing; $hint"

# ---- build dir (must not be tracked by git) ----------------------------------
build="$(realpath -m "${TRI_BUILD_DIR:-$repo/.build/ros_interfaces}")"
if git -C "$repo" rev-parse --git-dir >/dev/null 2>&1; then
  case "$build/" in
    "$repo"/*)
      git -C "$repo" check-ignore -q "$build/" \
        || die "$build is inside the repo but not git-ignored; add it to .gitignore or set TRI_BUILD_DIR" ;;
  esac
fi

# One build at a time per build dir.
mkdir -p "$build" || die "cannot create $build"
exec 9>"$build/.lock"
flock -w 900 9 || die "timed out waiting for the lock on $build (another build running?)"

# ---- up to date? ---------------------------------------------------------------
hash="$( (cd "$pkg" && find . -type f \( -name '*.msg' -o -name '*.srv' -o -name '*.action' \
            -o -name CMakeLists.txt -o -name package.xml -o -name pyproject.toml \) -print0 \
          | LC_ALL=C sort -z | xargs -0 sha256sum; "$py" -VV
        # rebuild when the ROS wheels it was built against change
        cd "$venv" && { ls -d lib/python3*/site-packages/ros_*.dist-info | grep -v tensegrity | LC_ALL=C sort; } || true
       ) | sha256sum | cut -c1-16)"
stamp="$venv/.tensegrity_ros_interfaces.stamp"
if [ "${FORCE:-0}" != 1 ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$hash" ] \
   && "$py" -c 'import tensegrity_ros_interfaces.msg as m; m.CableCommand; m.IdentifiedParameters' >/dev/null 2>&1; then
  log "up to date (sources $hash) in $venv; FORCE=1 to rebuild"
  exit 0
fi

# A CMake cache made for another venv/python cannot be reused.
if [ -f "$build/venv" ] && [ "$(cat "$build/venv")" != "$venv" ]; then
  rm -rf "$build/cmake"
fi
rm -rf "$build/dist"
mkdir -p "$build/dist"
echo "$venv" > "$build/venv"

# ---- build the wheel -------------------------------------------------------------
log "building wheel from $pkg (log: $build/build.log)"
if ! "$py" -m pip wheel --no-build-isolation --no-deps --disable-pip-version-check -v \
      -w "$build/dist" "$pkg" -Cbuild-dir="$build/cmake" >"$build/build.log" 2>&1; then
  tail -n 60 "$build/build.log" >&2
  die "wheel build failed; full log: $build/build.log"
fi
shopt -s nullglob
wheels=("$build"/dist/ros_tensegrity_ros_interfaces-*.whl)
[ ${#wheels[@]} -eq 1 ] || die "expected one wheel in $build/dist, found ${#wheels[@]}"

# ---- install into the venv ---------------------------------------------------------
log "installing $(basename "${wheels[0]}") into $venv"
"$py" -m pip install --no-deps --force-reinstall --disable-pip-version-check -q "${wheels[0]}" \
  || die "pip install of ${wheels[0]} failed"

# ---- check ------------------------------------------------------------------------
"$py" -c '
from tensegrity_ros_interfaces.msg import CableCommand, IdentifiedParameters
from rclpy.serialization import serialize_message, deserialize_message
m = CableCommand(cable_names=["c0"], target_rest_lengths=[0.5])
assert deserialize_message(serialize_message(m), CableCommand) == m
IdentifiedParameters()
' || die "installed package does not import/serialize; see $build/build.log"
echo "$hash" > "$stamp"

t_end=$(date +%s.%N)
log "done in $(awk "BEGIN{printf \"%.1f\", $t_end-$t_start}") s"

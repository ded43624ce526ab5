#!/usr/bin/env bash
# SimGrid's Python bindings for asgd.sim, into the active Python (a venv's, or $PYTHON).
#
#   scripts/install_simgrid.sh          Debian/Ubuntu's binary package python3-simgrid
#                                       (SimGrid 3.32 on Debian 12, built for its Python
#                                       3.11): apt-get installs it (seconds), then only its
#                                       module is linked into this Python's site-packages,
#                                       with a dist-info so pip counts `simgrid` as
#                                       installed (the `sim` extra is then satisfied).
#   scripts/install_simgrid.sh --pypi   pip install simgrid: PyPI's source package, built
#                                       with CMake (g++, cmake and boost headers from
#                                       apt-get; pybind11 < 3, which its bindings
#                                       need); about 25 minutes on 2 cores.
#
# Measured on a 2-core Debian 12 machine: apt 3-10 s (python3-simgrid and its libraries,
# about 13 MB), the --pypi build about 25 min. asgd works without SimGrid: only asgd.sim
# and its tests need it (the tests skip, saying why, where it is missing).
# Needs root for apt-get (or sudo). Exit status 0: `import simgrid` works in $PYTHON.
set -euo pipefail
PY=${PYTHON:-python}
mode=apt
case "${1:-}" in
  --pypi) mode=pypi ;;
  ""|--apt) ;;
  -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
  *) echo "usage: $0 [--apt|--pypi]" >&2; exit 2 ;;
esac
say() { echo "install_simgrid: $*" >&2; }
if "$PY" -c 'import simgrid' > /dev/null 2>&1; then
  say "simgrid already importable in $("$PY" -c 'import sys; print(sys.executable)')"
  exit 0
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then
  if command -v sudo > /dev/null; then SUDO=sudo; else say "not root and no sudo: cannot apt-get"; exit 1; fi
fi
apt_install() {
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" \
    > /tmp/install-simgrid-apt.log 2>&1 \
  || { $SUDO apt-get update -qq >> /tmp/install-simgrid-apt.log 2>&1 && \
       $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" \
         >> /tmp/install-simgrid-apt.log 2>&1; }
}
if [ "$mode" = pypi ]; then
  command -v apt-get > /dev/null && { apt_install cmake g++ libboost-dev || say "apt-get failed (see /tmp/install-simgrid-apt.log)"; }
  # simgrid 4.1's bindings do not compile with pybind11 3.x (its build dependency, unpinned)
  constraints=$(mktemp); echo "pybind11<3" > "$constraints"
  PIP_CONSTRAINT="$constraints" "$PY" -m pip install simgrid
  rm -f "$constraints"
  exec "$PY" -c 'import simgrid; print("simgrid", simgrid.simgrid_version)'
fi
command -v apt-get > /dev/null || { say "no apt-get here: use --pypi (a source build)"; exit 1; }
if ! dpkg -s python3-simgrid > /dev/null 2>&1; then
  apt_install python3-simgrid || { say "apt-get install python3-simgrid failed (see /tmp/install-simgrid-apt.log)"; exit 1; }
fi
suffix=$("$PY" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
so=$(dpkg -L python3-simgrid | grep -E "/simgrid[^/]*\.so$" | head -n 1)
if [ -z "$so" ]; then say "python3-simgrid has no Python module?"; exit 1; fi
case "$so" in
  *"$suffix") ;;
  *) say "Debian's module ($(basename "$so")) is not built for this Python ($suffix): use --pypi"; exit 1 ;;
esac
site=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])')
version=$(dpkg-query -W -f='${Version}' python3-simgrid | sed -E 's/^([0-9.]+).*/\1/')
ln -sf "$so" "$site/$(basename "$so")"
info="$site/simgrid-$version.dist-info"   # pip now counts simgrid as installed (the `sim` extra)
mkdir -p "$info"
printf 'Metadata-Version: 2.1\nName: simgrid\nVersion: %s\nSummary: SimGrid %s from the Debian package python3-simgrid, linked by asgd scripts/install_simgrid.sh\n' \
  "$version" "$version" > "$info/METADATA"
echo "asgd-install_simgrid.sh (Debian python3-simgrid)" > "$info/INSTALLER"
printf '%s,,\n' "$(basename "$so")" "simgrid-$version.dist-info/METADATA" "simgrid-$version.dist-info/INSTALLER" \
  "simgrid-$version.dist-info/RECORD" > "$info/RECORD"
"$PY" -c 'import simgrid; print("simgrid", simgrid.simgrid_version, "from", simgrid.__file__)' 2> /dev/null

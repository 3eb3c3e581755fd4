#!/usr/bin/env bash
# One libstdc++ per process (cmake/SharedLibstdcxx.cmake): every library Tessera builds needs the
# shared libstdc++.so.6 and carries no copy of it. A GCC that links libstdc++ statically (the GPU
# machine's) gave libtessera and the Python extension partial copies, and the extension crashed
# in its first `ostream << long`. The check itself is tested: a library built here with
# -static-libstdc++ must be flagged, and one built with the same flags plus the CMake option's
# linker arguments must pass.
#   one_libstdcxx_test.sh CXX LIBRARY...
set -uo pipefail
cxx=$1; shift
fails=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

problem() {  # library -> "" when it has one shared libstdc++, else why not
  local lib=$1
  local dyn syms  # whole outputs first: grep -q would close a pipe early (SIGPIPE under pipefail)
  dyn=$(readelf -d "$lib" 2> /dev/null)
  grep -q 'NEEDED.*\[libstdc++\.so\.6\]' <<< "$dyn" || { echo "does not need libstdc++.so.6"; return; }
  syms=$(nm -D --defined-only "$lib" 2> /dev/null)
  local own; own=$(grep -c -E ' (_ZNSo9_M_insertIlEERSoT_|_ZNSt6locale7classicEv)$' <<< "$syms")
  [ "$own" = 0 ] || echo "defines libstdc++'s own symbols (a static copy)"
}

cat > "$tmp/s.cc" << 'CC'
#include <sstream>
#include <string>
std::string shape_str(long n) { std::ostringstream o; o << n; return o.str(); }
CC
if "$cxx" -shared -fPIC -static-libstdc++ -o "$tmp/static.so" "$tmp/s.cc" 2> "$tmp/err"; then
  [ -n "$(problem "$tmp/static.so")" ] || { echo "FAIL: a -static-libstdc++ library was not flagged"; fails=$((fails + 1)); }
  "$cxx" -shared -fPIC -static-libstdc++ -Wl,--push-state,--no-as-needed,-l:libstdc++.so.6,--pop-state \
    -o "$tmp/fixed.so" "$tmp/s.cc" || { echo "FAIL: the CMake option's linker arguments do not link"; fails=$((fails + 1)); }
  why=$(problem "$tmp/fixed.so")
  [ -z "$why" ] || { echo "FAIL: -static-libstdc++ plus libstdc++.so.6 first: $why"; fails=$((fails + 1)); }
else
  echo "note: $cxx cannot link -static-libstdc++ here (no libstdc++.a): the check's own test is skipped"
fi

for lib in "$@"; do
  why=$(problem "$lib")
  if [ -n "$why" ]; then echo "FAIL: $lib $why"; fails=$((fails + 1)); else echo "ok: $lib"; fi
done
[ $fails = 0 ] && echo "one_libstdcxx_test: all passed"
[ $fails = 0 ]

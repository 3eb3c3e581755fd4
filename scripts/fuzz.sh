#!/usr/bin/env bash
# Fuzzes every parser that reads outside data with libFuzzer (clang's), under AddressSanitizer
# and UndefinedBehaviorSanitizer.
#
#   bash scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]
#
# SECONDS_PER_TARGET defaults to 60; TARGET is one of the names below (default: all). Builds
# build/fuzz (clang, TESSERA_FUZZ=ON, no CUDA, no CPU backend, no tests; the CLI subcommands for
# the cli_run target), then runs each
# target from its seed corpus tests/fuzz/corpus/<target> (kept small, in the repository). New
# inputs go to build/fuzz/corpus/<target>, findings to build/fuzz/artifacts/<target>/. Prints,
# per target: inputs tried, crashes (any crash, sanitizer report, timeout or out-of-memory), and
# the time; exits non-zero when any target found anything. A finding reproduces with
#   build/fuzz/fuzz/tessera_fuzz_<target> build/fuzz/artifacts/<target>/<file>
# (Do not edit this script while it runs: bash reads it as it goes.)
# and becomes a regression test (tests/fuzz/regressions/<target>/ and a unit test).
#
# Environment: CXX (default clang++), FUZZ_BUILD_DIR (default build/fuzz), FUZZ_JOBS (build
# jobs, default 2), FUZZ_RSS_MB (default 2048), FUZZ_TIMEOUT_S (one input, default 10).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

all_targets=(npy cache roofline bench_report grid cli_run)
secs=${1:-60}
shift || true
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=("${all_targets[@]}")
for t in "${targets[@]}"; do
  case " ${all_targets[*]} " in *" $t "*) ;; *) echo "fuzz.sh: unknown target '$t' (known: ${all_targets[*]})" >&2; exit 2 ;; esac
done

# Debian's clang and its runtimes (libFuzzer, ASan, UBSan), when missing.
if [ -z "${CXX:-}" ]; then bash scripts/install_deps.sh --clang; else bash scripts/install_deps.sh; fi
cxx=${CXX:-clang++}
build=${FUZZ_BUILD_DIR:-build/fuzz}
case "$build" in /*) ;; *) build="$root/$build" ;; esac
if [ ! -f "$build/build.ninja" ] && [ ! -f "$build/Makefile" ]; then
  gen=()
  command -v ninja >/dev/null && gen=(-G Ninja)
  cmake -S . -B "$build" "${gen[@]}" -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DTESSERA_FUZZ=ON -DTESSERA_SANITIZE=ON -DTESSERA_CUDA=OFF -DTESSERA_CPU_BACKEND=OFF \
    -DTESSERA_BUILD_TESTS=OFF -DTESSERA_BUILD_TOOLS=ON >/dev/null
fi
names=()
for t in "${targets[@]}"; do names+=("tessera_fuzz_$t"); done
cmake --build "$build" -j "${FUZZ_JOBS:-2}" --target "${names[@]}"

export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=0:detect_leaks=1:allocator_may_return_null=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export TESSERA_LOG_LEVEL=error  # expected warnings (corrupt cache entries) would flood the log

status=0
summary=()
for t in "${targets[@]}"; do
  bin="$build/fuzz/tessera_fuzz_$t"
  seeds="$root/tests/fuzz/corpus/$t"
  regressions=()  # past findings run first too: one that crashes again is a finding
  [ -d "$root/tests/fuzz/regressions/$t" ] && regressions=("$root/tests/fuzz/regressions/$t")
  work="$build/corpus/$t"
  art="$build/artifacts/$t"
  log="$build/logs/$t.log"
  mkdir -p "$work" "$art" "$(dirname "$log")"
  before=$(find "$art" -type f | wc -l)
  start=$(date +%s.%N)
  rc=0
  # Run from an empty scratch directory: nothing a target does lands in the repository.
  scratch=$(mktemp -d)
  (cd "$scratch" && "$bin" -max_total_time="$secs" -timeout="${FUZZ_TIMEOUT_S:-10}" \
      -rss_limit_mb="${FUZZ_RSS_MB:-2048}" -print_final_stats=1 -artifact_prefix="$art/" \
      "$work" "$seeds" "${regressions[@]}") >"$log" 2>&1 || rc=$?
  rm -rf "$scratch"
  end=$(date +%s.%N)
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  after=$(find "$art" -type f | wc -l)
  found=$((after - before))
  [ "$rc" -ne 0 ] && [ "$found" -eq 0 ] && found=1  # died without an artifact: still a finding
  elapsed=$(awk -v a="$start" -v b="$end" 'BEGIN{printf "%.0f", b - a}')
  line=$(printf '%-13s inputs %-10s crashes %-3s time %ss  corpus %s' "$t" "${execs:-?}" "$found" "$elapsed" \
         "$(find "$work" "$seeds" -type f | wc -l)")
  echo "$line"
  summary+=("$line")
  if [ "$found" -ne 0 ]; then
    status=1
    echo "  FINDING: see $log and $art/" >&2
    grep -m 5 -E "ERROR: |runtime error|SUMMARY|deadly signal|uncaught|terminate" "$log" | sed 's/^/  /' >&2 || true
  fi
done
echo "---- fuzz summary (${secs}s per target) ----"
printf '%s\n' "${summary[@]}"
exit $status

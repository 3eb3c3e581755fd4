#!/usr/bin/env bash
# scripts/gpu_check.sh on a machine without a GPU (or told to act so: GPU_CHECK_NO_GPU=1, so the
# test means the same on the GPU machine): usage errors exit 2, every stage stops at the preflight
# with "no NVIDIA GPU is present", exit 3 and a summary.md saying so, --help tells the stage
# sequence, --plan shows the bench runs discovered from `tessera list` with BENCH_SHAPES split
# into one --shape per B x H x V (the old ${BENCH_SHAPES//x/,} made one six-dim shape), and on a
# fake GPU machine the test stage's steps, timeouts, per-suite processes and summary.
#   gpu_check_test.sh SOURCE_DIR TESSERA_CLI
set -uo pipefail
src=$1 cli=$2
script=$src/scripts/gpu_check.sh
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
expect_rc() {  # expected actual what
  [ "$1" = "$2" ] || fail "$3: exit $2, expected $1"
}

out=$(bash "$script" --help 2>&1); rc=$?
expect_rc 0 $rc "--help"
echo "$out" | grep -q -- "--stage build" || fail "--help does not show --stage build"
order=$(echo "$out" | grep -oE -- "--stage (build|test|sanitize|bench|all)" | awk '!seen[$0]++' | tr '\n' ' ')
[ "$order" = "--stage build --stage test --stage sanitize --stage bench --stage all " ] ||
  fail "--help tells the stages in the order '$order'"

out=$(bash "$script" 2>&1); expect_rc 2 $? "no --stage"
echo "$out" | grep -q "stage build|test|sanitize|bench|profile|all is required" || fail "no --stage: message '$out'"
out=$(bash "$script" --stage nope 2>&1); expect_rc 2 $? "--stage nope"
echo "$out" | grep -q "unknown stage 'nope'" || fail "--stage nope: message '$out'"
out=$(bash "$script" --stage build --bogus 2>&1); expect_rc 2 $? "--bogus"

for stage in build test sanitize bench all; do
  d=$tmp/$stage
  out=$(GPU_CHECK_NO_GPU=1 bash "$script" --stage "$stage" --out "$d" 2>&1); rc=$?
  expect_rc 3 $rc "--stage $stage without a GPU"
  echo "$out" | grep -q "no NVIDIA GPU is present (GPU_CHECK_NO_GPU=1): stage '$stage' needs one" ||
    fail "--stage $stage: message '$out'"
  [ -f "$d/summary.md" ] || { fail "--stage $stage: no summary.md"; continue; }
  grep -q "| $stage | preflight | NO GPU" "$d/summary.md" || fail "--stage $stage: summary.md lacks the preflight row"
  grep -q "no NVIDIA GPU is present" "$d/summary.md" || fail "--stage $stage: summary.md lacks the note"
  [ ! -e "$d/build.log" ] || fail "--stage $stage: something was built"
done

# --plan: the bench stage's runs, discovered (needs no GPU and no GPU build).
cli_list=$("$cli" list 2>/dev/null)  # whole first: grep -q's early exit would SIGPIPE the writer (pipefail)
if grep -qE '^  cuda ' <<< "$cli_list"; then
  out=$(TESSERA_BIN=$cli BENCH_SHAPES=64x32x1000,128x16x2000 bash "$script" --stage bench --plan --out "$tmp/plan" 2>&1)
  expect_rc 0 $? "--plan"
  echo "$out" | grep -q -- "bench linear_cross_entropy --impl cuda[, ].*--shape 64,32,1000 --shape 128,16,2000 " ||
    fail "--plan: BENCH_SHAPES not split into two shapes: $(echo "$out" | grep 'bench linear')"
  for k in $("$cli" list 2>/dev/null | awk '/^[^ ]/ {k = $1} /^  (cuda|cudnn)/ {print k}' | sort -u); do
    echo "$out" | grep -q -- "bench $k --impl " || fail "--plan: kernel $k with a GPU implementation is not benched"
  done
  echo "$out" | grep -q -- "bench attention --impl .*--causal" || fail "--plan: no causal attention run"
  out=$(TESSERA_BIN=$cli BENCH_KERNELS="paged_attention|mla_decode" bash "$script" --stage bench --plan --out "$tmp/plan2" 2>&1)
  expect_rc 0 $? "--plan, BENCH_KERNELS"
  echo "$out" | grep -q -- "bench mla_decode --impl " || fail "BENCH_KERNELS: mla_decode not benched"
  echo "$out" | grep -q -- "bench paged_attention --impl " || fail "BENCH_KERNELS: paged_attention not benched"
  ! grep -qE -- "bench (attention|linear_cross_entropy|grouped_matmul|mlstm|slstm) |peers" <<< "$out" ||
    fail "BENCH_KERNELS: a kernel not named, or a peer, ran: $(echo "$out" | grep -E 'bench (att|lin|gro|ml|sl)|peers')"
  out=$(TESSERA_BIN=$cli BENCH_KERNELS="paged" bash "$script" --stage bench --plan --out "$tmp/plan3" 2>&1)
  expect_rc 0 $? "--plan, BENCH_KERNELS matching no whole name (--plan exits 0)"
  grep -q "BENCH_KERNELS='paged' matches no kernel" "$tmp/plan3/summary.notes" || fail "BENCH_KERNELS: no note for a name that matches none"
  # --stage profile: ncu (clocks left alone) on every GPU implementation of the kernels named.
  out=$(TESSERA_BIN=$cli bash "$script" --stage profile --plan --out "$tmp/plan5" 2>&1)
  expect_rc 0 $? "--plan, profile"
  out5=$out
  grep -q -- "bench paged_attention --impl [a-z_0-9]* --shape 64,8192,1,32,128 --dtype bf16 " <<< "$out" ||
    fail "profile: paged_attention not on the gpu grid's first shape: $out"
  for k in paged_attention mla_decode; do
    for i in $("$cli" list 2>/dev/null | awk -v k=$k '/^[^ ]/ {c = $1} c == k && /^  (cuda|cudnn)/ {print $1}'); do
      echo "$out" | grep -q -- "ncu --clock-control none .* bench $k --impl $i " || fail "profile: $k $i not profiled: $out"
    done
  done
  ! grep -qE -- "bench (attention|linear_cross_entropy|grouped_matmul|mlstm|slstm) " <<< "$out" ||
    fail "profile: a kernel not named by the default PROFILE_KERNELS was profiled"
  out=$(TESSERA_BIN=$cli PROFILE_KERNELS=mlstm PROFILE_LAUNCHES=2 PROFILE_SECTIONS="SpeedOfLight" bash "$script" --stage profile \
    --plan --out "$tmp/plan6" 2>&1)
  expect_rc 0 $? "--plan, profile with PROFILE_*"
  grep -q -- "--launch-count 2 --section SpeedOfLight .*bench mlstm --impl cuda " <<< "$out" ||
    fail "profile: PROFILE_KERNELS / PROFILE_LAUNCHES / PROFILE_SECTIONS not taken: $out"
  # A grid run is profiled on the grid's first shape only (the rest would use up the step's time).
  ! grep -q -- "ncu .*--grid" <<< "$(cat "$tmp/plan5"/*.log "$tmp/plan5"/summary* 2>/dev/null; echo "$out5")" ||
    fail "profile: a whole grid under ncu"

else
  echo "note: $cli lists no cuda implementation (CPU-only build): --plan not checked"
fi

# A fake GPU machine (fake nvidia-smi, cmake and test binaries): the test stage runs each GPU
# suite in its own process, records every step, counts the suites' JSON in summary.md, fails on a
# failing suite, and packs the archive; then a step past its timeout is recorded as such and the
# steps after the stage's budget as skipped.
fake=$tmp/fake
mkdir -p "$fake/bin" "$fake/build/tests" "$fake/deps/usr"
touch "$fake/build/build.ninja"
printf '#!/bin/bash\necho "GPU 0: Fake GPU (UUID: GPU-0)"\n' > "$fake/bin/nvidia-smi"
printf '#!/bin/bash\necho "fake cmake $*"\n' > "$fake/bin/cmake"
cat > "$fake/build/tests/tessera_tests" <<'FAKE'
#!/bin/bash
sleep "${FAKE_CPU_SLEEP:-0}"
echo '{"tests":1,"failures":0,"testsuites":[{"name":"Cpu","testsuite":[{"name":"t","result":"COMPLETED"}]}]}' > "${1#--gtest_output=json:}"
FAKE
cat > "$fake/build/tests/tessera_cuda_tests" <<'FAKE'
#!/bin/bash
if [ "$1" = --gtest_list_tests ]; then  # --gtest_filter=SUITE.*-NEG: SUITE alone, none if NEG names SUITE.*
  f=${2#--gtest_filter=}; pos=${f%%-*}; neg=${f#*-}; [ "$f" = "$neg" ] && neg=""
  for t in 'FakeA.\n  one' 'Grid/FakeB.\n  p/0  # GetParam() = 0'; do
    suite=${t%%.*}
    [ -n "${2:-}" ] && { [ "$pos" = "$suite.*" ] || continue; [[ ":$neg:" == *":$suite.*:"* ]] && continue; }
    printf "$t\n"
  done; exit 0
fi
suite=${1#--gtest_filter=}; suite=${suite%.\*}; json=${2#--gtest_output=json:}
[ "$TESSERA_CUDA_SYNC_CHECK" = 1 ] && [ "$TESSERA_AUTOTUNE" = 0 ] || { echo "env not set"; exit 5; }
if [ "$suite" = Grid/FakeB ]; then
  sleep "${FAKE_GPU_SLEEP:-0}"
  echo '{"testsuites":[{"name":"Grid/FakeB","testsuite":[{"name":"p/0","result":"COMPLETED","failures":[{"failure":"boom at x.cc:1"}]}]}]}' > "$json"
  exit 1
fi
echo '{"testsuites":[{"name":"FakeA","testsuite":[{"name":"one","result":"SKIPPED"}]}]}' > "$json"
FAKE
chmod +x "$fake"/bin/* "$fake"/build/tests/*
run_fake() {  # out-dir extra-env...
  local d=$1; shift
  env PATH="$fake/bin:$PATH" GPU_CHECK_BUILD_DIR="$fake/build" GPU_CHECK_DEPS_DIR="$fake/deps" GPU_CHECK_PYTHON=0 "$@" \
    bash "$script" --stage test --out "$d" --archive "$d.tgz" 2>&1
}
out=$(run_fake "$tmp/fake1"); rc=$?
expect_rc 1 $rc "fake GPU, one failing suite"
sum=$tmp/fake1/summary.md
for want in "| test | build | ok |" "| test | tests FakeA | ok |" "| test | tests Grid/FakeB | FAILED (exit 1) |" \
            "| FakeA | 1 | 0 | 1 |" "| Grid_FakeB | 1 | 1 | 0 |" "| cpu | 1 | 0 | 0 |" "- FAILED Grid/FakeB.p/0: boom at x.cc:1"; do
  grep -qF -- "$want" "$sum" || fail "fake GPU: summary.md lacks '$want'"
done
tar -tzf "$tmp/fake1.tgz" | grep -q "fake1/summary.md" || fail "fake GPU: the archive lacks summary.md"
out=$(run_fake "$tmp/fake2" FAKE_GPU_SLEEP=30 STAGE_BUDGET_S=22); rc=$?
expect_rc 1 $rc "fake GPU, a step past its timeout"
grep -qE "\| test \| tests Grid/FakeB \| TIMEOUT \(1[0-7]s\) \|" "$tmp/fake2/summary.md" || fail "no TIMEOUT row: $(cat "$tmp/fake2/summary.md")"
grep -q "| test | tests (CPU suite) | SKIPPED (stage budget of 22s spent) |" "$tmp/fake2/summary.md" ||
  fail "no skipped row after the budget: $(grep '| test |' "$tmp/fake2/summary.md")"
grep -q "| test | tests FakeA | ok |" "$tmp/fake2/summary.md" || fail "the GPU suites did not run first"

# The sanitize stage on the fake machine (a fake compute-sanitizer that logs its arguments):
# initcheck runs without the kernel filter (it does not see the stores of kernels left out),
# the others with it; initcheck and racecheck run one process per suite; a slow suite is cut by the tool's share
# and the suites after it are recorded as skipped.
cat > "$fake/bin/compute-sanitizer" <<'FAKE'
#!/bin/bash
if [ "$1" = --help ]; then echo "  --kernel-name arg"; echo "  --require-cuda-init arg (=yes)"; exit 0; fi
echo "ARGS $*"
case "$*" in *racecheck*Grid/FakeB*) sleep "${FAKE_RACE_SLEEP:-0}" ;; esac
if [ -n "${FAKE_TOOL_FAULT:-}" ]; then
  printf '[ RUN      ] Grid/FakeB.p/9\n[       OK ] Grid/FakeB.p/9 (1 ms)\n[ RUN      ] Grid/FakeB.p/0\n'
  printf '========= Internal Sanitizer Error: The Sanitizer failed to handle a hardware exception.\n'; exit 3
fi
echo "========= ERROR SUMMARY: 0 errors"
FAKE
chmod +x "$fake/bin/compute-sanitizer"
run_sanitize() {  # out-dir extra-env...
  local d=$1; shift
  env PATH="$fake/bin:$PATH" GPU_CHECK_BUILD_DIR="$fake/build" GPU_CHECK_DEPS_DIR="$fake/deps" "$@" \
    bash "$script" --stage sanitize --out "$d" 2>&1
}
out=$(run_sanitize "$tmp/san1" SANITIZE_TOOLS="memcheck initcheck racecheck"); rc=$?
expect_rc 0 $rc "fake sanitize: $out"
grep -q -- "--kernel-name kns=tessera" "$tmp/san1/sanitize/memcheck.log" || fail "memcheck without the kernel filter"
grep -q -- "--kernel-name" "$tmp/san1/sanitize/initcheck/FakeA.log" && fail "initcheck with the kernel filter"
grep -q -- "--gtest_filter=Grid/FakeB\.\*-" "$tmp/san1/sanitize/initcheck/Grid_FakeB.log" || fail "initcheck: one process per suite"
grep -q -- "--gtest_filter=FakeA\.\*-" "$tmp/san1/sanitize/racecheck/FakeA.log" || fail "racecheck FakeA: $(cat "$tmp/san1/sanitize/racecheck/FakeA.log" 2>&1)"
grep -q -- "--gtest_filter=Grid/FakeB\.\*-" "$tmp/san1/sanitize/racecheck/Grid_FakeB.log" || fail "racecheck Grid/FakeB: one process per suite"
grep -q -- "--require-cuda-init no" "$tmp/san1/sanitize/initcheck/FakeA.log" || fail "initcheck: a host-only suite would exit 255"
grep -q -- ":Chunks/LceCudaChunks\.\*" "$tmp/san1/sanitize/racecheck/FakeA.log" || fail "racecheck without the settled LCE suites excluded"
grep -q -- "LceCudaChunks" "$tmp/san1/sanitize/memcheck.log" && fail "memcheck lost the LCE suites (settled for initcheck/racecheck only)"
# A suite whose every test is excluded for a tool is skipped, not run (it would exit 255 without
# a CUDA call); the tool's own hardware-exception fault is named as such.
out=$(run_sanitize "$tmp/san3" SANITIZE_TOOLS="racecheck" SANITIZE_EXCLUDE_racecheck='FakeA.*' FAKE_TOOL_FAULT=1); rc=$?
expect_rc 1 $rc "fake sanitize, the tool faults"
grep -q "| sanitize | compute-sanitizer racecheck FakeA | SKIPPED (every test excluded) |" "$tmp/san3/summary.md" ||
  fail "an all-excluded suite was not skipped: $(grep '| sanitize |' "$tmp/san3/summary.md")"
grep -q "racecheck Grid/FakeB: the tool faulted in Grid/FakeB.p/0" "$tmp/san3/summary.notes" ||
  fail "no note of the tool's fault: $(cat "$tmp/san3/summary.notes" 2>&1)"
# SANITIZE_SUITES: only the suites named (the whole-binary tools through the filter's positive part);
# a name that is no GPU suite fails the stage before any tool runs.
out=$(run_sanitize "$tmp/san4" SANITIZE_TOOLS="memcheck racecheck" SANITIZE_SUITES="Grid/FakeB"); rc=$?
expect_rc 0 $rc "fake sanitize, SANITIZE_SUITES: $out"
[ -f "$tmp/san4/sanitize/racecheck/Grid_FakeB.log" ] || fail "SANITIZE_SUITES: the named suite did not run"
[ ! -e "$tmp/san4/sanitize/racecheck/FakeA.log" ] || fail "SANITIZE_SUITES: a suite not named ran"
grep -q -- "--gtest_filter=Grid/FakeB\.\*-" "$tmp/san4/sanitize/memcheck.log" ||
  fail "SANITIZE_SUITES: memcheck's filter $(grep -o -- '--gtest_filter=[^ ]*' "$tmp/san4/sanitize/memcheck.log")"
out=$(run_sanitize "$tmp/san5" SANITIZE_TOOLS="racecheck" SANITIZE_SUITES="FakeA Grid/Nope"); rc=$?
expect_rc 1 $rc "fake sanitize, SANITIZE_SUITES names no suite"
grep -q "SANITIZE_SUITES names 'Grid/Nope', which is no GPU suite" "$tmp/san5/summary.notes" ||
  fail "SANITIZE_SUITES misspelt: $(cat "$tmp/san5/summary.notes" 2>&1)"
[ ! -e "$tmp/san5/sanitize/racecheck/FakeA.log" ] || fail "SANITIZE_SUITES misspelt: a tool ran anyway"
out=$(run_sanitize "$tmp/san2" SANITIZE_TOOLS="racecheck" FAKE_RACE_SLEEP=60 STAGE_BUDGET_S=40); rc=$?
expect_rc 1 $rc "fake sanitize, a suite past the tool's share"
grep -qE "\| sanitize \| compute-sanitizer racecheck Grid/FakeB \| TIMEOUT" "$tmp/san2/summary.md" ||
  fail "no TIMEOUT row for the slow suite: $(grep '| sanitize |' "$tmp/san2/summary.md")"

# --stage all --deadline S: the four stages in one call, in order (what a short GPU lease runs).
out=$(bash "$script" --stage all --deadline 2>&1); expect_rc 2 $? "--deadline without a value"
out=$(TESSERA_BIN=$cli bash "$script" --stage all --deadline 300 --plan --out "$tmp/plan_all" 2>&1)
expect_rc 0 $? "--stage all --deadline --plan"
order=$(echo "$out" | grep -oE '^\[(build|test|sanitize|bench)\]' | awk '!seen[$0]++' | tr '\n' ' ')
[ "$order" = "[build] [test] [sanitize] [bench] " ] || fail "--stage all --deadline: stages in the order '$order'"

out=$(bash "$script" --stage test --deadline 300 2>&1); expect_rc 2 $? "--deadline without --stage all"
out=$(STAGE_CAPS="build:240 tset:100" bash "$script" --stage all --deadline 300 2>&1); expect_rc 2 $? "a misspelt STAGE_CAPS stage"
echo "$out" | grep -q "STAGE_CAPS entry 'tset:100'" || fail "misspelt STAGE_CAPS: message '$out'"

[ $fails = 0 ] && echo "gpu_check_test: all passed"
exit $((fails > 0))

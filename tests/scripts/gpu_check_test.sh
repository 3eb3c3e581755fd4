#!/usr/bin/env bash
# scripts/gpu_check.sh on a machine without a GPU (or told to act so: GPU_CHECK_NO_GPU=1, so the
# test means the same on the GPU machine): usage errors exit 2, every stage stops at the preflight
# with "no NVIDIA GPU is present", exit 3 and a summary.md saying so, --help tells the stage
# sequence, and --plan shows the bench runs discovered from `tessera list` with BENCH_SHAPES
# split into one --shape per B x H x V (the old ${BENCH_SHAPES//x/,} made one six-dim shape).
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
echo "$out" | grep -q "stage build|test|sanitize|bench|all is required" || fail "no --stage: message '$out'"
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
if "$cli" list 2>/dev/null | grep -qE '^  cuda '; then
  out=$(TESSERA_BIN=$cli BENCH_SHAPES=64x32x1000,128x16x2000 bash "$script" --stage bench --plan --out "$tmp/plan" 2>&1)
  expect_rc 0 $? "--plan"
  echo "$out" | grep -q -- "bench linear_cross_entropy --impl cuda[, ].*--shape 64,32,1000 --shape 128,16,2000 " ||
    fail "--plan: BENCH_SHAPES not split into two shapes: $(echo "$out" | grep 'bench linear')"
  for k in $("$cli" list 2>/dev/null | awk '/^[^ ]/ {k = $1} /^  (cuda|cudnn)/ {print k}' | sort -u); do
    echo "$out" | grep -q -- "bench $k --impl " || fail "--plan: kernel $k with a GPU implementation is not benched"
  done
  echo "$out" | grep -q -- "bench attention --impl .*--causal" || fail "--plan: no causal attention run"
else
  echo "note: $cli lists no cuda implementation (CPU-only build): --plan not checked"
fi

[ $fails = 0 ] && echo "gpu_check_test: all passed"
exit $((fails > 0))

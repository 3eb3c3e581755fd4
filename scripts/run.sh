#!/usr/bin/env bash
# The main job: build the CLI if needed, then check and benchmark every kernel on this machine.
# Results go to out/: roofline.json, bench_<kernel>.{json,csv} and one report.html for all. Options:
#   --grid NAME   the benchmark grid of each kernel's bench/<kernel>.json (default: cpu; smoke is
#                 quick). A kernel without that grid runs its CPU grids (paged_attention: decode
#                 and mixed) for cpu, and is skipped, saying so, for any other name.
set -euo pipefail
cd "$(dirname "$0")/.."
grid=cpu
[ "${1:-}" = "--grid" ] && grid=${2:?--grid needs a name}
bash scripts/install_deps.sh
cmake --preset release >/dev/null
# Only what runs: the CLI (and the CUDA module where nvcc built one), not the tests.
targets=(tessera)
if grep -q '^build tessera_cuda: ' build/release/build.ninja; then targets+=(tessera_cuda); fi
cmake --build --preset release -j "$(nproc)" --target "${targets[@]}"
tessera=build/release/bin/tessera
mkdir -p out
echo "== implementations"
$tessera list
echo "== parity against the reference (every kernel)"
$tessera check
echo "== this machine's ceilings"
$tessera roofline --out out/roofline.json
# The grids of a kernel's bench file to run for $grid.
grids_for() {
  python3 - "$1" "$grid" <<'PY'
import json, sys
grids = json.load(open(f"bench/{sys.argv[1]}.json"))["grids"]
names = list(grids) if isinstance(grids, dict) else [g["name"] for g in grids]
want = sys.argv[2]
if want in names:
    print(want)
elif want == "cpu":
    print(" ".join(n for n in names if n not in ("smoke", "gpu", "reference", "llm")))
PY
}
reports=()
for file in bench/*.json; do
  kernel=$(basename "$file" .json)
  gs=$(grids_for "$kernel")
  if [ -z "$gs" ]; then echo "== $kernel: no grid '$grid' in $file, skipped"; continue; fi
  for g in $gs; do
    name=$kernel; [ "$g" = "$grid" ] || name=${kernel}_$g
    echo "== benchmark $kernel (grid: $g)"
    $tessera bench "$kernel" --grid "$g" --compare --roofline out/roofline.json \
      --json "out/bench_$name.json" --csv "out/bench_$name.csv"
    reports+=("out/bench_$name.json")
  done
done
$tessera report "${reports[@]}" -o out/report.html
echo "wrote out/roofline.json, ${reports[*]} (and .csv), out/report.html"

#!/usr/bin/env bash
# The main job: build if needed, then check and benchmark the kernels on this machine.
# Results go to out/ (roofline.json, bench.json/.csv, report.html). Options:
#   --grid NAME   benchmark grid from bench/linear_cross_entropy.json (default: cpu; smoke is quick)
set -euo pipefail
cd "$(dirname "$0")/.."
grid=cpu
[ "${1:-}" = "--grid" ] && grid=${2:?--grid needs a name}
bash scripts/install_deps.sh
cmake --preset release >/dev/null
cmake --build --preset release -j "$(nproc)"
tessera=build/release/bin/tessera
mkdir -p out
echo "== implementations"
$tessera list
echo "== parity against the reference (every kernel)"
$tessera check
echo "== this machine's ceilings"
$tessera roofline --out out/roofline.json
echo "== benchmark (grid: $grid)"
$tessera bench linear_cross_entropy --grid "$grid" --compare --roofline out/roofline.json \
  --json out/bench.json --csv out/bench.csv
$tessera report out/bench.json -o out/report.html
echo "wrote out/roofline.json out/bench.json out/bench.csv out/report.html"

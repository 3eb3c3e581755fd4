#!/usr/bin/env bash
# GPU machine check of every CUDA implementation, in one go: configure + build (preset gpu), run
# the test suites (every GPU test), the GPU tests again under compute-sanitizer (memcheck,
# racecheck, initcheck; the large-shape test excluded), the measured GPU ceilings, `tessera bench`
# of every cuda implementation of every kernel (timed with CUDA events through the device hooks)
# with the PyTorch eager baseline as peers, and write the results to docs/gpu_results/<stamp>/
# (or the directory given as $1):
#   env.txt  build.log  tests.{log,json}  tests_cuda.{log,json}  sanitizer_<tool>.log  torch.json
#   roofline.{json,log}  tessera_bench.{json,csv,log}  report.html  summary.md
#   gmm_bench_{balanced,skewed}.{json,log}  torch_gmm.{json,log}  torch_gmm_peers.json
#   attention_bench{,_causal}.{json,csv,log}  attention_report{,_causal}.html
#   torch_attention{,_causal}.json (+ _peers.json)
#
# Needs: an NVIDIA GPU + driver, nvcc, CMake >= 3.25, ninja, python3 with PyTorch (for the
# baseline; skipped with a note when missing). No network: nlohmann-json, CLI11, fmt and GTest come
# from the carried .deps/ folder made on the dev machine by scripts/pack_gpu_deps.sh.
# Env: CUDA_ARCHS (default "90a-real;80-virtual"), BENCH_SHAPES, BENCH_ITERS, JOBS,
#      ATTN_SHAPES (attention B,S,H,D; default 4,4096,16,128: the issue's H100 row, B·H = 64).
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
stamp=$(date -u +%Y%m%dT%H%M%SZ)
out=${1:-docs/gpu_results/$stamp}
mkdir -p "$out"
out=$(cd "$out" && pwd)
status=0
note() { echo "gpu_check: $*" | tee -a "$out/summary.notes"; }

if [ ! -d "$root/.deps/usr" ]; then
  echo "gpu_check: $root/.deps/usr is missing: run scripts/pack_gpu_deps.sh on the dev machine and carry .deps" >&2
  exit 2
fi
export LD_LIBRARY_PATH="$root/.deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then export PATH=/usr/local/cuda/bin:$PATH; fi

{
  echo "date: $(date -u)"; echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1
  nvcc --version 2>&1 | tail -2; cmake --version | head -1; ninja --version 2>&1
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' 2>&1
} > "$out/env.txt"

jobs=${JOBS:-$(nproc)}
archs=${CUDA_ARCHS:-90a-real;80-virtual}
if ! { cmake --preset gpu -DCMAKE_PREFIX_PATH="$root/.deps/usr" "-DCMAKE_CUDA_ARCHITECTURES=$archs" &&
       cmake --build --preset gpu -j "$jobs"; } > "$out/build.log" 2>&1; then
  note "BUILD FAILED (see build.log)"; tail -30 "$out/build.log"; exit 1
fi

# Each suite in one process (faster than ctest's one process per test). The CUDA module and the
# GPU tests (LceCuda*, DeviceHooksCuda*, CudaModule*) are in tessera_cuda_tests.
if ! build/gpu/tests/tessera_tests --gtest_output="json:$out/tests.json" > "$out/tests.log" 2>&1; then
  note "TESTS FAILED (see tests.log)"; status=1
fi
grep -E "^\[  (PASSED|FAILED|SKIPPED) \]|tests? ran" "$out/tests.log" | tail -20
if ! build/gpu/tests/tessera_cuda_tests --gtest_output="json:$out/tests_cuda.json" > "$out/tests_cuda.log" 2>&1; then
  note "CUDA TESTS FAILED (see tests_cuda.log)"; status=1
fi
grep -E "^\[  (PASSED|FAILED|SKIPPED) \]|tests? ran" "$out/tests_cuda.log" | tail -20

# compute-sanitizer over the GPU tests at small shapes (the float64-oracle test at a large shape
# would take hours under the tools).
san_filter='LceCuda*:AttentionCuda*:GroupedMatmulCuda*:CudaModule*:DeviceHooksCuda*:-*LargeShape*'
if command -v compute-sanitizer >/dev/null 2>&1; then
  for tool in memcheck racecheck initcheck; do
    if ! compute-sanitizer --tool "$tool" --error-exitcode 3 build/gpu/tests/tessera_cuda_tests \
         --gtest_filter="$san_filter" > "$out/sanitizer_$tool.log" 2>&1; then
      note "compute-sanitizer $tool FAILED (see sanitizer_$tool.log)"; status=1
    fi
    tail -3 "$out/sanitizer_$tool.log"
  done
else
  note "compute-sanitizer not found: no sanitizer runs"
fi

if python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
  python3 bench/torch_lce_baseline.py --shapes "${BENCH_SHAPES:-8192x4096x128256,8192x2304x256000}" \
    --iters "${BENCH_ITERS:-10}" --out "$out/torch.json" --peers-out "$out/torch_peers.json" \
    2>> "$out/bench.log" || note "torch baseline failed (see bench.log)"
else
  note "PyTorch with CUDA not available: no eager baseline"
fi

# The tessera CLI on the GPU: measured ceilings (cuBLAS GEMM peaks, device copy bandwidth), the
# bench of the cuda implementation over the llm grid against them, and the HTML report.
tessera=build/gpu/bin/tessera
if ! "$tessera" roofline --out "$out/roofline.json" > "$out/roofline.log" 2>&1; then
  note "tessera roofline FAILED (see roofline.log)"; status=1
fi
cat "$out/roofline.log"
roof_arg=(--roofline "$out/roofline.json")
[ -f "$out/roofline.json" ] || roof_arg=()
# Every cuda implementation of every kernel (kernels without one are skipped), at the shapes of
# the issue (Llama-3 and Gemma-2 heads for linear_cross_entropy), device rows timed with events.
shapes=(--shape 8192,4096,128256 --shape 8192,2304,256000)
[ -n "${BENCH_SHAPES:-}" ] && { shapes=(); for sh in ${BENCH_SHAPES//x/,}; do shapes+=(--shape "$sh"); done; }
if ! "$tessera" bench linear_cross_entropy --impl cuda "${shapes[@]}" --dtype bf16 --pass forward,fused \
     --repeats "${BENCH_ITERS:-10}" "${roof_arg[@]}" \
     --json "$out/tessera_bench.json" --csv "$out/tessera_bench.csv" > "$out/tessera_bench.log" 2>&1; then
  note "tessera bench FAILED (see tessera_bench.log)"; status=1
fi
tail -20 "$out/tessera_bench.log"
# grouped_matmul's cuda implementation at the issue's H100 shape (Qwen-style MoE, bf16), balanced
# and skewed, beside torch._grouped_mm and a torch.mm loop timed in the same call.
for routing in balanced skewed; do
  "$tessera" bench grouped_matmul --impl cuda --grid gpu --routing "$routing" --pass forward,fused \
    --repeats "${BENCH_ITERS:-10}" "${roof_arg[@]}" --json "$out/gmm_bench_$routing.json" \
    > "$out/gmm_bench_$routing.log" 2>&1 || { note "grouped_matmul bench ($routing) FAILED (see gmm_bench_$routing.log)"; status=1; }
  tail -6 "$out/gmm_bench_$routing.log"
done
if python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
  python3 bench/torch_gmm_baseline.py --out "$out/torch_gmm.json" --peers-out "$out/torch_gmm_peers.json" \
    > "$out/torch_gmm.log" 2>&1 || note "torch grouped-mm baseline failed (see torch_gmm.log)"
fi
if [ -f "$out/tessera_bench.json" ]; then
  peers=()
  [ -f "$out/torch_peers.json" ] && peers=(--peers "$out/torch_peers.json")
  "$tessera" report "$out/tessera_bench.json" "${peers[@]}" -o "$out/report.html" >> "$out/tessera_bench.log" 2>&1 ||
    { note "tessera report FAILED (see tessera_bench.log)"; status=1; }
fi

# attention: `tessera bench attention --impl cuda` (CUDA events) full and causal at the issue's
# H100 row, each with PyTorch SDPA (flash / cudnn / efficient / default) timed in the same run as
# peers. The cuda backend's v1 is a CUDA-core kernel: expect it far below the tensor-core peers.
attn_shapes=()
for sh in ${ATTN_SHAPES:-4,4096,16,128}; do attn_shapes+=(--shape "$sh"); done
for variant in "" "_causal"; do
  causal_flag=(); [ -n "$variant" ] && causal_flag=(--causal)
  if ! "$tessera" bench attention --impl cuda "${attn_shapes[@]}" --dtype bf16 --pass forward,fused \
       "${causal_flag[@]}" --repeats "${BENCH_ITERS:-10}" "${roof_arg[@]}" \
       --json "$out/attention_bench$variant.json" --csv "$out/attention_bench$variant.csv" \
       > "$out/attention_bench$variant.log" 2>&1; then
    note "tessera bench attention$variant FAILED (see attention_bench$variant.log)"; status=1
  fi
  tail -8 "$out/attention_bench$variant.log"
  attn_peers=()
  if python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
    torch_shapes=$(echo "${ATTN_SHAPES:-4,4096,16,128}" | tr ',' 'x' | tr ' ' ',')
    if python3 bench/torch_attention_baseline.py --shapes "$torch_shapes" "${causal_flag[@]}" \
         --iters "${BENCH_ITERS:-10}" --out "$out/torch_attention$variant.json" \
         --peers-out "$out/torch_attention${variant}_peers.json" 2>> "$out/attention_bench$variant.log"; then
      attn_peers=(--peers "$out/torch_attention${variant}_peers.json")
    else
      note "torch SDPA baseline$variant failed (see attention_bench$variant.log)"
    fi
  fi
  if [ -f "$out/attention_bench$variant.json" ]; then
    "$tessera" report "$out/attention_bench$variant.json" "${attn_peers[@]}" -o "$out/attention_report$variant.html" \
      >> "$out/attention_bench$variant.log" 2>&1 || { note "tessera report (attention$variant) FAILED"; status=1; }
  fi
done

python3 - "$out" <<'PY'
import json, os, sys
out = sys.argv[1]
def load(name):
    p = os.path.join(out, name)
    return json.load(open(p)) if os.path.exists(p) else None
lines = ["# cuda backend: GPU check", ""]
env = open(os.path.join(out, "env.txt")).read().strip()
lines += ["```", env, "```", ""]
for tname, t in (("Tests", load("tests.json")), ("CUDA tests", load("tests_cuda.json"))):
    if not t:
        continue
    lines.append(f"{tname}: {t.get('tests', 0)} run, {t.get('failures', 0)} failed, {t.get('disabled', 0)} disabled.")
    for suite in t.get("testsuites", []):
        for case in suite.get("testsuite", []):
            if case.get("failures"):
                lines.append(f"- FAILED {suite['name']}.{case['name']}: " + case["failures"][0]["failure"].splitlines()[0])
    lines.append("")
pt = load("torch.json")
if pt:
    lines += ["PyTorch eager (materialized) on the same GPU, `bench/torch_lce_baseline.py` (median ms):", "",
              "| B | H | V | fwd+bwd | peak extra MiB |", "|---|---|---|---|---|"]
    for r in pt.get("results", []):
        fb = r.get("forward_backward", {}).get("median_ms")
        mem = r.get("peak_extra_bytes_forward_backward")
        lines.append(f"| {r['B']} | {r['H']} | {r['V']} | {fb if fb is None else format(fb, '.2f')} | "
                     f"{'-' if mem is None else format(mem / 2**20, '.0f')} |")
    lines.append("")
roof = load("roofline.json")
if roof:
    for d in roof.get("devices", []):
        if not d["device"].startswith("cuda"):
            continue
        lines += ["", f"Ceilings of {d['device']} ({d['name']}), `tessera roofline`:", ""]
        for dt, m in sorted(d.get("gemm_method", {}).items()):
            g = d.get("gemm_gflops", {}).get(dt)
            lines.append(f"- GEMM {dt}: " + (f"{g / 1e3:.0f} TFLOP/s" if g else "-") + f" ({m})")
        lines.append(f"- bandwidth: {d.get('bandwidth_gbs', 0):.0f} GB/s ({d.get('bandwidth_method', '')})")
        lines += [f"- note: {n}" for n in d.get("notes", [])]
tb = load("tessera_bench.json")
if tb:
    lines += ["", "`tessera bench linear_cross_entropy --impl cuda` bf16 (median ms, CUDA events; targets: fused <= 1.3x three GEMMs, <= 1 GiB extra):", "",
              "| shape | mode | median ms | first ms | TFLOP/s | % roofline | x GEMM | extra device MiB | loss |",
              "|---|---|---|---|---|---|---|---|---|"]
    def f(r, k, fmt, scale=1.0):
        v = r.get(k)
        return format(v * scale, fmt) if isinstance(v, (int, float)) else "-"
    for r in tb.get("rows", []):
        if r.get("kind") != "kernel":
            continue
        lines.append(f"| {r.get('shape', '')} ({r['B']},{r['H']},{r['V']}) | {r['mode']} | {f(r, 'median_ms', '.2f')} | {f(r, 'first_call_ms', '.1f')} | "
                     f"{f(r, 'gflops', '.0f', 1e-3)} | {f(r, 'roofline_fraction', '.1f', 100.0)} | {f(r, 'vs_gemm', '.3f')} | "
                     f"{f(r, 'extra_device_bytes', '.0f', 1 / 2**20)} | {f(r, 'loss', '.4f')} |")
    lines += [f"- {m}" for m in tb.get("messages", [])]
def f(r, k, fmt, scale=1.0):
    v = r.get(k)
    return format(v * scale, fmt) if isinstance(v, (int, float)) else "-"
for routing in ("balanced", "skewed"):
    gb = load(f"gmm_bench_{routing}.json")
    if not gb:
        continue
    lines += ["", f"`tessera bench grouped_matmul --impl cuda --grid gpu --routing {routing}` (median ms, CUDA events):", "",
              "| shape | mode | median ms | TFLOP/s | x GEMM |", "|---|---|---|---|---|"]
    for r in gb.get("rows", []):
        if r.get("kind") != "kernel":
            continue
        lines.append(f"| M={r.get('M')},K={r.get('K')},N={r.get('N')},G={r.get('G')} | {r['mode']} | {f(r, 'median_ms', '.2f')} | "
                     f"{f(r, 'gflops', '.1f', 1e-3)} | {f(r, 'vs_gemm', '.3f')} |")
tg = load("torch_gmm.json")
if tg:
    lines += ["", "PyTorch on the same GPU, `bench/torch_gmm_baseline.py` (forward, median ms):", "",
              "| shape | routing | torch._grouped_mm | torch.mm loop |", "|---|---|---|---|"]
    for r in tg.get("results", []):
        g = r.get("torch_grouped_mm", {}).get("median_ms")
        l = r.get("cublas_loop", {}).get("median_ms")
        lines.append(f"| M={r['M']},K={r['K']},N={r['N']},G={r['G']} | {r['routing']} | "
                     f"{'-' if g is None else format(g, '.2f')} | {'-' if l is None else format(l, '.2f')} |")
for variant in ("", "_causal"):
    ab = load(f"attention_bench{variant}.json")
    if ab:
        lines += ["", f"`tessera bench attention --impl cuda` bf16{' causal' if variant else ''} (median ms, CUDA events; "
                  "target for a tensor-core kernel: >= 330 TFLOP/s forward non-causal):", "",
                  "| B | S | H | D | mode | median ms | TFLOP/s | % roofline |", "|---|---|---|---|---|---|---|---|"]
        for r in ab.get("rows", []):
            if r.get("kind") != "kernel":
                continue
            g = r.get("gflops")
            fr = r.get("roofline_fraction")
            lines.append(f"| {r.get('B')} | {r.get('S')} | {r.get('H')} | {r.get('D')} | {r['mode']} | "
                         f"{r.get('median_ms', 0):.3f} | {'-' if g is None else format(g / 1e3, '.1f')} | "
                         f"{'-' if fr is None else format(fr * 100, '.1f')} |")
    ta = load(f"torch_attention{variant}.json")
    if ta:
        lines += ["", f"PyTorch {ta['torch']} scaled_dot_product_attention{' causal' if variant else ''}, same run:", "",
                  "| B | S | H | D | backend | fwd ms | fwd TFLOP/s | fwd+bwd ms | fwd+bwd TFLOP/s |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for r in ta["results"]:
            for name, res in r["backends"].items():
                if "error" in res:
                    lines.append(f"| {r['B']} | {r['S']} | {r['H']} | {r['D']} | {name} | {res['error']} | | | |")
                    continue
                fw, fu = res["forward"], res["fused"]
                lines.append(f"| {r['B']} | {r['S']} | {r['H']} | {r['D']} | {name} | {fw['median_ms']:.3f} | "
                             f"{fw['tflops']:.0f} | {fu['median_ms']:.3f} | {fu['tflops']:.0f} |")
notes = os.path.join(out, "summary.notes")
if os.path.exists(notes):
    lines += ["", "Notes:", ""] + ["- " + l.strip() for l in open(notes)]
open(os.path.join(out, "summary.md"), "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
echo "gpu_check: results in $out"
exit $status

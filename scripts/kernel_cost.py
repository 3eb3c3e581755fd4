#!/usr/bin/env python3
"""What each kernel costs: its math against its plumbing, in lines (wc -l).

    python3 scripts/kernel_cost.py [--root DIR] [--json] [--kernel NAME] [--max-plumbing N]

A kernel is src/kernels/NAME/ plus include/tessera/NAME.h. Every file is one of:

  math       the oracle and the backends: reference*, cpu*, cuda*, the kernel's own SIMD/row
             helpers (*_simd*, *_rows*, compact*) and its baselines (baseline*: the same math
             done the plain way, timed beside it)
  tests      the check grid (testing.{h,cc}); the tests under tests/ are not counted
  generated  tuned_table.cc (written by `tessera tune --emit-table`)
  plumbing   everything else: the public header, api.cc, spec.cc, impl.h, implementations.cc,
             block_sizes.*, tuning.*, bench.*, cost.*

A file that matches none of the patterns is reported as `unclassified` and makes the exit code 1,
so a new kind of file gets a decision here. --max-plumbing N: exit 1 when a kernel's plumbing
passes N lines (issue #23's target is 500). docs/ADDING_A_KERNEL.md quotes this table.
"""
import argparse
import fnmatch
import json
import os
import sys

MATH = ("reference*", "cpu*", "cuda*", "*_simd*", "*_rows*", "compact*", "baseline*", "cudnn*")
TESTS = ("testing.h", "testing.cc")
GENERATED = ("tuned_table.cc",)
PLUMBING = ("api.cc", "spec.cc", "impl.h", "implementations.cc", "block_sizes.*", "tuning.*", "bench.*",
            "cost.*", "signature.*")
SHARED = ("registry.h", "registry.cc", "tune_spec.h")  # src/kernels/ itself: the framework, not a kernel


def classify(name):
    for kind, patterns in (("tests", TESTS), ("generated", GENERATED), ("plumbing", PLUMBING), ("math", MATH)):
        if any(fnmatch.fnmatch(name, p) for p in patterns):
            return kind
    return "unclassified"


def lines(path):
    with open(path, "rb") as f:
        return sum(1 for _ in f)


def kernel_cost(root, kernel):
    row = {"kernel": kernel, "math": 0, "plumbing": 0, "tests": 0, "generated": 0, "unclassified": 0, "files": {}}
    folder = os.path.join(root, "src", "kernels", kernel)
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if not os.path.isfile(path):
            continue
        kind = classify(name)
        n = lines(path)
        row[kind] += n
        row["files"][name] = {"kind": kind, "lines": n}
    header = os.path.join(root, "include", "tessera", kernel + ".h")
    if os.path.isfile(header):
        n = lines(header)
        row["plumbing"] += n
        row["files"]["include/tessera/" + kernel + ".h"] = {"kind": "plumbing", "lines": n}
    return row


def kernels(root):
    base = os.path.join(root, "src", "kernels")
    return sorted(d for d in os.listdir(base) if os.path.isdir(os.path.join(base, d)) and d != "common")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    ap.add_argument("--json", action="store_true", help="one JSON object with every kernel's files")
    ap.add_argument("--kernel", help="only this kernel")
    ap.add_argument("--max-plumbing", type=int, help="exit 1 when a kernel's plumbing passes this many lines")
    a = ap.parse_args()
    names = kernels(a.root)
    if a.kernel:
        if a.kernel not in names:
            print(f"kernel_cost: unknown kernel '{a.kernel}' (kernels: {', '.join(names)})", file=sys.stderr)
            return 2
        names = [a.kernel]
    rows = [kernel_cost(a.root, k) for k in names]
    if a.json:
        print(json.dumps(rows, indent=2))
    else:
        print(f"{'kernel':<24}{'math':>8}{'plumbing':>10}{'tests':>8}{'generated':>11}")
        for r in rows:
            print(f"{r['kernel']:<24}{r['math']:>8}{r['plumbing']:>10}{r['tests']:>8}{r['generated']:>11}")
    code = 0
    for r in rows:
        for name, f in r["files"].items():
            if f["kind"] == "unclassified":
                print(f"kernel_cost: {r['kernel']}/{name} matches no pattern: classify it in {__file__}", file=sys.stderr)
                code = 1
        if a.max_plumbing is not None and r["plumbing"] > a.max_plumbing:
            print(f"kernel_cost: {r['kernel']} has {r['plumbing']} lines of plumbing (> {a.max_plumbing})", file=sys.stderr)
            code = 1
    return code


if __name__ == "__main__":
    sys.exit(main())

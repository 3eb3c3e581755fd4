#!/usr/bin/env python3
"""summary.md of a scripts/gpu_check.sh results directory, from whatever is there so far (the
script calls it after every step, so a stage cut short still leaves a current summary).

  python3 scripts/gpu_check_summary.py DIR      writes DIR/summary.md and prints it

Reads: env.txt, steps.tsv (stage, step, status, seconds, log), tests/*.json (GoogleTest JSON, one
per suite process), sanitize/*.log (compute-sanitizer's ERROR SUMMARY), bench/roofline.json,
bench/<kernel>[_<variant>].json (`tessera bench --json`: every kernel, every implementation),
bench/peers_*.json (tessera-peers/1), bench/decode_step_overhead.json, bench/tuned_table_*.cc, summary.notes.
Knows no kernel.
"""
import glob
import json
import xml.etree.ElementTree as ET
import os
import re
import sys


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def fmt(v, spec, scale=1.0):
    return format(v * scale, spec) if isinstance(v, (int, float)) and not isinstance(v, bool) else "-"


def steps_section(out):
    path = os.path.join(out, "steps.tsv")
    if not os.path.exists(path):
        return []
    lines = ["## Steps", "", "| stage | step | status | s | log |", "|---|---|---|---|---|"]
    for row in open(path):
        f = row.rstrip("\n").split("\t")
        if len(f) >= 5:
            lines.append(f"| {f[0]} | {f[1]} | {f[2]} | {f[3]} | {f[4]} |")
    return lines + [""]


def suite_counts(doc):
    run = failed = skipped = 0
    failures = []
    for suite in doc.get("testsuites", []):
        for case in suite.get("testsuite", []):
            run += 1
            if case.get("result") == "SKIPPED" or case.get("status") == "NOTRUN":
                skipped += 1
            if case.get("failures"):
                failed += 1
                first = case["failures"][0].get("failure", "").strip().splitlines()
                failures.append(f"{suite['name']}.{case['name']}: {first[0] if first else ''}")
    return run, failed, skipped, failures


def step_status(out):
    """log path -> status of the step that wrote it (steps.tsv; the last run of it wins)."""
    path = os.path.join(out, "steps.tsv")
    status = {}
    if os.path.exists(path):
        for row in open(path):
            f = row.rstrip("\n").split("\t")
            if len(f) >= 5 and f[4]:
                status[f[4]] = f[2]
    return status


def junit_counts(path):
    """run, failed, skipped, failures of a pytest --junitxml file (None if unreadable)."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return None
    run = failed = skipped = 0
    failures = []
    for case in root.iter("testcase"):
        run += 1
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        if bad is not None:
            failed += 1
            failures.append(f"{case.get('classname')}.{case.get('name')}: {(bad.get('message') or '').splitlines()[0][:200] if bad.get('message') else ''}")
        elif case.find("skipped") is not None:
            skipped += 1
    return run, failed, skipped, failures


def tests_section(out):
    files = sorted(glob.glob(os.path.join(out, "tests", "*.json")))
    xmls = sorted(glob.glob(os.path.join(out, "tests", "*.xml")))
    died = [(log, st) for log, st in sorted(step_status(out).items())
            if log.startswith("tests/") and log.endswith(".log") and st != "ok"
            and not os.path.exists(os.path.join(out, log[:-4] + ".json"))
            and not os.path.exists(os.path.join(out, log[:-4] + ".xml"))]
    if not files and not xmls and not died:
        return []
    lines = ["## Tests (one process per GPU suite)", "", "| suite file | run | failed | skipped |", "|---|---|---|---|"]
    all_failures = []
    for p in files + xmls:
        counts = load(p) if p.endswith(".json") else junit_counts(p)
        if counts is None:
            lines.append(f"| {os.path.basename(p)} | unreadable (crashed?) | | |")
            continue
        run, failed, skipped, failures = suite_counts(counts) if p.endswith(".json") else counts
        lines.append(f"| {os.path.basename(p).rsplit('.', 1)[0]} | {run} | {failed} | {skipped} |")
        all_failures += failures
    # A suite process that died (a segfault, a timeout) wrote no JSON: its step's status says so.
    for log, st in died:
        lines.append(f"| {os.path.basename(log)[:-4]} | no results: {st} | | |")
    lines += [""] + [f"- FAILED {f}" for f in all_failures[:60]]
    return lines + [""]


def sanitize_section(out):
    logs = sorted(glob.glob(os.path.join(out, "sanitize", "*.log")))
    if not logs:
        return []
    lines = ["## compute-sanitizer (Tessera's kernels)", ""]
    status = step_status(out)
    for p in logs:
        text = open(p, errors="replace").read()
        m = re.findall(r"ERROR SUMMARY: (\d+) errors?", text)
        line = f"- {os.path.basename(p)[:-4]}: " + (f"{m[-1]} errors" if m else "no ERROR SUMMARY (cut short?)")
        # The tool's errors are not the whole story: the tests it ran can fail, the process can die.
        counts = re.findall(r"\[  (PASSED|FAILED|SKIPPED) +\] (\d+) tests?", text)
        failed = {t.rstrip(",") for t in re.findall(r"^\[  FAILED  \] ([^ ]+)", text, re.M)}
        if failed and not any(k == "FAILED" for k, _ in counts):  # --gtest_brief prints no FAILED count
            counts.append(("FAILED", str(len(failed))))
        if counts:
            line += "; tests " + ", ".join(f"{n} {k.lower()}" for k, n in counts)
        if "didn't terminate successfully" in text:
            line += "; the process did not terminate successfully (crashed)"
        st = status.get(os.path.relpath(p, out))
        if st and st != "ok":
            line += f"; step {st}"
        lines.append(line)
    return lines + [""]


def roofline_section(out):
    roof = load(os.path.join(out, "bench", "roofline.json"))
    lines = []
    for d in (roof or {}).get("devices", []):
        if not d.get("device", "").startswith("cuda"):
            continue
        lines += [f"## Ceilings of {d['device']} ({d.get('name', '')}), `tessera roofline`", ""]
        for dt, m in sorted(d.get("gemm_method", {}).items()):
            g = d.get("gemm_gflops", {}).get(dt)
            lines.append(f"- GEMM {dt}: " + (f"{g / 1e3:.0f} TFLOP/s" if g else "-") + f" ({m})")
        lines.append(f"- bandwidth: {d.get('bandwidth_gbs', 0):.0f} GB/s ({d.get('bandwidth_method', '')})")
        lines += [f"- note: {n}" for n in d.get("notes", [])] + [""]
    return lines


def bench_section(out):
    lines = []
    for p in sorted(glob.glob(os.path.join(out, "bench", "*.json"))):
        name = os.path.basename(p)[:-5]
        doc = load(p)
        if name.startswith("peers_") or name == "roofline" or not isinstance(doc, dict) or "rows" not in doc:
            continue
        dims = doc.get("dims", [])
        lines += [f"## `tessera bench {doc.get('kernel', name)}` ({name}; median ms, CUDA events)", "",
                  "| implementation | " + " | ".join(dims) + " | mode | median ms | first ms | TFLOP/s | % roofline | x GEMM |",
                  "|---|" + "---|" * len(dims) + "---|---|---|---|---|---|"]
        for r in doc["rows"]:
            if r.get("kind") != "kernel":
                continue
            lines.append(f"| {r.get('implementation')} | " + " | ".join(str(r.get(d, "")) for d in dims) +
                         f" | {r.get('mode')} | {fmt(r.get('median_ms'), '.3f')} | {fmt(r.get('first_call_ms'), '.1f')} | "
                         f"{fmt(r.get('gflops'), '.1f', 1e-3)} | {fmt(r.get('roofline_fraction'), '.1f', 100.0)} | "
                         f"{fmt(r.get('vs_gemm'), '.3f')} |")
        lines += [f"- {m}" for m in doc.get("messages", [])] + [""]
    return lines


def peers_section(out):
    lines = []
    for p in sorted(glob.glob(os.path.join(out, "bench", "peers_*.json"))):
        doc = load(p)
        if not isinstance(doc, dict) or doc.get("schema") != "tessera-peers/1":
            continue
        dims = doc.get("dims", [])
        lines += [f"## Peers of {doc.get('kernel')}: {doc.get('source', '')} on {doc.get('device', '')}", "",
                  "| implementation | " + " | ".join(dims) + " | mode | median ms |", "|---|" + "---|" * len(dims) + "---|---|"]
        for r in doc.get("rows", []):
            lines.append(f"| {r.get('implementation')} | " + " | ".join(str(r.get(d, "")) for d in dims) +
                         f" | {r.get('mode')} | {fmt(r.get('median_ms'), '.3f')} |")
        lines += [f"- {n}" for n in doc.get("notes", [])] + [""]
    return lines


def decode_step_section(out):
    """bench/decode_step_overhead.json (bench/decode_step_overhead.py): is a decode step host-bound?"""
    doc = load(os.path.join(out, "bench", "decode_step_overhead.json"))
    if not isinstance(doc, dict):
        return []
    dev = doc.get("device_us_per_call")
    verdict = {True: "host-bound", False: "device-bound", None: "no device time recorded"}.get(doc.get("host_bound"))
    return [f"## Decode step from tessera.torch ({doc.get('layers')} paged_attention calls, {doc.get('seqs')} sequences "
            f"x {doc.get('kv_len')} keys, Hq {doc.get('hq')}, Hkv {doc.get('hkv')}, D {doc.get('d')}, {doc.get('dtype')})", "",
            f"- wall per call: {fmt(doc.get('wall_us_per_call'), '.1f')} us; kernels' device time per call: "
            f"{fmt(dev, '.1f')} us ({doc.get('kernels_seen')} kernels seen): {verdict}", ""]


def main():
    out = sys.argv[1]
    lines = ["# GPU check (scripts/gpu_check.sh)", ""]
    env = os.path.join(out, "env.txt")
    if os.path.exists(env):
        lines += ["```", open(env, errors="replace").read().strip(), "```", ""]
    for section in (steps_section, tests_section, sanitize_section, roofline_section, bench_section, peers_section,
                    decode_step_section):
        lines += section(out)
    tables = sorted(glob.glob(os.path.join(out, "bench", "tuned_table_*.cc")))
    if tables:
        lines += ["## Tuned-table rows for this GPU (review, then copy into src/kernels/<kernel>/tuned_table.cc)", ""]
        lines += [f"- bench/{os.path.basename(t)}" for t in tables] + [""]
    notes = os.path.join(out, "summary.notes")
    if os.path.exists(notes):
        lines += ["## Notes", ""] + ["- " + l.strip() for l in open(notes) if l.strip()]
    text = "\n".join(lines) + "\n"
    tmp = os.path.join(out, "summary.md.tmp")
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, os.path.join(out, "summary.md"))
    print(text)


if __name__ == "__main__":
    main()

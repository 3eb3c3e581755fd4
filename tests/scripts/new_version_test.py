#!/usr/bin/env python3
"""ctest scripts.new_version: scripts/new_version.py on a copy of the files it edits.

Copies src/kernels/linear_cross_entropy, CMakeLists.txt, docs/kernels and scripts/templates into a
temporary root and checks its edits textually: cpu -> cpu_v2 -> cpu_v3, cuda -> cuda_v2, and the
refusals (nothing written). The build of a clone is checked by hand (docs/VERSIONS.md).
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

SRC = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", ".."))
SCRIPT = os.path.join(SRC, "scripts", "new_version.py")
K = "linear_cross_entropy"
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def read(root, rel):
    with open(os.path.join(root, rel), encoding="utf-8") as f:
        return f.read()


def run(root, *args):
    p = subprocess.run([sys.executable, SCRIPT, *args, "--root", root], capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr


def snapshot(root):
    out = {}
    for d, _, files in os.walk(root):
        for f in files:
            path = os.path.join(d, f)
            out[os.path.relpath(path, root)] = open(path, "rb").read()
    return out


with tempfile.TemporaryDirectory(prefix="tessera_new_version_") as root:
    shutil.copytree(os.path.join(SRC, "src", "kernels", K), os.path.join(root, "src", "kernels", K))
    shutil.copytree(os.path.join(SRC, "docs", "kernels"), os.path.join(root, "docs", "kernels"))
    shutil.copytree(os.path.join(SRC, "scripts", "templates"), os.path.join(root, "scripts", "templates"))
    shutil.copy(os.path.join(SRC, "CMakeLists.txt"), root)
    kdir = f"src/kernels/{K}"

    # Refusals write nothing.
    before = snapshot(root)
    rc, out = run(root, "no_such_kernel", "cpu")
    check(rc == 1 and "nothing written" in out, f"unknown kernel refused: rc={rc} {out}")
    rc, out = run(root, K, "nosuchimpl")
    check(rc == 1 and "nothing written" in out, f"unknown implementation refused: rc={rc} {out}")
    rc, out = run(root, K, "cpu", "--dry-run")
    check(rc == 0 and "would write" in out, f"dry run: rc={rc} {out}")
    check(snapshot(root) == before, "refusals and --dry-run wrote nothing")

    # cpu -> cpu_v2
    rc, out = run(root, K, "cpu", "--what-changed", 'tiles of 8 "rows"')
    check(rc == 0, f"cpu -> cpu_v2: rc={rc} {out}")
    v2 = read(root, f"{kdir}/cpu_v2.cc")
    check('std::string name() const override { return "cpu_v2"; }' in v2, "cpu_v2.cc registers as cpu_v2")
    check("make_cpu_v2_implementation()" in v2 and "make_cpu_implementation" not in v2, "factory renamed")
    check("return VersionStatus::kExperimental;" in v2, "cpu_v2 is experimental")
    check('what_changed() const override { return "tiles of 8 \\"rows\\""; }' in v2, "what_changed escaped")
    check('" cpu_v2: invalid block sizes' in v2 and '" cpu: ' not in v2, "messages name cpu_v2")
    cpu = read(root, f"{kdir}/cpu.cc")
    check(cpu == open(os.path.join(SRC, kdir, "cpu.cc"), encoding="utf-8").read(), "cpu.cc untouched")
    impl_h = read(root, f"{kdir}/impl.h")
    check(re.search(r"make_cpu_implementation\(\);\n(//[^\n]*\n)?std::unique_ptr<Implementation> make_cpu_v2_implementation\(\);",
                    impl_h) is not None, "impl.h declares make_cpu_v2_implementation after cpu's")
    impls = read(root, f"{kdir}/implementations.cc")
    i_cpu, i_v2, i_ref = (impls.find("make_cpu_implementation()"), impls.find("make_cpu_v2_implementation()"),
                          impls.find("make_reference_implementation()"))
    check(0 <= i_cpu < i_v2 < i_ref, "implementations.cc: cpu, cpu_v2, reference in that order")
    cmake = read(root, "CMakeLists.txt")
    check(re.search(r"CPU_SOURCES cpu\.cc cpu_v2\.cc\b", cmake) is not None, "CPU_SOURCES lists cpu_v2.cc after cpu.cc")
    check(cmake.count("cpu_v2.cc") == 1, "cpu_v2.cc listed once")
    doc = read(root, f"docs/kernels/{K}.md")
    check(doc.rstrip().endswith("keep experimental, or drop.") and "### cpu_v2 — tiles of 8 \"rows\"" in doc,
          "devlog entry appended")
    check("src/kernels/linear_cross_entropy/cpu_v2.cc" in doc, "devlog names the file")

    # cpu_v2 exists: the family's next is cpu_v3, cloned from cpu_v2, one status() only.
    rc, out = run(root, K, "cpu_v2")
    check(rc == 0, f"cpu_v2 -> cpu_v3: rc={rc} {out}")
    v3 = read(root, f"{kdir}/cpu_v3.cc")
    check(v3.count("VersionStatus status() const override") == 1 and v3.count("what_changed() const override") == 1,
          "cpu_v3 has one status() and one what_changed()")
    check('return "cpu_v3";' in v3 and "make_cpu_v3_implementation()" in v3 and
          "cpu_v2" not in v3.replace("cloned from cpu_v2.cc", ""), "cpu_v3 renamed from cpu_v2")
    check(v3.count("cloned from") == 1, "cpu_v3 says once where it came from")
    check("TODO: one line" in v3, "cpu_v3 what_changed is the placeholder again")
    check(re.search(r"CPU_SOURCES cpu\.cc cpu_v2\.cc cpu_v3\.cc\b", read(root, "CMakeLists.txt")) is not None,
          "CPU_SOURCES: cpu.cc cpu_v2.cc cpu_v3.cc")
    impls = read(root, f"{kdir}/implementations.cc")
    check(impls.find("make_cpu_v2_implementation()") < impls.find("make_cpu_v3_implementation()")
          < impls.find("make_reference_implementation()"), "cpu_v3 registered after cpu_v2")
    rc, out = run(root, K, "cpu")  # the family: next is cpu_v4 whatever version is named
    check(rc == 0 and os.path.exists(os.path.join(root, kdir, "cpu_v4.cc")), f"cpu -> cpu_v4: {out}")

    # cuda -> cuda_v2: declared as a module implementation, registered by the module.
    rc, out = run(root, K, "cuda")
    check(rc == 0, f"cuda -> cuda_v2: rc={rc} {out}")
    cu = read(root, f"{kdir}/cuda_v2.cu")
    check('return "cuda_v2";' in cu and "registry().add(make_cuda_v2_implementation())" in cu,
          "cuda_v2.cu registers cuda_v2 from the module")
    impls = read(root, f"{kdir}/implementations.cc")
    check('add_module_implementation("cuda_v2", DeviceType::kCUDA' in impls, "cuda_v2 declared as module implementation")
    check(re.search(r"CUDA_SOURCES cuda\.cu cuda_v2\.cu\b", read(root, "CMakeLists.txt")) is not None,
          "CUDA_SOURCES lists cuda_v2.cu")

print("new_version_test:", "FAILED" if failures else "ok", f"({len(failures)} failures)")
sys.exit(1 if failures else 0)

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


def latest(base, ext):
    """The family's latest version number in the source tree (1 = base.ext only)."""
    n = 1
    for fn in os.listdir(os.path.join(SRC, "src", "kernels", K)):
        m = re.fullmatch(re.escape(base) + r"_v([0-9]+)" + re.escape(ext), fn)
        if m:
            n = max(n, int(m.group(1)))
    return n


def declared(base):
    """The highest version number impl.h declares a factory for (folded versions have no file)."""
    text = open(os.path.join(SRC, "src", "kernels", K, "impl.h"), encoding="utf-8").read()
    return max([1] + [int(n or 1) for n in re.findall(r"\bmake_" + base + r"(?:_v([0-9]+))?_implementation\(", text)])


def vname(base, n):
    return base if n == 1 else f"{base}_v{n}"


# The tree may hold versions already (a clone being worked on, or folded into a file: cpu_v2 in
# cpu.cc): clone from the latest file, numbered after every declared version.
NC, DC = latest("cpu", ".cc"), declared("cpu")
C0 = vname("cpu", NC)
C1, C2, C3 = (vname("cpu", max(NC, DC) + 1 + i) for i in range(3))  # next, next-next, ...
FOLDED = [vname("cpu", n) for n in range(2, DC + 1) if n != NC and
          not os.path.exists(os.path.join(SRC, "src", "kernels", K, vname("cpu", n) + ".cc"))]
NU = latest("cuda", ".cu")
U0, U1 = vname("cuda", NU), vname("cuda", max(NU, declared("cuda")) + 1)


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

    # cpu -> cpu_v2 (from the family's latest C0 to C1)
    rc, out = run(root, K, "cpu", "--what-changed", 'tiles of 8 "rows"')
    check(rc == 0, f"{C0} -> {C1}: rc={rc} {out}")
    v2 = read(root, f"{kdir}/{C1}.cc")
    check('std::string name() const override { return "%s"; }' % C1 in v2, f"{C1}.cc registers as {C1}")
    check(f"make_{C1}_implementation()" in v2 and f"make_{C0}_implementation" not in v2, "factory renamed")
    check("return VersionStatus::kExperimental;" in v2, f"{C1} is experimental")
    check('what_changed() const override { return "tiles of 8 \\"rows\\""; }' in v2, "what_changed escaped")
    # Messages name the version: literally, or through name() (a file that hosts folded versions).
    check((f'" {C1}: invalid block sizes' in v2 or 'name + ": invalid block sizes' in v2) and f'" {C0}: ' not in v2,
          f"messages name {C1}")
    for f in FOLDED:  # versions folded into the source file stay there, out of the clone
        check(f"make_{f}_implementation" not in v2 and "folded versions" not in v2, f"{C1}.cc leaves {f} out")
    cpu = read(root, f"{kdir}/{C0}.cc")
    check(cpu == open(os.path.join(SRC, kdir, f"{C0}.cc"), encoding="utf-8").read(), f"{C0}.cc untouched")
    impl_h = read(root, f"{kdir}/impl.h")
    check(re.search(f"make_{C0}_implementation\\(\\);\\n(//[^\\n]*\\n)?std::unique_ptr<Implementation> make_{C1}_implementation\\(\\);",
                    impl_h) is not None, f"impl.h declares make_{C1}_implementation after {C0}'s")
    impls = read(root, f"{kdir}/implementations.cc")
    i_cpu, i_v2, i_ref = (impls.find(f"make_{C0}_implementation()"), impls.find(f"make_{C1}_implementation()"),
                          impls.find("make_reference_implementation()"))
    check(0 <= i_cpu < i_v2 < i_ref, f"implementations.cc: {C0}, {C1}, reference in that order")
    cmake = read(root, "CMakeLists.txt")
    check(re.search(f"CPU_SOURCES [^)]*\\b{C0}\\.cc {C1}\\.cc\\b", cmake) is not None, f"CPU_SOURCES lists {C1}.cc after {C0}.cc")
    check(cmake.count(f"{C1}.cc") == 1, f"{C1}.cc listed once")
    doc = read(root, f"docs/kernels/{K}.md")
    check(doc.rstrip().endswith("keep experimental, or drop.") and f"### {C1} — tiles of 8 \"rows\"" in doc,
          "devlog entry appended")
    check(f"src/kernels/linear_cross_entropy/{C1}.cc" in doc, "devlog names the file")

    # C1 exists: the family's next is C2, cloned from C1, one status() only.
    rc, out = run(root, K, C1)
    check(rc == 0, f"{C1} -> {C2}: rc={rc} {out}")
    v3 = read(root, f"{kdir}/{C2}.cc")
    check(v3.count("VersionStatus status() const override") == 1 and v3.count("what_changed() const override") == 1,
          f"{C2} has one status() and one what_changed()")
    check('return "%s";' % C2 in v3 and f"make_{C2}_implementation()" in v3 and
          C1 not in v3.replace(f"cloned from {C1}.cc", ""), f"{C2} renamed from {C1}")
    check(v3.count("cloned from") == 1, f"{C2} says once where it came from")
    check("TODO: one line" in v3, f"{C2} what_changed is the placeholder again")
    check(re.search(f"CPU_SOURCES [^)]*\\b{C0}\\.cc {C1}\\.cc {C2}\\.cc\\b", read(root, "CMakeLists.txt")) is not None,
          f"CPU_SOURCES: {C0}.cc {C1}.cc {C2}.cc")
    impls = read(root, f"{kdir}/implementations.cc")
    check(impls.find(f"make_{C1}_implementation()") < impls.find(f"make_{C2}_implementation()")
          < impls.find("make_reference_implementation()"), f"{C2} registered after {C1}")
    rc, out = run(root, K, "cpu")  # the family: the next whatever version is named
    check(rc == 0 and os.path.exists(os.path.join(root, kdir, f"{C3}.cc")), f"cpu -> {C3}: {out}")

    # cuda -> cuda_v2: declared as a module implementation, registered by the module.
    rc, out = run(root, K, "cuda")
    check(rc == 0, f"{U0} -> {U1}: rc={rc} {out}")
    cu = read(root, f"{kdir}/{U1}.cu")
    check('return "%s";' % U1 in cu and f"registry().add(make_{U1}_implementation())" in cu,
          f"{U1}.cu registers {U1} from the module")
    # Its own copy of the kernels header, namespace renamed (no kernel defined twice in the module).
    check(f'#include "kernels/{K}/{U1}_kernels.cuh"' in cu and f"namespace ck = {U1}_kernels;" in cu,
          f"{U1}.cu includes its own {U1}_kernels.cuh")
    hdr = read(root, f"{kdir}/{U1}_kernels.cuh")
    check(f"namespace tessera::linear_cross_entropy::{U1}_kernels {{" in hdr, f"{U1}_kernels.cuh has its namespace")
    check(read(root, f"{kdir}/{U0}_kernels.cuh") == open(os.path.join(SRC, kdir, f"{U0}_kernels.cuh"),
                                                         encoding="utf-8").read(), f"{U0}_kernels.cuh untouched")
    impls = read(root, f"{kdir}/implementations.cc")
    check(f'add_module_implementation("{U1}", DeviceType::kCUDA' in impls, f"{U1} declared as module implementation")
    check(re.search(f'add_module_implementation\\("{U1}"[^;]*VersionStatus::kExperimental\\);', impls) is not None,
          f"{U1} declared experimental (out of the default order before its module loads)")
    check(re.search(f"CUDA_SOURCES [^)]*\\b{U0}\\.cu {U1}\\.cu\\b", read(root, "CMakeLists.txt")) is not None,
          f"CUDA_SOURCES lists {U1}.cu")

print("new_version_test:", "FAILED" if failures else "ok", f"({len(failures)} failures)")
sys.exit(1 if failures else 0)

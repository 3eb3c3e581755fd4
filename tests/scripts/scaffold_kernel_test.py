#!/usr/bin/env python3
"""ctest scripts.scaffold_kernel: scripts/scaffold_kernel.py on a copy of the files it edits.

Checks the files it writes and its edits of CMakeLists.txt and src/kernels/registry.cc
textually, and that refusals write nothing. (Built by hand: docs/VERSIONS.md.)
"""
import os
import shutil
import subprocess
import sys
import tempfile

SRC = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", ".."))
SCRIPT = os.path.join(SRC, "scripts", "scaffold_kernel.py")
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def run(root, *args):
    p = subprocess.run([sys.executable, SCRIPT, *args, "--root", root], capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr


def read(root, rel):
    with open(os.path.join(root, rel), encoding="utf-8") as f:
        return f.read()


with tempfile.TemporaryDirectory(prefix="tessera_scaffold_") as root:
    os.makedirs(os.path.join(root, "src", "kernels"))
    shutil.copy(os.path.join(SRC, "CMakeLists.txt"), root)
    shutil.copy(os.path.join(SRC, "src", "kernels", "registry.cc"), os.path.join(root, "src", "kernels"))
    cmake0, reg0 = read(root, "CMakeLists.txt"), read(root, "src/kernels/registry.cc")

    rc, out = run(root, "Bad-Name")
    check(rc == 2, f"bad name refused with 2: {rc} {out}")
    rc, out = run(root, "demo_op", "a demo", "--dry-run")
    check(rc == 0 and "would write src/kernels/demo_op/spec.cc" in out, f"dry run: {out}")
    check(not os.path.exists(os.path.join(root, "src", "kernels", "demo_op")), "dry run wrote nothing")

    rc, out = run(root, "demo_op", "a demo")
    check(rc == 0, f"scaffold: rc={rc} {out}")
    for rel in ["include/tessera/demo_op.h", "src/kernels/demo_op/impl.h", "src/kernels/demo_op/api.cc",
                "src/kernels/demo_op/reference.cc", "src/kernels/demo_op/implementations.cc",
                "src/kernels/demo_op/spec.cc", "tests/kernels/demo_op_test.cc", "docs/kernels/demo_op.md"]:
        check(os.path.exists(os.path.join(root, rel)), f"{rel} written")
    cmake = read(root, "CMakeLists.txt")
    check("tessera_add_kernel(demo_op\n  SOURCES api.cc implementations.cc reference.cc\n  TOOLS_SOURCES spec.cc\n"
          "  TESTS kernels/demo_op_test.cc\n)" in cmake, "tessera_add_kernel(demo_op ...) added")
    check(cmake.index("tessera_add_kernel(demo_op") > cmake.rindex("tessera_add_kernel(", 0,
                                                                   cmake.index("tessera_add_kernel(demo_op")),
          "after the existing kernels")
    reg = read(root, "src/kernels/registry.cc")
    check("namespace demo_op {\nconst kernels::KernelSpec& spec();\n}" in reg, "spec declared in registry.cc")
    check("      &demo_op::spec(),\n  };" in reg, "spec listed last in registry.cc")
    check('.description = "a demo",' in read(root, "src/kernels/demo_op/spec.cc"), "description in spec.cc")
    check("the reference is not written yet" in read(root, "src/kernels/demo_op/reference.cc"),
          "the reference throws until written")
    check("TEST(DemoOpReference, MatchesHandValues)" in read(root, "tests/kernels/demo_op_test.cc"), "placeholder test")
    api = read(root, "src/kernels/demo_op/api.cc")
    check('{{&Inputs::x, {"x", "N,D", "f32"}, "input", true, false}}, {{"y", "N,D", "f32"}}' in api,
          "tensors declared once in api.cc")
    check("tensors().bind(in, dispatch::BindMode::kFull);" in api, "api.cc validates from the declaration")
    spec = read(root, "src/kernels/demo_op/spec.cc")
    check(".inputs = kernels::inputs_of(tensors()).specs()" in spec, "the call's inputs from the declaration")
    check('kernels::declared_outputs(kernels::inputs_of(tensors()).shapes(a), tensors().rules(),' in spec,
          "the call's output shape from the declaration")
    check('"demo_op: y must be [N=2, D=3], got [2, 2]"' in read(root, "tests/kernels/demo_op_test.cc"),
          "a rejection test in the rules' words")

    rc, out = run(root, "demo_op")
    check(rc == 1 and "exists already" in out and "nothing written" in out, f"second scaffold refused: {out}")

print("scaffold_kernel_test:", "FAILED" if failures else "ok", f"({len(failures)} failures)")
sys.exit(1 if failures else 0)

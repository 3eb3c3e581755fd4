#!/usr/bin/env python3
"""Create a new kernel from the framework's template (docs/ADDING_A_KERNEL.md, docs/VERSIONS.md).

    python3 scripts/scaffold_kernel.py NAME ["one-line description"] [--root DIR] [--dry-run]

Writes, from the repository root (or --root):

  include/tessera/NAME.h            the contract: Options : ExecOptions, Inputs, forward(in, y, opt)
                                    (a placeholder y = f(x) over x [N, D] f32: change it)
  src/kernels/NAME/impl.h           Problem, Implementation, the registry, the factories
  src/kernels/NAME/api.cc           its tensors declared once (dispatch::DeclaredTensors), validation
                                    from them (an error touches no output), dispatch
  src/kernels/NAME/reference.cc     the oracle: NOT WRITTEN (it throws until you write it)
  src/kernels/NAME/implementations.cc  the registry, default order
  src/kernels/NAME/spec.cc          the registration (KernelSpec): dims N,D, pass forward, f32
  tests/kernels/NAME_test.cc        hand values for the reference: fails until it is written;
                                    a wrong output shape rejected by the tensor rules
  docs/kernels/NAME.md              what it computes, its limits, the devlog

and adds `tessera_add_kernel(NAME ...)` to CMakeLists.txt and the spec to src/kernels/registry.cc.
The result builds; `tessera list` shows NAME with its reference; its test fails until the
reference is written. Then: the math in the header comment, the reference, the check grid,
bench.cc, cost.cc, a cpu backend (`scripts/new_version.py` clones versions of it later).
Nothing is written when any step cannot be done. Exit: 0 done, 1 cannot, 2 bad arguments.
"""
import argparse
import datetime
import os
import re
import sys

HEADER = """// Tessera: {name} — {description}.
//
// THE CONTRACT (write it first; a placeholder until then): y = f(x) for x [N, D] f32 on the CPU,
// y of the same shape. State the math here, its options, its limits.
#pragma once

#include <string>
#include <vector>

#include "tessera/exec.h"
#include "tessera/tensor.h"

namespace tessera::{name} {{

struct Options : ExecOptions {{}};

struct Inputs {{
  TensorView x;  // [N, D] f32
}};

// y [N, D] f32 (written). Returns the implementation that ran. Throws Error(kInvalidArgument)
// before touching y when a shape, dtype or device is wrong.
std::string forward(const Inputs& in, const TensorView& y, const Options& opt = {{}});

std::vector<ImplementationInfo> implementations();

}}  // namespace tessera::{name}
"""

IMPL_H = """// Tessera internal: the contract between the {name} API and its implementations.
#pragma once

#include <memory>

#include "dispatch/declared_tensors.h"
#include "dispatch/registry.h"
#include "tessera/{name}.h"

namespace tessera::{name} {{

inline constexpr const char* kKernelName = "{name}";
using dispatch::Availability;

struct Problem {{
  int64_t N = 0, D = 0;
  Device device;
  const float* x = nullptr;  // [N, D] contiguous
  float* y = nullptr;        // [N, D] contiguous
  int num_threads = 1;
}};

class Implementation : public dispatch::ImplementationBase {{
 public:
  virtual Availability supports(const Problem& p) const = 0;
  virtual void forward(const Problem& p) const = 0;
}};

using Registry = dispatch::Registry<Implementation>;
Registry& registry();

// Every tensor declared once (api.cc; dispatch/declared_tensors.h): the API's checks, the call's
// output shapes, `tessera run`'s flags and the Python keywords with their help (spec.cc).
const dispatch::DeclaredTensors<Inputs>& tensors();

std::unique_ptr<Implementation> make_reference_implementation();

}}  // namespace tessera::{name}
"""

API_CC = """// {name}: validation and dispatch. Every check runs before any output is touched.
#include "kernels/{name}/impl.h"

namespace tessera::{name} {{

// Inputs: field, rule (named dims, dtype, place), what it is, required, differentiable; then the
// outputs' rules.
const dispatch::DeclaredTensors<Inputs>& tensors() {{
  static const dispatch::DeclaredTensors<Inputs> t{{
      kKernelName, {{{{&Inputs::x, {{"x", "N,D", "f32"}}, "input", true, false}}}}, {{{{"y", "N,D", "f32"}}}}}};
  return t;
}}

std::vector<ImplementationInfo> implementations() {{ return registry().infos(); }}

std::string forward(const Inputs& in, const TensorView& y, const Options& opt) {{
  dispatch::Dims d = tensors().bind(in, dispatch::BindMode::kFull);
  dispatch::check_rule(d, tensors().rules(), "y", y);  // the output: x's dims, on x's device
  tensors().apart(in, {{{{"y", y}}}});  // y must not share memory with x (a backend reads x after writing y)
  Problem p;
  p.N = d["N"], p.D = d["D"];
  p.device = d.device();
  p.x = in.x.data_as<const float>();
  p.y = y.data_as<float>();
  p.num_threads = resolve_num_threads(opt.num_threads);
  return registry().dispatch_problem(opt.implementation, p, [&](const Implementation& impl) {{ impl.forward(p); }});
}}

}}  // namespace tessera::{name}
"""

REFERENCE_CC = """// {name}: the reference — the oracle. Plain loops, double accumulation, obviously correct.
// NOT WRITTEN YET: it throws, and tests/kernels/{name}_test.cc fails until it is.
#include "kernels/{name}/impl.h"
#include "tessera/error.h"

namespace tessera::{name} {{
namespace {{

class Reference final : public Implementation {{
 public:
  std::string name() const override {{ return "reference"; }}
  std::string description() const override {{ return "plain loops in double precision, the oracle"; }}
  DeviceType device_type() const override {{ return DeviceType::kCPU; }}
  Availability supports(const Problem& p) const override {{
    if (p.device.type != DeviceType::kCPU) return Availability::no("the reference runs on host memory");
    return Availability::yes();
  }}
  void forward(const Problem&) const override {{
    throw Error(ErrorCode::kUnsupported, std::string(kKernelName) +
                                             ": the reference is not written yet (src/kernels/{name}/reference.cc)");
  }}
}};

}}  // namespace

std::unique_ptr<Implementation> make_reference_implementation() {{ return std::make_unique<Reference>(); }}

}}  // namespace tessera::{name}
"""

IMPLEMENTATIONS_CC = """// {name}: the registry of implementations, in default dispatch order (fastest first).
// A new backend adds its factory here and its file to tessera_add_kernel({name} ...).
#include "kernels/{name}/impl.h"

namespace tessera::{name} {{

Registry& registry() {{
  static Registry& r = Registry::leaked(kKernelName, [](Registry& reg) {{
    reg.add(make_reference_implementation());
  }});
  return r;
}}

}}  // namespace tessera::{name}
"""

SPEC_CC = """// {name}: the registration — the only place the CLI, the parity suite and the bindings learn
// about this kernel (docs/ADDING_A_KERNEL.md). Grow it with the kernel: check grid, bench, tune, run.
#include "kernels/{name}/impl.h"
#include "kernels/declared_signature.h"
#include "kernels/registry.h"
#include "tessera/error.h"

namespace tessera::{name} {{

const kernels::KernelSpec& spec() {{
  static const kernels::KernelSpec s{{
      .name = kKernelName,
      .description = "{description}",
      .dims = {{"N", "D"}},
      .passes = {{Pass::kForward}},
      .dtypes = {{DType::kF32}},
      .implementations = registry,
      .check_grid = [](bool) {{ return std::vector<kernels::CheckCase>{{}}; }},  // TODO: testing.cc
      .bench = {{.make_problem = [](const harness::GridShape&, DType, const harness::OptionValues&, uint64_t)
                    -> std::unique_ptr<harness::BenchProblem> {{
        throw Error(ErrorCode::kUnsupported, std::string(kKernelName) + ": no benchmark problem yet (bench.cc)");
      }}}},
      // The signature: `tessera run`, the Python functions and their help are derived from api.cc's
      // tensors(). The output shapes come from its rules, shapes only (no data under jit / fake tensors).
      .call = {{.inputs = kernels::inputs_of(tensors()).specs(),
               .outputs =
                   [](const kernels::CallArgs& a) {{
                     return kernels::declared_outputs(kernels::inputs_of(tensors()).shapes(a), tensors().rules(),
                                                      {{{{{{"y"}}}}}}, a);
                   }},
               .call = [](const kernels::CallArgs& a, const std::vector<TensorView>& out) {{
                 return forward(kernels::inputs_of(tensors()).parse(a), out.at(0), kernels::exec_options<Options>(a));
               }}}}}};
  return s;
}}

}}  // namespace tessera::{name}
"""

TEST_CC = """// {name}: the reference against hand values. Fails until the reference is written.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tessera/error.h"
#include "tessera/{name}.h"

namespace tessera {{
namespace {{

TEST({Name}Reference, MatchesHandValues) {{
  std::vector<float> x = {{1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f}};
  std::vector<float> y(x.size(), -1.0f);
  // TODO: the values the math gives for x, worked out by hand.
  const std::vector<float> want = {{0, 0, 0, 0, 0, 0}};
  {name}::Options opt;
  opt.implementation = "reference";
  ASSERT_NO_THROW({name}::forward({{TensorView(x.data(), DType::kF32, {{2, 3}})}},
                                  TensorView(y.data(), DType::kF32, {{2, 3}}), opt));
  for (size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(y[i], want[i], 1e-6) << i;
}}

// The declared tensors (api.cc) reject a y of another shape before anything runs, in one line.
TEST({Name}Api, WrongOutputShapeIsRejectedUntouched) {{
  std::vector<float> x(6, 1.0f), y(4, -1.0f);
  try {{
    {name}::forward({{TensorView(x.data(), DType::kF32, {{2, 3}})}}, TensorView(y.data(), DType::kF32, {{2, 2}}));
    ADD_FAILURE() << "accepted";
  }} catch (const Error& e) {{
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_EQ(std::string(e.what()), "{name}: y must be [N=2, D=3], got [2, 2]");
  }}
  for (float v : y) EXPECT_EQ(v, -1.0f);
}}

}}  // namespace
}}  // namespace tessera
"""

DOC_MD = """# {name}

{description}.

## Semantics (the contract every implementation meets)

TODO: the math, its options, dtypes, shapes, what is rejected and why.

## Implementations

| name | what it is |
|---|---|
| `reference` | plain loops in double, the oracle (not written yet) |

## Testing

TODO: hand values, finite differences, the check grid and its tolerances.

## Devlog

### v0.1 — scaffold ({date})
- Created by `scripts/scaffold_kernel.py`: contract placeholder, reference to write, registration,
  a failing hand-value test.
"""

CMAKE_BLOCK = """tessera_add_kernel({name}
  SOURCES api.cc implementations.cc reference.cc
  TOOLS_SOURCES spec.cc
  TESTS kernels/{name}_test.cc
)
"""


class Fail(Exception):
    pass


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("name")
    ap.add_argument("description", nargs="?", default=None)
    ap.add_argument("--root", default=".")
    ap.add_argument("--dry-run", action="store_true")
    a = ap.parse_args(argv)
    root = os.path.abspath(a.root)
    name = a.name
    if not re.fullmatch(r"[a-z][a-z0-9_]*", name):
        print(f"scaffold_kernel: '{name}' is not a kernel name (lower case, digits, '_')", file=sys.stderr)
        return 2
    description = a.description or f"{name} (scaffold: describe it in one line)"
    description = description.replace("\\", "").replace('"', "'")
    v = {"name": name, "Name": "".join(w.capitalize() for w in name.split("_")), "description": description,
         "date": datetime.date.today().isoformat()}
    files = {
        f"include/tessera/{name}.h": HEADER,
        f"src/kernels/{name}/impl.h": IMPL_H,
        f"src/kernels/{name}/api.cc": API_CC,
        f"src/kernels/{name}/reference.cc": REFERENCE_CC,
        f"src/kernels/{name}/implementations.cc": IMPLEMENTATIONS_CC,
        f"src/kernels/{name}/spec.cc": SPEC_CC,
        f"tests/kernels/{name}_test.cc": TEST_CC,
        f"docs/kernels/{name}.md": DOC_MD,
    }
    out = {}
    try:
        if os.path.exists(os.path.join(root, "src", "kernels", name)):
            raise Fail(f"src/kernels/{name} exists already")
        for rel, tpl in files.items():
            if os.path.exists(os.path.join(root, rel)):
                raise Fail(f"{rel} exists already")
            out[rel] = tpl.format(**v)
        cmake = open(os.path.join(root, "CMakeLists.txt"), encoding="utf-8").read()
        blocks = list(re.finditer(r"tessera_add_kernel\(\s*\w+\b.*?\)\n", cmake, flags=re.S))
        if not blocks:
            raise Fail("CMakeLists.txt has no tessera_add_kernel(...) to add after")
        end = blocks[-1].end()
        out["CMakeLists.txt"] = cmake[:end] + "\n" + CMAKE_BLOCK.format(**v) + cmake[end:]
        reg = open(os.path.join(root, "src", "kernels", "registry.cc"), encoding="utf-8").read()
        decl = re.search(r"namespace tessera \{\n(namespace \w+ \{\nconst kernels::KernelSpec& spec\(\);\n\}\n)+", reg)
        entries = re.search(r"(static const std::vector<const KernelSpec\*> specs = \{\n(?:\s*&\w+::spec\(\),\n)+)", reg)
        if not decl or not entries:
            raise Fail("src/kernels/registry.cc: cannot find the spec declarations and the list of kernels")
        reg = reg[: decl.end()] + f"namespace {name} {{\nconst kernels::KernelSpec& spec();\n}}\n" + reg[decl.end():]
        entries = re.search(r"(static const std::vector<const KernelSpec\*> specs = \{\n(?:\s*&\w+::spec\(\),\n)+)", reg)
        out["src/kernels/registry.cc"] = reg[: entries.end()] + f"      &{name}::spec(),\n" + reg[entries.end():]
    except (Fail, OSError) as e:
        print(f"scaffold_kernel: {e}; nothing written", file=sys.stderr)
        return 1
    # Written to temporaries first, then all renamed, then reported (a closed stdout cannot stop
    # the renames half way).
    if a.dry_run:
        for rel in out:
            print(f"would write {rel}")
    else:
        for rel, text in out.items():
            path = os.path.join(root, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path + ".scaffold.tmp", "w", encoding="utf-8") as f:
                f.write(text)
        for rel in out:
            os.replace(os.path.join(root, rel) + ".scaffold.tmp", os.path.join(root, rel))
        for rel in out:
            print(f"wrote {rel}")
    print(f"\n{name}: scaffolded. Build; `tessera list` shows it; {v['Name']}Reference.MatchesHandValues fails "
          f"until src/kernels/{name}/reference.cc is written (docs/ADDING_A_KERNEL.md).")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

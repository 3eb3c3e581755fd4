#!/usr/bin/env python3
"""Clone the latest version of a kernel implementation into the next one (docs/VERSIONS.md).

    python3 scripts/new_version.py KERNEL IMPL [--what-changed "one line"] [--root DIR]

From the repository root (or --root), for KERNEL=linear_cross_entropy IMPL=cpu:

  1. finds the family's latest version in src/kernels/KERNEL/ (cpu.cc, cpu_v2.cc, ...) and copies
     it to the next one (cpu_v2.cc, or cpu_v3.cc when cpu_v2.cc exists, or when impl.h declares a
     cpu_v2 folded into cpu.cc: docs/VERSIONS.md, "fold"), leaving out the source's regions
     between "// new_version: folded versions begin" and "... end" (the folded versions);
  2. renames its versioned symbols: the factory make_cpu_implementation -> make_cpu_v2_implementation,
     the name() it registers under ("cpu" -> "cpu_v2"), the messages that name it (" cpu: ...");
     and declares status() = experimental and what_changed() (a placeholder until you say);
  3. declares the factory in impl.h and registers it in implementations.cc right after the
     version it was cloned from (CUDA: declared as a module implementation, registered by the
     module), so the default dispatch order is unchanged: only current versions are in it;
  4. adds the new file to the same list of the kernel's tessera_add_kernel in CMakeLists.txt
     (CPU_SOURCES, CUDA_SOURCES, ...);
  5. appends a devlog entry to docs/kernels/KERNEL.md from scripts/templates/version_devlog.md.

Parity tests need no edit: tests/kernels/parity_test.cc runs every registered implementation, so
AllKernels/Parity.CheckGrid/KERNEL_cpu_v2_* exist as soon as it builds. The clone builds and passes
parity untouched; then change it, and compare with
    tessera check KERNEL --impl cpu,cpu_v2
    tessera bench KERNEL --impl cpu,cpu_v2      (the "vs ver" column: cpu_v2 median / cpu median)

Nothing is written when any step cannot be done (each edit is prepared first, then all written).
Exit status: 0 done, 1 an edit could not be made (the message says which), 2 bad arguments.
"""
import argparse
import datetime
import os
import re
import sys

VERSION_RE = re.compile(r"^(?P<base>[a-z][a-z0-9_]*?)(?:_v(?P<n>[0-9]+))?$")


class Fail(Exception):
    pass


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def family_of(impl):
    m = VERSION_RE.match(impl)
    if not m:
        raise Fail(f"'{impl}' is not an implementation name (lower case, digits, '_')")
    return m.group("base")


def version_name(base, n):
    return base if n == 1 else f"{base}_v{n}"


def find_versions(kdir, base):
    """{n: filename} of the family's files in the kernel folder (base.cc = version 1)."""
    found = {}
    for fn in sorted(os.listdir(kdir)):
        stem, ext = os.path.splitext(fn)
        if ext not in (".cc", ".cu"):
            continue
        if stem == base:
            found[1] = fn
        else:
            m = re.fullmatch(re.escape(base) + r"_v([0-9]+)", stem)
            if m and int(m.group(1)) >= 2:
                found[int(m.group(1))] = fn
    return found


def sub_once(pattern, repl, text, what, count=1, flags=0):
    new, n = re.subn(pattern, repl, text, count=count, flags=flags)
    if n == 0:
        raise Fail(f"could not find {what}")
    return new


FOLDED_RE = re.compile(r"^// new_version: folded versions begin.*?^// new_version: folded versions end[^\n]*\n\n?",
                       re.S | re.M)


def clone_source(text, old, new, what_changed, src_name):
    # The versions folded into the source file stay there: the clone is the source's own version.
    text = FOLDED_RE.sub("", text)
    factory_old, factory_new = f"make_{old}_implementation", f"make_{new}_implementation"
    if factory_old not in text:
        raise Fail(f"{src_name} defines no {factory_old}()")
    text = text.replace(factory_old, factory_new)
    # name(): the registry key.
    text = sub_once(r'(std::string\s+name\(\)\s*const\s*override\s*\{\s*return\s*)"' + re.escape(old) + r'"',
                    r'\g<1>"' + new + '"', text, f'name() returning "{old}" in {src_name}')
    # Messages and comments that name the version: ("cpu"), " cpu: ..." and `cpu`.
    text = text.replace(f'("{old}")', f'("{new}")').replace(f'" {old}: ', f'" {new}: ')
    text = re.sub(r"(?<![\w\"])" + re.escape(old) + r"(?=: )", new, text)
    # status() and what_changed(): replace the clone's own, or add them after name().
    status = "  VersionStatus status() const override { return VersionStatus::kExperimental; }"
    wc = "  std::string what_changed() const override { return " + cpp_string(what_changed) + "; }"
    if re.search(r"VersionStatus\s+status\(\)\s*const\s*override", text):
        text = re.sub(r"[ \t]*VersionStatus\s+status\(\)\s*const\s*override\s*\{[^}]*\}", status, text, count=1)
    else:
        text = re.sub(r"([ \t]*std::string\s+name\(\)\s*const\s*override\s*\{[^}]*\}\n)",
                      lambda m: m.group(1) + status + "\n", text, count=1)
    if re.search(r"std::string\s+what_changed\(\)\s*const\s*override", text):
        text = re.sub(r"[ \t]*std::string\s+what_changed\(\)\s*const\s*override\s*\{[^}]*\}", lambda m: wc, text, count=1)
    else:
        text = re.sub(r"(\s*VersionStatus\s+status\(\)\s*const\s*override\s*\{[^}]*\}\n)",
                      lambda m: m.group(1) + wc + "\n", text, count=1)
    # A line saying where it came from, after the header comment's first line (replacing the
    # clone's own, when it was a clone).
    text = re.sub(r"//\n// Version \w+, cloned from [^\n]*\n", "", text, count=1)
    first_nl = text.find("\n")
    note = (f"//\n// Version {new}, cloned from {src_name} by scripts/new_version.py "
            f"(status experimental until it is measured; docs/VERSIONS.md).\n")
    return text[: first_nl + 1] + note + text[first_nl + 1:]


def cpp_string(s):
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def edit_impl_h(text, old, new, new_file):
    decl = re.search(r"^std::unique_ptr<Implementation>\s+make_" + re.escape(old) + r"_implementation\(\);\n",
                     text, flags=re.M)
    if not decl:
        raise Fail(f"impl.h declares no make_{old}_implementation()")
    line = (f"// Version {new} of {old} ({new_file}; experimental until promoted, docs/VERSIONS.md).\n"
            f"std::unique_ptr<Implementation> make_{new}_implementation();\n")
    return text[: decl.end()] + line + text[decl.end():]


def edit_implementations(text, old, new, is_cuda):
    if is_cuda:
        # add_module_implementation("cuda", DeviceType::kCUDA, "...");  (maybe over several lines)
        m = re.search(r'[ \t]*reg\.add_module_implementation\(\s*"' + re.escape(old) + r'"[^;]*;\n', text)
        if not m:
            raise Fail(f'implementations.cc declares no module implementation "{old}"')
        indent = re.match(r"[ \t]*", m.group(0)).group(0)
        dev = re.search(r"DeviceType::\w+", m.group(0)).group(0)
        add = (f'{indent}reg.add_module_implementation("{new}", {dev},\n'
               f'{indent}                              "version {new} of {old}, from the device module", {{}},\n'
               f'{indent}                              VersionStatus::kExperimental);  // until the module says\n')
    else:
        m = re.search(r"[ \t]*reg\.add\(make_" + re.escape(old) + r"_implementation\(\)\);[^\n]*\n", text)
        if not m:
            raise Fail(f"implementations.cc does not add make_{old}_implementation()")
        indent = re.match(r"[ \t]*", m.group(0)).group(0)
        add = f"{indent}reg.add(make_{new}_implementation());  // experimental: not in the default order\n"
    return text[: m.end()] + add + text[m.end():]


def edit_module_registration(text, old, new):
    """A CUDA module source registers its implementation itself; the clone registers the new one."""
    return text.replace(f"registry().add(make_{old}_implementation())", f"registry().add(make_{new}_implementation())")


def edit_cmake(text, kernel, old_file, new_file):
    m = re.search(r"tessera_add_kernel\(\s*" + re.escape(kernel) + r"\b(.*?)\)", text, flags=re.S)
    if not m:
        raise Fail(f"CMakeLists.txt has no tessera_add_kernel({kernel} ...)")
    block = m.group(0)
    new_block, n = re.subn(r"(?<=[\s])" + re.escape(old_file) + r"(?=[\s)])", old_file + " " + new_file, block, count=1)
    if n == 0:
        raise Fail(f"tessera_add_kernel({kernel} ...) does not list {old_file}")
    return text[: m.start()] + new_block + text[m.end():]


def devlog_entry(root, kernel, old, new, src_file, new_file, what_changed):
    tpl_path = os.path.join(root, "scripts", "templates", "version_devlog.md")
    if not os.path.exists(tpl_path):
        tpl_path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "templates", "version_devlog.md")
    tpl = read(tpl_path)
    values = {"kernel": kernel, "old": old, "new": new, "src_file": src_file, "new_file": new_file,
              "what_changed": what_changed, "date": datetime.date.today().isoformat()}
    for k, v in values.items():
        tpl = tpl.replace("{" + k + "}", v)
    return tpl


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("kernel")
    ap.add_argument("impl", help="the implementation family (cpu, cuda) or any of its versions")
    ap.add_argument("--what-changed", default="TODO: one line on what this version changes",
                    help="the version's one-line what_changed() (default: a placeholder)")
    ap.add_argument("--root", default=".", help="repository root (default: the current directory)")
    ap.add_argument("--dry-run", action="store_true", help="say what would be written, write nothing")
    a = ap.parse_args(argv)
    root = os.path.abspath(a.root)
    try:
        kdir = os.path.join(root, "src", "kernels", a.kernel)
        if not os.path.isdir(kdir):
            raise Fail(f"no kernel folder {kdir}")
        base = family_of(a.impl)
        versions = find_versions(kdir, base)
        if not versions:
            raise Fail(f"no {base}.cc / {base}.cu in {kdir}")
        latest = max(versions)
        # Versions folded into a file (docs/VERSIONS.md, "fold": registered, no file of their own)
        # keep their numbers: the clone is numbered after every version impl.h declares.
        impl_h = os.path.join(kdir, "impl.h")
        declared = [int(n or 1) for n in re.findall(r"\bmake_" + re.escape(base) + r"(?:_v([0-9]+))?_implementation\(",
                                                       read(impl_h))] if os.path.exists(impl_h) else []
        old, new = version_name(base, latest), version_name(base, max([latest] + declared) + 1)
        src_file = versions[latest]
        ext = os.path.splitext(src_file)[1]
        new_file = new + ext
        is_cuda = ext == ".cu"
        if os.path.exists(os.path.join(kdir, new_file)):
            raise Fail(f"{new_file} exists already")

        paths = {
            "src": os.path.join(kdir, new_file),
            "impl_h": os.path.join(kdir, "impl.h"),
            "impls": os.path.join(kdir, "implementations.cc"),
            "cmake": os.path.join(root, "CMakeLists.txt"),
            "doc": os.path.join(root, "docs", "kernels", a.kernel + ".md"),
        }
        out = {}
        src_text = clone_source(read(os.path.join(kdir, src_file)), old, new, a.what_changed, src_file)
        if is_cuda:
            src_text = edit_module_registration(src_text, old, new)
            # The version's own kernel headers (cuda_kernels.cuh for cuda): __global__ functions
            # have external linkage, so two versions including one header would define them
            # twice in the module. Each version gets its copy, its namespace renamed with it.
            for hdr in re.findall(r'#include "kernels/' + re.escape(a.kernel) + r"/(" + re.escape(old) + r'_\w+\.cuh)"',
                                  src_text):
                stem_old = os.path.splitext(hdr)[0]
                stem_new = new + stem_old[len(old):]
                new_hdr = stem_new + ".cuh"
                if os.path.exists(os.path.join(kdir, new_hdr)):
                    raise Fail(f"{new_hdr} exists already")
                hdr_text = re.sub(r"\b" + re.escape(stem_old) + r"\b", stem_new, read(os.path.join(kdir, hdr)))
                key = "hdr:" + new_hdr
                paths[key] = os.path.join(kdir, new_hdr)
                out[key] = hdr_text
                src_text = re.sub(r"\b" + re.escape(stem_old) + r"\b", stem_new, src_text)
        out["src"] = src_text
        out["impl_h"] = edit_impl_h(read(paths["impl_h"]), old, new, new_file)
        out["impls"] = edit_implementations(read(paths["impls"]), old, new, is_cuda)
        out["cmake"] = edit_cmake(read(paths["cmake"]), a.kernel, src_file, new_file)
        doc = read(paths["doc"]) if os.path.exists(paths["doc"]) else f"# {a.kernel}\n\n## Devlog\n"
        if "## Devlog" not in doc:
            doc = doc.rstrip("\n") + "\n\n## Devlog\n"
        out["doc"] = doc.rstrip("\n") + "\n\n" + devlog_entry(root, a.kernel, old, new, src_file, new_file,
                                                               a.what_changed)
    except (Fail, OSError) as e:
        print(f"new_version: {e}; nothing written", file=sys.stderr)
        return 1

    # Every file is written to a temporary beside it first, then all are renamed, then reported:
    # nothing interrupts the renames half way (not even a closed stdout).
    if a.dry_run:
        for key in out:
            print(f"would write {os.path.relpath(paths[key], root)}")
    else:
        for key, text in out.items():
            with open(paths[key] + ".new_version.tmp", "w", encoding="utf-8") as f:
                f.write(text)
        for key in out:
            os.replace(paths[key] + ".new_version.tmp", paths[key])
        for key in out:
            print(f"wrote {os.path.relpath(paths[key], root)}")
    print(f"\n{a.kernel}: {new} cloned from {old} ({src_file} -> {new_file}), status experimental.\n"
          f"Next: build, then\n"
          f"  tessera list --verbose                       # {new} [experimental] and what changed\n"
          f"  tessera check {a.kernel} --impl {old},{new}\n"
          f"  tessera bench {a.kernel} --impl {old},{new}   # 'vs version' = {new} median / {old} median\n"
          f"Edit {new_file}, set what_changed(), fill the devlog entry in docs/kernels/{a.kernel}.md with "
          f"measured numbers; promote it with status() current (docs/VERSIONS.md).")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

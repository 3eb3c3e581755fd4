#include "common.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <optional>

#include "dispatch/dispatch.h"
#include "tessera/error.h"

namespace tessera::cli {
namespace {

int g_exit = 0;

// The kernels `parent` has a subcommand for ("a, b"): tune lists only the tunable ones.
std::string kernel_subcommands(CLI::App* parent) {
  std::string out;
  for (const CLI::App* sub : parent->get_subcommands([](CLI::App*) { return true; }))
    out += (out.empty() ? "" : ", ") + sub->get_name();
  return out;
}

// The error for a word that names no subcommand of `parent`: a kernel that `parent` does not
// take (tune paged_attention: nothing to tune) is said so, anything else is an unknown kernel.
Error not_a_kernel_of(CLI::App* parent, const std::string& word) {
  const std::string known = kernel_subcommands(parent);
  for (const kernels::KernelSpec* k : kernels::all())
    if (k->name == word)
      return Error(ErrorCode::kNotFound, parent->get_name() + ": kernel '" + word + "' has nothing for " +
                                             parent->get_name() + " (it takes: " + known + ")");
  return Error(ErrorCode::kNotFound, parent->get_name() + ": unknown kernel '" + word + "' (kernels: " + known + ")");
}

// Runs once `parent` has parsed its words, before any subcommand's callback: a word it did not
// take is refused here (nothing has run, nothing is written). No allow_extras anywhere: a kernel
// subcommand refuses its own unknown words through CLI11 (ExtrasError).
void kernel_words(CLI::App* parent, bool required) {
  parent->require_subcommand(0, 1);
  parent->parse_complete_callback([parent, required] {
    const auto extras = parent->remaining(false);
    const bool named = !parent->get_subcommands().empty();
    if (!named && !extras.empty() && extras.front().rfind("-", 0) != 0) throw not_a_kernel_of(parent, extras.front());
    if (!extras.empty()) throw CLI::ExtrasError(parent->get_name(), extras);
    if (!named && required)
      throw Error(ErrorCode::kInvalidArgument,
                  parent->get_name() + " needs a kernel: one of " + kernel_subcommands(parent) + " (tessera " +
                      parent->get_name() + " KERNEL --help)");
  });
}

}  // namespace

void set_exit_code(int code) { g_exit = std::max(g_exit, code); }
int exit_code() { return g_exit; }

void build_app(CLI::App& app) {
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("tessera ") + TESSERA_VERSION);
  register_list(app);
  register_roofline(app);
  register_bench(app);
  register_report(app);
  register_check(app);
  register_run(app);
  register_tune(app);
  register_new_version(app);
}

void require_kernel(CLI::App* parent) { kernel_words(parent, true); }
void optional_kernel(CLI::App* parent) { kernel_words(parent, false); }

std::function<harness::OptionValues()> add_kernel_options(CLI::App* cmd,
                                                          const std::vector<harness::OptionSpec>& specs) {
  using K = harness::OptionSpec::Kind;
  auto values = std::make_shared<std::map<std::string, std::string>>();
  auto flags = std::make_shared<std::map<std::string, bool>>();
  for (const auto& s : specs) {
    std::string flag = "--" + harness::kebab_case(s.name);
    for (const std::string& alias : s.aliases) flag += ",--" + alias;
    if (s.kind == K::kFlag) {  // one that is on by default is turned off by --no-NAME
      const bool on = s.default_value == "true";
      (*flags)[s.name] = on;
      cmd->add_flag(on ? flag + ",!--no-" + harness::kebab_case(s.name) : flag, (*flags)[s.name], s.help);
      continue;
    }
    auto* opt = cmd->add_option(flag, (*values)[s.name], s.help);
    if (!s.default_value.empty()) opt->default_str(s.default_value);
    if (!s.choices.empty()) opt->check(CLI::IsMember(s.choices));
    if (s.kind == K::kInt) opt->check(CLI::Number);
    if (s.kind == K::kFloat) opt->check(CLI::Number);
  }
  return [specs, values, flags] {
    harness::OptionValues v = harness::defaults_of(specs);
    for (const auto& [name, text] : *values)
      if (!text.empty()) v.set(name, text);
    for (const auto& [name, on] : *flags) v.set(name, on ? "true" : "false");
    return v;
  };
}

void add_pass_option(CLI::App* cmd, std::vector<std::string>& storage) {
  cmd->add_option("--pass", storage, "forward, backward, fused (comma-separated; default: all the kernel has)")
      ->delimiter(',')
      ->allow_extra_args(false)  // one value per --pass: a stray word after it is refused, not eaten
      ->check(CLI::IsMember({"forward", "backward", "fused", "fwd", "bwd", "all"}));
}

std::vector<Pass> parse_passes(const std::vector<std::string>& names, const kernels::KernelSpec& k) {
  if (names.empty() || std::find(names.begin(), names.end(), "all") != names.end()) return k.passes;
  std::vector<Pass> out;
  for (const auto& n : names) {
    const Pass p = parse_pass(n);
    check(std::find(k.passes.begin(), k.passes.end(), p) != k.passes.end(), ErrorCode::kInvalidArgument,
          k.name + " has no " + pass_name(p) + " pass");
    if (std::find(out.begin(), out.end(), p) == out.end()) out.push_back(p);
  }
  return out;
}

std::vector<DType> parse_float_dtypes(const std::string& list, const kernels::KernelSpec& k) {
  std::vector<DType> out;
  std::string takes;
  for (DType t : k.dtypes) takes += (takes.empty() ? "" : ", ") + std::string(dtype_name(t));
  for (const std::string& d : dispatch::split_names(list)) {
    std::optional<DType> t;
    try {
      t = parse_dtype(d);  // f32, float32, bf16, bfloat16, ...
    } catch (const Error&) {
    }
    check(t && std::find(k.dtypes.begin(), k.dtypes.end(), *t) != k.dtypes.end(), ErrorCode::kInvalidArgument,
          "--dtype: " + k.name + " takes no '" + d + "' inputs (it takes " + takes + ")");
    out.push_back(*t);
  }
  check(!out.empty(), ErrorCode::kInvalidArgument, "--dtype is empty");
  return out;
}

namespace {

namespace fs = std::filesystem;

[[noreturn]] void refuse(const PathArg& a, const std::string& why) {
  throw Error(ErrorCode::kInvalidArgument, a.flag + " " + a.path + ": " + why + "; nothing was run");
}

// The nearest ancestor of `p` that exists, walking the path as written: no normalization, so
// "afile/../x" stops at afile as the write would (a file is no directory to go up from).
fs::path existing_ancestor(fs::path p) {
  std::error_code ec;
  while (!fs::exists(p, ec) && p.has_parent_path() && p != p.parent_path()) p = p.parent_path();
  return p;
}

// `dir` (absolute, as written) is a directory this user can create files in, or missing below one.
void can_make_dir(const PathArg& a, const fs::path& dir) {
  std::error_code ec;
  const fs::path at = existing_ancestor(dir);
  if (!fs::is_directory(at, ec))
    refuse(a, at == fs::absolute(a.path) ? "is not a directory" : at.string() + " is not a directory");
  if (::access(at.c_str(), W_OK | X_OK) != 0) refuse(a, "cannot create files in " + at.string());
}

// Two names of one file (a link, "./a" and "a"): their canonical forms, missing parts kept. For
// the comparisons only: the writers put a temp file beside the path as given and rename it there.
fs::path identity(const std::string& path) {
  std::error_code ec;
  const fs::path c = fs::weakly_canonical(fs::absolute(path), ec);
  return ec ? fs::absolute(path).lexically_normal() : c;
}

// A file output as the writers see it: a temp file beside the path as given, renamed over it (a
// read-only file or a link is replaced; its own permissions do not matter, its directory's do).
void check_file_output(const PathArg& f) {
  std::error_code ec;
  if (f.path.back() == '/') refuse(f, "ends in '/': a directory's name, not a file's");
  const fs::path given = fs::absolute(f.path);
  const fs::file_status st = fs::status(given, ec);
  if (fs::is_directory(st)) refuse(f, "is a directory");
  if (fs::exists(st) && !fs::is_regular_file(st))
    refuse(f, "is not a regular file (a device or a pipe: the write would replace it with one)");
  can_make_dir(f, given.parent_path());
}

}  // namespace

void check_outputs(const std::vector<PathArg>& files, const std::vector<PathArg>& dirs,
                   const std::vector<PathArg>& inputs) {
  for (const PathArg& d : dirs)  // first: a file in a directory that cannot be is refused as that
    if (!d.path.empty()) can_make_dir(d, fs::absolute(d.path));
  std::vector<std::pair<fs::path, const PathArg*>> seen;
  for (const PathArg& f : files) {
    if (f.path.empty()) continue;
    check_file_output(f);
    const fs::path p = identity(f.path);
    for (const auto& [q, other] : seen)
      if (q == p) refuse(f, "is also " + other->flag + "'s file");
    for (const PathArg& in : inputs)
      if (!in.path.empty() && identity(in.path) == p) refuse(f, "is the " + in.flag + " file this command reads");
    seen.push_back({p, &f});
  }
}

}  // namespace tessera::cli

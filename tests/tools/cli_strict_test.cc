// Every `tessera` subcommand refuses what it does not know: an unknown option, a stray word or a
// misspelled flag is a one-line error naming the word, exit code 2, and nothing is written (the
// --out directory is not even created). Kernels and their flags are read from the tool's own
// --help, so every kernel a registration adds is covered without editing this file.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "tools/cli_test_util.h"

namespace {

namespace fs = std::filesystem;
using tessera::cli_test::Cmd;
using tessera::cli_test::run_cli;

// The names listed under "Subcommands:" in `tessera <sub> --help`.
std::vector<std::string> subcommands_of(const std::string& sub) {
  const Cmd c = run_cli(sub + " --help");
  std::vector<std::string> out;
  std::istringstream in(c.out);
  std::string line;
  bool in_list = false;
  while (std::getline(in, line)) {
    if (line.rfind("Subcommands:", 0) == 0) {
      in_list = true;
      continue;
    }
    if (!in_list || line.size() < 3 || line[0] != ' ' || line[2] == ' ') continue;
    out.push_back(line.substr(2, line.find(' ', 2) - 2));
  }
  return out;
}

struct Flags {
  std::set<std::string> all;            // every long option, "--x"
  std::vector<std::string> required;    // those marked REQUIRED
};

// The long options of `tessera <cmd> --help` (lines "  -h,--help ...", "  --x TEXT REQUIRED ...").
Flags flags_of(const std::string& cmd) {
  const Cmd c = run_cli(cmd + " --help");
  Flags f;
  std::istringstream in(c.out);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("  -", 0) != 0) continue;
    const std::string names = line.substr(2, line.find(' ', 2) - 2);
    std::istringstream parts(names);
    std::string n;
    while (std::getline(parts, n, ','))
      if (n.rfind("--", 0) == 0) {
        f.all.insert(n);
        if (line.find(" REQUIRED") != std::string::npos) f.required.push_back(n);
      }
  }
  return f;
}

// A plausible typo of the longest flag (two middle letters swapped: --grad -> --gard) that
// names no flag.
std::string misspelled(const Flags& f) {
  std::string longest;
  for (const auto& n : f.all)
    if (n != "--help" && n.size() > longest.size()) longest = n;
  for (size_t i = longest.size() / 2; i + 1 < longest.size(); ++i) {
    std::string t = longest;
    std::swap(t[i], t[i + 1]);
    if (t != longest && !f.all.count(t)) return t;
  }
  return longest + "x";
}

class CliStrict : public ::testing::Test {
 protected:
  void SetUp() override {
    dir = tessera::cli_test::fresh_test_dir("tessera_cli_strict");
    out = (dir / "out").string();
  }
  void TearDown() override { fs::remove_all(dir); }

  // `args` must be refused: exit 2, one line "tessera: error: ..." naming `bad`, no --out.
  void refused(const std::string& args, const std::string& bad) {
    const Cmd c = run_cli(args);
    EXPECT_EQ(c.code, 2) << args << "\n" << c.out;
    EXPECT_EQ(c.out.rfind("tessera: error: ", 0), 0u) << args << "\n" << c.out;
    EXPECT_EQ(std::count(c.out.begin(), c.out.end(), '\n'), 1) << args << "\n" << c.out;
    EXPECT_NE(c.out.find(bad), std::string::npos) << args << "\n" << c.out;
    EXPECT_FALSE(fs::exists(out)) << args << ": wrote " << out;
  }
  // The three mistakes at the end of `cmd + rest`, and (a command without positionals) a stray
  // word right after the command words.
  void refuses_mistakes(const std::string& cmd, const std::string& rest, bool positionals = false) {
    const Flags f = flags_of(cmd);
    ASSERT_FALSE(f.all.empty()) << cmd;
    const std::string typo = misspelled(f);
    SCOPED_TRACE(cmd + " (typo " + typo + ")");
    refused(cmd + rest + " --bogus 3", "--bogus");
    refused(cmd + rest + " stray", "stray");
    refused(cmd + rest + " " + typo + " 1", typo);
    if (!positionals) refused(cmd + " stray" + rest, "stray");
  }
  // Dummy values for the required options of `cmd` (the parse fails before any is read).
  std::string required_args(const std::string& cmd) {
    std::string s;
    for (const auto& r : flags_of(cmd).required)
      if (r != "--out") s += " " + r + " " + (dir / (r.substr(2) + ".npy")).string();
    return s;
  }

  fs::path dir;
  std::string out;
};

TEST_F(CliStrict, TheToolSeesEveryKernel) {
  // The parsing helpers above must see the kernels, or the loops below test nothing.
  for (const char* sub : {"run", "bench", "check"}) {
    const auto ks = subcommands_of(sub);
    EXPECT_GE(ks.size(), 3u) << sub;
    EXPECT_NE(std::find(ks.begin(), ks.end(), "linear_cross_entropy"), ks.end()) << sub;
  }
  EXPECT_GE(subcommands_of("tune").size(), 1u);
  const Flags f = flags_of("run linear_cross_entropy");
  EXPECT_TRUE(f.all.count("--grad"));
  EXPECT_NE(std::find(f.required.begin(), f.required.end(), "--x"), f.required.end());
}

// The issue's case: --weights (not an option of the kernel) was ignored and the run succeeded.
TEST_F(CliStrict, RunRefusesAnOptionTheKernelDoesNotHave) {
  const std::string cmd = "run linear_cross_entropy";
  refused(cmd + required_args(cmd) + " --weights " + (dir / "t.npy").string() + " --out " + out, "--weights");
  refused(cmd + required_args(cmd) + " --gard --out " + out, "--gard");
}

TEST_F(CliStrict, RunRefusesMistakesForEveryKernel) {
  for (const std::string& k : subcommands_of("run")) {
    const std::string cmd = "run " + k;
    refuses_mistakes(cmd, required_args(cmd) + " --out " + out);
  }
}

TEST_F(CliStrict, BenchRefusesMistakesForEveryKernel) {
  for (const std::string& k : subcommands_of("bench"))
    refuses_mistakes("bench " + k, " --json " + out + "/b.json --csv " + out + "/b.csv");
}

TEST_F(CliStrict, TuneRefusesMistakesForEveryKernel) {
  for (const std::string& k : subcommands_of("tune")) refuses_mistakes("tune " + k, " --out " + out);
}

TEST_F(CliStrict, CheckRefusesMistakesForEveryKernelAndAlone) {
  for (const std::string& k : subcommands_of("check")) refuses_mistakes("check " + k, " --quick");
  refused("check --quick --bogus", "--bogus");
  refused("check --quik", "--quik");
}

TEST_F(CliStrict, OtherSubcommandsRefuseMistakes) {
  const std::string bench_json = (dir / "bench.json").string();
  std::ofstream(bench_json) << R"({"schema": "tessera-bench/2", "kernel": "k", "rows": []})";
  refuses_mistakes("list", "");
  refuses_mistakes("roofline", " --quick --out " + out + "/r.json");
  refuses_mistakes("report", " " + bench_json + " -o " + out + "/r.html", true);
  refuses_mistakes("new-version", " linear_cross_entropy cpu --dry-run --root " + out, true);
  refused("--bogus", "--bogus");
  refused("bogus", "bogus");
}

TEST_F(CliStrict, UnknownKernelIsNamedWithTheKnownOnes) {
  for (const char* sub : {"run", "bench", "tune", "check"}) {
    refused(std::string(sub) + " no_such_kernel --out " + out, "unknown kernel 'no_such_kernel' (kernels: ");
    const Cmd c = run_cli(std::string(sub) + " no_such_kernel");
    EXPECT_NE(c.out.find("linear_cross_entropy"), std::string::npos) << c.out;
  }
  // tune takes the tunable kernels only: a kernel without block sizes is not "unknown", and the
  // list names what tune takes (it once said "unknown kernel 'paged_attention' (kernels: ...,
  // paged_attention, ...)").
  refused("tune paged_attention --list", "tune: kernel 'paged_attention' has nothing for tune (it takes: ");
  const Cmd t = run_cli("tune no_such_kernel");
  EXPECT_NE(t.out.find("mla_decode"), std::string::npos) << t.out;
  EXPECT_EQ(t.out.find("paged_attention"), std::string::npos) << "not a tune subcommand: " << t.out;
  // A word before the kernel belongs to the subcommand, which does not know it either.
  refused("run --bogus linear_cross_entropy" + required_args("run linear_cross_entropy") + " --out " + out, "--bogus");
}

// The refused command lines differ from accepted ones by the bad word only.
TEST_F(CliStrict, TheSameCommandWithoutTheMistakeRuns) {
  const Cmd c = run_cli("tune linear_cross_entropy --list --out " + out);
  EXPECT_EQ(c.code, 0) << c.out;
  const Cmd l = run_cli("list");
  EXPECT_EQ(l.code, 0) << l.out;
}

}  // namespace

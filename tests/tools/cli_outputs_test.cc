// What a user scripting the CLI relies on besides the numbers (a review of `tessera` as a user,
// 2026-11-29): output paths are checked before any work (a long bench or sweep never ends in
// "cannot write"), no command writes over a file it reads or one output over another, a command
// that did nothing says so in its exit code, and the messages name the real cause.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>

#include "cpu_backend.h"
#include "scoped_env.h"
#include "harness/npy.h"
#include "tools/cli_test_util.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using cli_test::Cmd;

class CliOutputs : public ::testing::Test {
 protected:
  void SetUp() override {
    dir = cli_test::fresh_test_dir("tessera_cli_outputs");
    fs::create_directories(dir / "a_dir");
    std::ofstream(p("a_file")) << "x";
    save("x.npy", DType::kF32, {3, 4});
    save("w.npy", DType::kF32, {6, 4});
    Tensor y = Tensor::empty(DType::kI64, {3});
    for (int64_t i = 0; i < 3; ++i) y.data_as<int64_t>()[i] = i;
    npy::save(p("y.npy"), y);
    for (const char* n : {"q.npy", "k.npy", "v.npy"}) save(n, DType::kF32, {1, 5, 2, 8});
    save("g_rhs.npy", DType::kF32, {2, 4, 5});  // grouped_matmul: x.npy [3, 4] as lhs
    Tensor gs = Tensor::empty(DType::kI64, {2});
    gs.data_as<int64_t>()[0] = 1, gs.data_as<int64_t>()[1] = 2;
    npy::save(p("g_sizes.npy"), gs);
  }
  void TearDown() override { fs::remove_all(dir); }
  std::string p(const std::string& name) const { return (dir / name).string(); }
  void save(const std::string& name, DType dt, const Shape& shape) {
    Tensor t = Tensor::empty(dt, shape);
    for (int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = 0.01f * static_cast<float>(i % 37);
    npy::save(p(name), t);
  }
  Cmd sh(const std::string& args) const { return cli_test::run_cli(args); }
  Cmd bench(const std::string& args) const {
    return sh("bench linear_cross_entropy --shape 8,8,16 --no-roofline --no-gemm --impl reference --pass forward "
              "--repeats 1 -q " + args);
  }
  std::string lce_run() const {
    return "run linear_cross_entropy --x " + p("x.npy") + " --w " + p("w.npy") + " --labels " + p("y.npy");
  }
  std::string attention_run() const {
    return "run attention --q " + p("q.npy") + " --k " + p("k.npy") + " --v " + p("v.npy");
  }
  static std::string text(const std::string& path) {
    std::ifstream f(path);
    return {std::istreambuf_iterator<char>(f), {}};
  }
  fs::path dir;
  testing::ScopedEnv no_autotune{"TESSERA_AUTOTUNE", "0"};  // the commands inherit it
};

bool has(const Cmd& c, const std::string& s) { return c.out.find(s) != std::string::npos; }

// A refused output path is refused before the first row is timed, and nothing else is written.
TEST_F(CliOutputs, BenchChecksEveryOutputBeforeTiming) {
  Cmd c = bench("--trace " + p("a_dir") + " --json " + p("r.json"));
  EXPECT_EQ(c.code, 2) << c.out;
  EXPECT_TRUE(has(c, "--trace " + p("a_dir") + ": is a directory; nothing was run")) << c.out;
  EXPECT_FALSE(fs::exists(p("r.json")));
  c = bench("--json " + p("same") + " --csv " + p("same"));
  EXPECT_EQ(c.code, 2) << c.out;
  EXPECT_TRUE(has(c, "is also --json's file")) << c.out;
  EXPECT_FALSE(fs::exists(p("same")));
  c = bench("--json " + p("a_file/r.json"));
  EXPECT_EQ(c.code, 2) << c.out;
  EXPECT_TRUE(has(c, "is not a directory")) << c.out;
}

// What the writers do (a temp file beside the path as given, renamed over it) decides what is
// refused: a read-only file or a link is replaced, as before the checks; a device or pipe, a name
// ending in '/', a path through a file ("afile/../x") are refused before the run (a second review).
TEST_F(CliOutputs, OutputChecksFollowWhatTheWritersDo) {
  std::ofstream(p("ro.json")) << "{}";
  fs::permissions(p("ro.json"), fs::perms::owner_read | fs::perms::group_read | fs::perms::others_read);
  Cmd c = bench("--json " + p("ro.json"));
  EXPECT_EQ(c.code, 0) << c.out;  // was "is not writable" for a non-root user
  fs::create_directories(p("elsewhere"));
  std::ofstream(p("elsewhere/target.json")) << "{}";
  fs::create_symlink(p("elsewhere/target.json"), p("link.json"));
  c = bench("--json " + p("link.json"));
  EXPECT_EQ(c.code, 0) << c.out;
  ASSERT_EQ(::mkfifo(p("fifo").c_str(), 0600), 0);
  c = bench("--json " + p("fifo"));
  EXPECT_EQ(c.code, 2) << c.out;
  EXPECT_TRUE(has(c, "is not a regular file")) << c.out;
  c = bench("--json " + p("newdir") + "/");
  EXPECT_EQ(c.code, 2) << c.out;
  EXPECT_TRUE(has(c, "ends in '/'")) << c.out;
  EXPECT_FALSE(fs::exists(p("newdir")));
  c = bench("--json " + p("a_file/../x.json"));
  EXPECT_EQ(c.code, 2) << c.out;
  EXPECT_TRUE(has(c, p("a_file") + " is not a directory")) << c.out;  // names the file in the way
  c = sh("roofline --quick --no-gpu --out " + p("a_file/r.json"));
  EXPECT_EQ(c.code, 2) << c.out;
  EXPECT_FALSE(has(c, "GFLOP/s")) << c.out;  // refused before measuring
}

// The results over the grid file that made them lost the grids (the next bench failed).
TEST_F(CliOutputs, BenchNeverWritesOverItsGridFile) {
  fs::copy_file(std::string(TESSERA_TEST_SOURCE_DIR) + "/bench/linear_cross_entropy.json", p("grid.json"));
  const std::string before = text(p("grid.json"));
  const Cmd c = sh("bench linear_cross_entropy --grid-file " + p("grid.json") + " --json " + p("grid.json") +
                   " --no-roofline -q");
  EXPECT_EQ(c.code, 2) << c.out;
  EXPECT_TRUE(has(c, "is the --grid-file file this command reads")) << c.out;
  EXPECT_EQ(text(p("grid.json")), before);
  // The grid file the tool finds itself ($TESSERA_BENCH_DIR here) is protected the same way.
  fs::create_directories(p("bd"));
  fs::copy_file(p("grid.json"), p("bd/linear_cross_entropy.json"));
  const testing::ScopedEnv bench_dir("TESSERA_BENCH_DIR", p("bd").c_str());
  const Cmd d = sh("bench linear_cross_entropy --json " + p("bd/linear_cross_entropy.json") + " --no-roofline -q");
  EXPECT_EQ(d.code, 2) << d.out;
  EXPECT_EQ(text(p("bd/linear_cross_entropy.json")), before);
}

TEST_F(CliOutputs, BenchRefusesSettingsThatMeanNothing) {
  EXPECT_EQ(bench("--max-seconds -1").code, 2);
  EXPECT_EQ(bench("--max-seconds nan").code, 2);
  EXPECT_EQ(bench("--threads -3").code, 2);
  EXPECT_EQ(sh(lce_run() + " --threads -3 --out " + p("o")).code, 2);
  EXPECT_FALSE(fs::exists(p("o")));
  Cmd c = sh("bench attention --grid-file " + std::string(TESSERA_TEST_SOURCE_DIR) + "/bench/mlstm.json -q");
  EXPECT_EQ(c.code, 2) << c.out;
  EXPECT_TRUE(has(c, "holds grids of mlstm, not of attention")) << c.out;
  c = bench("--dtype f64");
  EXPECT_EQ(c.code, 2) << c.out;
  EXPECT_TRUE(has(c, "takes no 'f64' inputs (it takes f32, bf16, f16)")) << c.out;  // no i32 / i64 offered
}

TEST_F(CliOutputs, TuneChecksItsOutputsBeforeTheSweep) {
  Cmd c = sh("tune grouped_matmul --dtype f32 --out " + p("a_file"));
  EXPECT_EQ(c.code, 2) << c.out;
  EXPECT_TRUE(has(c, "--out " + p("a_file") + ": is not a directory; nothing was run")) << c.out;
  c = sh("tune grouped_matmul --dtype f32 --table " + p("t.cc") + " --out " + p("o"));
  EXPECT_EQ(c.code, 2) << c.out;  // it was ignored without --emit-table
  EXPECT_TRUE(has(c, "give both")) << c.out;
  EXPECT_FALSE(fs::exists(p("o")));
  c = sh("tune grouped_matmul --buckets , --dtype f32 --out " + p("o"));
  EXPECT_EQ(c.code, 1) << c.out;  // nothing timed: as bench, exit 1 and no empty result files
  EXPECT_TRUE(has(c, "tune: nothing was timed")) << c.out;
  EXPECT_TRUE(!fs::exists(p("o")) || fs::is_empty(p("o")));
}

TEST_F(CliOutputs, ReportNeverWritesOverItsInputs) {
  std::ofstream(p("b.json")) << R"({"schema": "tessera-bench/2", "kernel": "k", "dims": [], "rows": []})";
  const std::string before = text(p("b.json"));
  Cmd c = sh("report " + p("b.json") + " -o " + p("b.json"));
  EXPECT_EQ(c.code, 2) << c.out;
  EXPECT_TRUE(has(c, "is the input file this command reads")) << c.out;
  EXPECT_EQ(text(p("b.json")), before);
  std::ofstream(p("predict.json")) << R"({"schema": "tessera-predict/1", "kernel": "k", "rows": []})";
  c = sh("report " + p("predict.json") + " -o " + p("r.html"));
  EXPECT_EQ(c.code, 2) << c.out;
  EXPECT_TRUE(has(c, "is not a `tessera bench --json` file")) << c.out;
  EXPECT_FALSE(fs::exists(p("r.html")));
  c = sh("report " + p("b.json") + " -o " + p("r.SVG"));
  EXPECT_EQ(c.code, 0) << c.out;
  EXPECT_EQ(text(p("r.SVG")).rfind("<?xml", 0), 0u);  // the extension in any case
}

// A kernel that lacks the pass or the implementation is skipped, not the end of the run; a name
// no kernel takes is still an error before anything runs.
TEST_F(CliOutputs, CheckOfEveryKernelSkipsThoseThatLackAPassOrImplementation) {
  TESSERA_SKIP_WITHOUT_CPU_BACKEND();  // cpu_v2
  Cmd c = sh("check --impl cpu_v2 --pass forward --quick");
  EXPECT_EQ(c.code, 0) << c.out;
  EXPECT_TRUE(has(c, "SKIP kernel: attention: no implementation named 'cpu_v2'")) << c.out;
  EXPECT_TRUE(has(c, "check: ")) << c.out;
  c = sh("check --impl no_such_impl --quick");
  EXPECT_EQ(c.code, 2) << c.out;
  EXPECT_FALSE(has(c, "ok  ")) << c.out;
  c = sh("check --impl cpu attention --impl reference --quick");
  EXPECT_EQ(c.code, 2) << c.out;
  EXPECT_TRUE(has(c, "give one")) << c.out;
}

// --pass before the kernel's name and after it add up (the second replaced the first).
TEST_F(CliOutputs, CheckPassesBeforeAndAfterTheKernelAddUp) {
  const Cmd c = sh("check --pass forward grouped_matmul --pass backward --impl reference --quick");
  EXPECT_EQ(c.code, 0) << c.out;
  EXPECT_TRUE(has(c, " forward ")) << c.out;
  EXPECT_TRUE(has(c, " backward ")) << c.out;
}

TEST_F(CliOutputs, RunChecksItsOutputDirectoryBeforeComputing) {
  Cmd c = sh(lce_run() + " --out " + p("a_file"));
  EXPECT_EQ(c.code, 2) << c.out;
  EXPECT_TRUE(has(c, "--out " + p("a_file") + ": is not a directory; nothing was run")) << c.out;
  EXPECT_FALSE(has(c, "implementation=")) << c.out;  // no result line that reads as success
  fs::create_directories(p("out/loss.npy"));
  c = sh(lce_run() + " --out " + p("out"));
  EXPECT_EQ(c.code, 2) << c.out;
  EXPECT_TRUE(has(c, "loss.npy: is a directory")) << c.out;
  EXPECT_FALSE(has(c, "implementation=")) << c.out;
}

// The caller's own block sizes, refused by the backend: no tuned table to blame (a 0 reads as "not
// given" to the choice, which then took the table's row, and the refusal named it).
TEST_F(CliOutputs, RefusedBlockSizesOfTheCallBlameNoTable) {
  TESSERA_SKIP_WITHOUT_CPU_BACKEND();  // the reference ignores block sizes
  for (const std::string& run : {attention_run() + " --block-sizes q=0,kv=0",
                                 "run grouped_matmul --lhs " + p("x.npy") + " --rhs " + p("g_rhs.npy") +
                                     " --group-sizes " + p("g_sizes.npy") + " --block-sizes m=0,n=0"}) {
    const Cmd c = sh(run + " --out " + p("o"));
    EXPECT_EQ(c.code, 2) << run << "\n" << c.out;
    EXPECT_TRUE(has(c, "cpu: ") && has(c, "got")) << c.out;  // the backend's own message
    EXPECT_FALSE(has(c, "tuned table")) << c.out;
    EXPECT_FALSE(fs::exists(p("o")));
  }
}

TEST_F(CliOutputs, RunSaysWhatItWrote) {
  Cmd c = sh(lce_run() + " --out " + p("o"));
  ASSERT_EQ(c.code, 0) << c.out;
  EXPECT_TRUE(has(c, "wrote " + p("o") + "/{loss,lse}.npy")) << c.out;
  c = sh("run grouped_matmul --lhs " + p("x.npy") + " --rhs " + p("g_rhs.npy") + " --group-sizes " + p("g_sizes.npy") +
         " --out " + p("g"));
  ASSERT_EQ(c.code, 0) << c.out;
  EXPECT_TRUE(has(c, "wrote " + p("g/out.npy") + "\n")) << c.out;  // one file: its path, not g/{out}.npy
  c = sh(lce_run() + " --out " + p("o2") + " --grad --skip-grads dx,dw");
  ASSERT_EQ(c.code, 0) << c.out;
  EXPECT_TRUE(has(c, "(every gradient skipped)")) << c.out;
  EXPECT_FALSE(has(c, "(with gradients)")) << c.out;
}

TEST_F(CliOutputs, RunMessagesNameTheRealCause) {
  // A compound flag and one of its parts: which won was an accident of the parse order.
  Cmd c = sh(attention_run() + " --out " + p("o") + " --window -1,-1 --window-left 3");
  EXPECT_EQ(c.code, 2) << c.out;
  EXPECT_TRUE(has(c, "--window and --window-left both set window_left")) << c.out;
  // The partial form has no loss: a usage error that says what to do, not an internal one.
  c = sh(lce_run() + " --vocab-total 20 --grad --out " + p("o"));
  EXPECT_EQ(c.code, 2) << c.out;
  EXPECT_TRUE(has(c, "--grad: with these options the forward gives no 'loss'")) << c.out;
  EXPECT_TRUE(has(c, "(run without --grad)")) << c.out;
  c = sh("run linear_cross_entropy --x " + p("a_dir") + " --w " + p("w.npy") + " --labels " + p("y.npy") + " --out " + p("o"));
  EXPECT_EQ(c.code, 2) << c.out;
  EXPECT_TRUE(has(c, "is a directory, not a .npy file")) << c.out;
  EXPECT_FALSE(fs::exists(p("o")));
}

}  // namespace
}  // namespace tessera

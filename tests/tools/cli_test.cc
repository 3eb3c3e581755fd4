// The tessera command-line tool, run as a user would: files in, files out, exit codes.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "harness/npy.h"
#include "tools/cli_test_util.h"
#include "tessera/attention.h"
#include "tessera/grouped_matmul.h"
#include "tessera/linear_cross_entropy.h"
#include "tessera/mlstm.h"
#include "cpu_backend.h"
#ifdef TESSERA_HAVE_CPU_BACKEND
#include "primitives/cpu_f32_gemm.h"
#endif

namespace tessera {
namespace {

namespace fs = std::filesystem;
namespace lce = tessera::linear_cross_entropy;

using cli_test::Cmd;
Cmd sh(const std::string& args) { return cli_test::run_cli(args); }

class Cli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir = tessera::cli_test::fresh_test_dir("tessera_cli_test");
    x = Tensor::empty(DType::kF32, {3, 4});
    w = Tensor::empty(DType::kF32, {6, 4});  // [V, H]: PyTorch lm_head layout
    bias = Tensor::empty(DType::kF32, {6});
    labels = Tensor::empty(DType::kI64, {3});
    for (int64_t i = 0; i < x.numel(); ++i) x.data_as<float>()[i] = std::sin(0.7f * static_cast<float>(i));
    for (int64_t i = 0; i < w.numel(); ++i) w.data_as<float>()[i] = std::cos(0.3f * static_cast<float>(i));
    for (int64_t i = 0; i < 6; ++i) bias.data_as<float>()[i] = 0.1f * static_cast<float>(i);
    const int64_t y[3] = {5, -100, 2};
    std::memcpy(labels.data(), y, sizeof y);
    npy::save(p("x.npy"), x);
    npy::save(p("w.npy"), w);
    npy::save(p("b.npy"), bias);
    npy::save(p("y.npy"), labels);
  }
  void TearDown() override { fs::remove_all(dir); }
  std::string p(const std::string& name) const { return (dir / name).string(); }
  fs::path dir;
  Tensor x, w, bias, labels;
};

TEST_F(Cli, ListShowsTheKernelAndTheReference) {
  const Cmd c = sh("list");
  EXPECT_EQ(c.code, 0) << c.out;
  EXPECT_NE(c.out.find("linear_cross_entropy"), std::string::npos) << c.out;
  EXPECT_NE(c.out.find("reference"), std::string::npos) << c.out;
}

TEST_F(Cli, ListVerboseSaysWhatTheCompilerDid) {
  const Cmd c = sh("list --verbose");
  ASSERT_EQ(c.code, 0) << c.out;
#ifdef TESSERA_HAVE_CPU_BACKEND
  // The SIMD targets Highway compiled and the one dispatched on this machine.
  EXPECT_NE(c.out.find("CPU SIMD (Highway): compiled "), std::string::npos) << c.out;
  EXPECT_NE(c.out.find("dispatched here "), std::string::npos) << c.out;
#endif
#if TESSERA_TEST_CUDA_MODULE_BUILT
  // Registers, spills and memory of every CUDA kernel of the build, read from the report the
  // build wrote beside the module (no GPU needed).
  EXPECT_NE(c.out.find("CUDA compiler report: "), std::string::npos) << c.out;
  EXPECT_EQ(c.out.find("CUDA compiler report: none"), std::string::npos) << c.out;
  EXPECT_NE(c.out.find("cuda.cu [sm_90a] "), std::string::npos) << c.out;
  EXPECT_NE(c.out.find("regs "), std::string::npos) << c.out;
  EXPECT_NE(c.out.find(" B (st/ld), stack "), std::string::npos) << c.out;
#endif
}

TEST_F(Cli, ListVerboseWithoutACompilerReportSaysWhy) {
  ::setenv("TESSERA_CUDA_RESOURCES", p("missing.json").c_str(), 1);
  const Cmd c = sh("list --verbose");
  ::unsetenv("TESSERA_CUDA_RESOURCES");
  ASSERT_EQ(c.code, 0) << c.out;
  EXPECT_NE(c.out.find("CUDA compiler report: none (no CUDA compiler report at " + p("missing.json")),
            std::string::npos) << c.out;
}

TEST_F(Cli, NewVersionChecksNamesAndSaysWhatToRunOutsideTheSourceTree) {
  TESSERA_SKIP_WITHOUT_CPU_BACKEND();  // versions the cpu implementation
  Cmd c = sh("new-version linear_cross_entropy no_such_impl");
  EXPECT_EQ(c.code, 2) << c.out;
  EXPECT_NE(c.out.find("no implementation named 'no_such_impl'"), std::string::npos) << c.out;
  c = sh("new-version linear_cross_entropy cpu --root " + dir.string());
  EXPECT_EQ(c.code, 1) << c.out;
  EXPECT_NE(c.out.find("python3 scripts/new_version.py linear_cross_entropy cpu"), std::string::npos) << c.out;
}

TEST_F(Cli, NewVersionDryRunInTheSourceTreeWritesNothing) {
  TESSERA_SKIP_WITHOUT_CPU_BACKEND();
  const Cmd c = sh(std::string("new-version linear_cross_entropy cpu --dry-run --root ") + TESSERA_TEST_SOURCE_DIR);
  EXPECT_EQ(c.code, 0) << c.out;
  EXPECT_NE(c.out.find("would write src/kernels/linear_cross_entropy/"), std::string::npos) << c.out;
  EXPECT_EQ(c.out.find("wrote "), std::string::npos) << c.out;
}

TEST_F(Cli, RunWritesLossAndGradientsMatchingTheLibrary) {
  const Cmd c = sh("run linear_cross_entropy --x " + p("x.npy") + " --w " + p("w.npy") + " --bias " + p("b.npy") +
                   " --labels " + p("y.npy") + " --reduction none --soft-cap 4 --z-loss 0.01 --label-smoothing 0.1" +
                   " --grad --argmax --impl reference --out " + p("out"));
  ASSERT_EQ(c.code, 0) << c.out;
  lce::Options o;
  o.reduction = lce::Reduction::kNone;
  o.softcap = 4;
  o.z_loss_weight = 0.01;
  o.label_smoothing = 0.1;
  o.return_argmax = true;
  o.implementation = "reference";
  lce::Result want = lce::compute_with_grad({x, w, bias.view(), labels, std::nullopt}, o);
  auto same = [&](const char* file, const Tensor& t) {
    Tensor got = npy::load(p(std::string("out/") + file));
    ASSERT_EQ(got.shape(), t.shape()) << file;
    ASSERT_EQ(got.view().nbytes(), t.view().nbytes()) << file;
    EXPECT_EQ(std::memcmp(got.data(), t.data(), t.view().nbytes()), 0) << file;
  };
  same("loss.npy", want.loss);
  same("lse.npy", want.lse);
  same("argmax.npy", want.argmax);
  same("dx.npy", want.dx);
  same("dw.npy", want.dw);
  same("dbias.npy", want.dbias);
  EXPECT_EQ(npy::load(p("out/loss.npy")).data_as<float>()[1], 0.0f);  // ignored token
}

// Options::skip_ignored reaches the CLI from its declaration: on by default (the ignored token's
// lse is 0: never computed), --no-skip-ignored computes every row (its lse is its logsumexp).
TEST_F(Cli, RunSkipsIgnoredTokensUnlessTold) {
  const std::string args = "run linear_cross_entropy --x " + p("x.npy") + " --w " + p("w.npy") + " --labels " +
                           p("y.npy") + " --reduction none --impl reference --out ";
  ASSERT_EQ(sh(args + p("skip")).code, 0);
  const Cmd every = sh(args + p("every") + " --no-skip-ignored");
  ASSERT_EQ(every.code, 0) << every.out;
  lce::Options o;
  o.reduction = lce::Reduction::kNone;
  o.skip_ignored = false;
  o.implementation = "reference";
  const lce::Result want = lce::compute({x, w, std::nullopt, labels, std::nullopt}, o);
  const Tensor skipped = npy::load(p("skip/lse.npy")), all = npy::load(p("every/lse.npy"));
  EXPECT_EQ(skipped.data_as<float>()[1], 0.0f);
  EXPECT_GT(want.lse.data_as<float>()[1], 0.0f);
  for (int64_t t = 0; t < 3; ++t) EXPECT_EQ(all.data_as<float>()[t], want.lse.data_as<float>()[t]) << t;
  EXPECT_EQ(npy::load(p("every/loss.npy")).data_as<float>()[0], npy::load(p("skip/loss.npy")).data_as<float>()[0]);
}

// --skip-grads: the gradients left out are not written, the others are the full run's bits;
// unknown names, and the flag without --grad, are one-line errors (exit 2, nothing written).
TEST_F(Cli, RunSkipGradsWritesTheOthersUnchanged) {
  const std::string args = "run linear_cross_entropy --x " + p("x.npy") + " --w " + p("w.npy") + " --labels " +
                           p("y.npy") + " --bias " + p("b.npy") + " --grad --out ";
  ASSERT_EQ(sh(args + p("all")).code, 0);
  const Cmd c = sh(args + p("part") + " --skip-grads dw,dbias");
  ASSERT_EQ(c.code, 0) << c.out;
  EXPECT_NE(c.out.find("{loss,lse,dx}.npy"), std::string::npos) << c.out;
  EXPECT_FALSE(fs::exists(p("part/dw.npy")));
  EXPECT_FALSE(fs::exists(p("part/dbias.npy")));
  const Tensor a = npy::load(p("all/dx.npy")), b = npy::load(p("part/dx.npy"));
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.view().nbytes()), 0);
  for (const auto& [extra, message] :
       {std::pair<std::string, std::string>{" --skip-grads lse", "--skip-grads takes a comma list of dx, dw, dbias, got 'lse'"},
        {" --skip-grads dw,", "--skip-grads takes a comma list of dx, dw, dbias, got 'dw,'"},
        {" --skip-grads dw,dw", "--skip-grads names dw twice"}}) {
    const Cmd bad = sh(args + p("bad") + extra);
    EXPECT_EQ(bad.code, 2) << extra;
    EXPECT_NE(bad.out.find(message), std::string::npos) << bad.out;
    EXPECT_FALSE(fs::exists(p("bad"))) << extra;
  }
  const Cmd nograd = sh("run linear_cross_entropy --x " + p("x.npy") + " --w " + p("w.npy") + " --labels " +
                        p("y.npy") + " --skip-grads dw --out " + p("bad"));
  EXPECT_EQ(nograd.code, 2);
  EXPECT_NE(nograd.out.find("--skip-grads needs --grad"), std::string::npos) << nograd.out;
  EXPECT_EQ(sh("run mlstm --help").out.find("--skip-grads"), std::string::npos);  // nothing to skip there
  EXPECT_NE(sh("run attention --help").out.find("--skip-grads"), std::string::npos);  // dbias
  // Saved forward outputs (lse, o) are grad inputs of the backward, not upstream gradients: the
  // fused pass that --grad runs forms them, so they are no flags (offered for a day, and ignored).
  const Cmd lse = sh("run linear_cross_entropy --x " + p("x.npy") + " --w " + p("w.npy") + " --labels " + p("y.npy") +
                     " --grad --lse " + p("y.npy") + " --out " + p("lse"));
  EXPECT_EQ(lse.code, 2) << lse.out;
  EXPECT_FALSE(fs::exists(p("lse")));
  const std::string attention_help = sh("run attention --help").out;
  EXPECT_EQ(attention_help.find("--lse"), std::string::npos) << attention_help;
  EXPECT_EQ(attention_help.find("--o "), std::string::npos) << attention_help;
  EXPECT_NE(attention_help.find("--grad-o"), std::string::npos) << attention_help;
}

TEST_F(Cli, BadInputsGiveOneLineErrorsAndNonZeroExit) {
  const std::string base = "run linear_cross_entropy --w " + p("w.npy") + " --out " + p("out") + " --labels ";
  // Label out of range.
  Tensor bad = labels;
  bad.data_as<int64_t>()[0] = 6;
  npy::save(p("bad_y.npy"), bad);
  Cmd c = sh(base + p("bad_y.npy") + " --x " + p("x.npy"));
  EXPECT_EQ(c.code, 2);
  EXPECT_NE(c.out.find("label 6 at token 0 is outside [0, V=6)"), std::string::npos) << c.out;
  EXPECT_EQ(std::count(c.out.begin(), c.out.end(), '\n'), 1) << c.out;
  // Missing file.
  c = sh(base + p("y.npy") + " --x " + p("nope.npy"));
  EXPECT_EQ(c.code, 2);
  EXPECT_NE(c.out.find("cannot open"), std::string::npos) << c.out;
  // Shape mismatch: labels for 2 tokens.
  Tensor y2 = Tensor::zeros(DType::kI64, {2});
  npy::save(p("y2.npy"), y2);
  c = sh(base + p("y2.npy") + " --x " + p("x.npy"));
  EXPECT_EQ(c.code, 2);
  EXPECT_NE(c.out.find("does not match"), std::string::npos) << c.out;
  // Unknown implementation and bad option values.
  c = sh(base + p("y.npy") + " --x " + p("x.npy") + " --impl warp-drive");
  EXPECT_EQ(c.code, 2);
  EXPECT_NE(c.out.find("unknown implementation 'warp-drive'"), std::string::npos) << c.out;
  c = sh(base + p("y.npy") + " --x " + p("x.npy") + " --reduction avg");
  EXPECT_NE(c.code, 0);
  c = sh(base + p("y.npy") + " --x " + p("x.npy") + " --label-smoothing 2");
  EXPECT_EQ(c.code, 2);
  EXPECT_NE(c.out.find("label_smoothing"), std::string::npos) << c.out;
  EXPECT_FALSE(fs::exists(p("out/loss.npy"))) << "nothing is written when the inputs are bad";
}

TEST_F(Cli, CheckRunsTheGridForANamedImplementation) {
  const Cmd c = sh("check linear_cross_entropy --impl reference --quick --pass forward");
  EXPECT_EQ(c.code, 0) << c.out;
  // The summary line: some cases passed, none failed (not merely the word "failed" somewhere).
  const auto at = c.out.find("check: ");
  ASSERT_NE(at, std::string::npos) << c.out;
  int passed = -1, failed = -1, skipped = -1;
  ASSERT_EQ(std::sscanf(c.out.c_str() + at, "check: %d passed, %d failed, %d skipped", &passed, &failed, &skipped), 3);
  EXPECT_GT(passed, 0);
  EXPECT_EQ(failed, 0);
  EXPECT_NE(c.out.find("max_abs="), std::string::npos) << c.out;
  // A typo never falls back, spaces are trimmed, and the error names the known implementations.
  const Cmd bad = sh("check linear_cross_entropy --impl nope");
  EXPECT_EQ(bad.code, 2) << bad.out;
  EXPECT_NE(bad.out.find("no implementation named 'nope'"), std::string::npos) << bad.out;
  const Cmd typo = sh("check linear_cross_entropy --impl 'reference, refrence' --quick --pass forward");
  EXPECT_EQ(typo.code, 2) << typo.out;
  EXPECT_NE(typo.out.find("'refrence'"), std::string::npos) << typo.out;
  const Cmd spaced = sh("check linear_cross_entropy --impl ' reference ' --quick --pass forward");
  EXPECT_EQ(spaced.code, 0) << spaced.out;
}

// A check that checked nothing passed nothing: every case skipped exits non-zero.
TEST_F(Cli, CheckWithEveryCaseSkippedFails) {
  const Cmd c = sh("check linear_cross_entropy --impl cuda --quick --pass forward");
  if (c.out.find("check: 0 passed") == std::string::npos) GTEST_SKIP() << "cuda is available here: " << c.out;
  EXPECT_EQ(c.code, 1) << c.out;
  EXPECT_NE(c.out.find("nothing was checked"), std::string::npos) << c.out;
}

// tessera report merges repeated --peers files; a corrupt input is quoted as text, not raw bytes.
TEST_F(Cli, ReportMergesPeersAndQuotesCorruptFilesAsText) {
  const std::string bench = p("bench.json");
  std::ofstream(bench) << R"({"schema": "tessera-bench/2", "kernel": "linear_cross_entropy", "dims": ["B", "H", "V"],
    "rows": [{"kind": "kernel", "implementation": "cpu", "mode": "forward", "shape": "small", "B": 64, "H": 64,
              "V": 512, "dtype": "f32", "median_ms": 1.0, "min_ms": 0.9, "max_ms": 1.2}]})";
  for (const char* name : {"torch", "jax"}) {
    std::ofstream(p(std::string(name) + ".json"))
        << R"({"schema": "tessera-peers/1", "source": ")" << name << R"(", "rows": [{"implementation": ")" << name
        << R"(", "mode": "forward", "B": 64, "H": 64, "V": 512, "dtype": "f32", "median_ms": 1.5}]})";
  }
  Cmd c = sh("report " + bench + " --peers " + p("torch.json") + " --peers " + p("jax.json") + " -o " + p("r.html"));
  ASSERT_EQ(c.code, 0) << c.out;
  std::stringstream html;
  html << std::ifstream(p("r.html")).rdbuf();
  EXPECT_NE(html.str().find("torch (peer)"), std::string::npos);
  EXPECT_NE(html.str().find("jax (peer)"), std::string::npos);
  std::ofstream(p("corrupt.json"), std::ios::binary) << "\x93NUMPY\x01\xff{";
  c = sh("report " + p("corrupt.json") + " -o " + p("r2.html"));
  EXPECT_EQ(c.code, 2);
  EXPECT_NE(c.out.find("not valid JSON"), std::string::npos) << c.out;
  EXPECT_NE(c.out.find("\\x93"), std::string::npos) << c.out;
  EXPECT_TRUE(std::none_of(c.out.begin(), c.out.end(), [](char ch) { return static_cast<unsigned char>(ch) >= 0x80; }))
      << "only ASCII here: the raw bytes are escaped";
}

// The main job's report: several bench files (one per kernel) on one page, each peer file
// merged into the bench file of its kernel; several files into one .svg is refused.
TEST_F(Cli, ReportPutsSeveralKernelsOnOnePage) {
  std::ofstream(p("lce.json")) << R"({"schema": "tessera-bench/2", "kernel": "linear_cross_entropy", "dims": ["B", "H", "V"],
    "rows": [{"kind": "kernel", "implementation": "cpu", "mode": "forward", "shape": "small", "B": 64, "H": 64,
              "V": 512, "dtype": "f32", "median_ms": 1.0, "min_ms": 0.9, "max_ms": 1.2}]})";
  std::ofstream(p("mlstm.json")) << R"({"schema": "tessera-bench/2", "kernel": "mlstm", "dims": ["B", "NH", "S", "DHQK", "DHV"],
    "rows": [{"kind": "kernel", "implementation": "cpu", "mode": "forward", "shape": "s", "B": 1, "NH": 2, "S": 64,
              "DHQK": 16, "DHV": 16, "dtype": "f32", "median_ms": 0.5, "min_ms": 0.4, "max_ms": 0.6}]})";
  std::ofstream(p("peer.json")) << R"({"schema": "tessera-peers/1", "kernel": "mlstm", "source": "mlstm_kernels",
    "rows": [{"implementation": "mlstm_kernels", "mode": "forward", "B": 1, "NH": 2, "S": 64, "DHQK": 16, "DHV": 16,
              "dtype": "f32", "median_ms": 0.9}]})";
  Cmd c = sh("report " + p("lce.json") + " " + p("mlstm.json") + " --peers " + p("peer.json") + " -o " + p("all.html"));
  ASSERT_EQ(c.code, 0) << c.out;
  EXPECT_NE(c.out.find("3 rows from 2 files"), std::string::npos) << c.out;  // the peer row joined mlstm's
  std::stringstream html;
  html << std::ifstream(p("all.html")).rdbuf();
  EXPECT_NE(html.str().find("Tessera bench: linear_cross_entropy"), std::string::npos);
  EXPECT_NE(html.str().find("Tessera bench: mlstm"), std::string::npos);
  EXPECT_NE(html.str().find("mlstm_kernels (peer)"), std::string::npos);
  c = sh("report " + p("lce.json") + " " + p("mlstm.json") + " -o " + p("all.svg"));
  EXPECT_EQ(c.code, 2) << c.out;
  EXPECT_NE(c.out.find("one roofline"), std::string::npos) << c.out;
  std::ofstream(p("nokernel.json")) << R"({"schema": "tessera-peers/1", "rows": []})";
  c = sh("report " + p("lce.json") + " " + p("mlstm.json") + " --peers " + p("nokernel.json") + " -o " + p("x.html"));
  EXPECT_EQ(c.code, 2) << c.out;
  EXPECT_NE(c.out.find("names no \"kernel\""), std::string::npos) << c.out;
}

// A second kernel through the same generic `run`: files out equal the API's results.
TEST_F(Cli, RunsAttentionFromItsRegistration) {
  Tensor q = Tensor::empty(DType::kF32, {1, 5, 2, 8}), k = Tensor::empty(DType::kF32, {1, 6, 1, 8});
  Tensor v = Tensor::empty(DType::kF32, {1, 6, 1, 4});
  for (Tensor* t : {&q, &k, &v})
    for (int64_t i = 0; i < t->numel(); ++i) t->data_as<float>()[i] = std::sin(0.37f * static_cast<float>(i) + t->numel());
  npy::save(p("q.npy"), q), npy::save(p("k.npy"), k), npy::save(p("v.npy"), v);
  const Cmd c = sh("run attention --q " + p("q.npy") + " --k " + p("k.npy") + " --v " + p("v.npy") +
                   " --causal --grad --out " + p("att"));
  ASSERT_EQ(c.code, 0) << c.out;
  for (const char* f : {"o", "lse", "dq", "dk", "dv"}) EXPECT_TRUE(fs::exists(p(std::string("att/") + f + ".npy"))) << f;
  attention::Options opt;
  opt.causal = true;
  attention::Inputs in;
  in.q = q.view(), in.k = k.view(), in.v = v.view();
  const attention::Result r = attention::compute(in, opt);
  const Tensor o = npy::load(p("att/o.npy"));
  ASSERT_EQ(o.numel(), r.o.numel());
  for (int64_t i = 0; i < o.numel(); ++i) EXPECT_EQ(o.data_as<float>()[i], r.o.data_as<float>()[i]) << i;
  const Cmd help = sh("run attention --help");
  EXPECT_NE(help.out.find("--kv-segment-ids"), std::string::npos) << help.out;
  EXPECT_NE(help.out.find("--no-deterministic"), std::string::npos) << help.out;
  // A flag that is on by default is turned off by --no-NAME (the cpu backward is deterministic
  // either way: the same bits); one that is off by default has no --no- form.
  const std::string qkv = "run attention --q " + p("q.npy") + " --k " + p("k.npy") + " --v " + p("v.npy");
  const Cmd nd = sh(qkv + " --causal --grad --no-deterministic --out " + p("att_nd"));
  ASSERT_EQ(nd.code, 0) << nd.out;
  for (const char* f : {"o", "dq"}) {
    const Tensor a = npy::load(p(std::string("att/") + f + ".npy")), b = npy::load(p(std::string("att_nd/") + f + ".npy"));
    ASSERT_EQ(a.view().nbytes(), b.view().nbytes()) << f;
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.view().nbytes()), 0) << f;
  }
  EXPECT_EQ(sh(qkv + " --deterministic --out " + p("att_d")).code, 0);
  const Cmd nc = sh(qkv + " --no-causal --out " + p("att_nc"));
  EXPECT_EQ(nc.code, 2) << nc.out;
  EXPECT_FALSE(fs::exists(p("att_nc/o.npy")));
  EXPECT_NE(help.out.find("Writes o.npy, lse.npy and the outputs"), std::string::npos) << help.out;
  // A forward-only kernel (no forward outputs declared: they name what takes a gradient).
  const Cmd mla = sh("run mla_decode --help");
  EXPECT_NE(mla.out.find("Writes its outputs as NAME.npy"), std::string::npos) << mla.out;
  EXPECT_EQ(mla.out.find("Writes  and"), std::string::npos) << mla.out;
  const Cmd bad = sh("run attention --q " + p("q.npy") + " --k " + p("q.npy") + " --v " + p("v.npy") + " --out " + p("att2"));
  EXPECT_EQ(bad.code, 2) << bad.out;
}

// grouped_matmul through `run`, as the issue spells it: out.npy, and with --grad dlhs.npy and
// drhs.npy in rhs's layout (--transpose-rhs), equal to the API's results; the offset and its errors.
TEST_F(Cli, RunsGroupedMatmulAsTheIssueSpellsIt) {
  Tensor lhs = Tensor::empty(DType::kF32, {9, 3}), rhs = Tensor::empty(DType::kF32, {2, 4, 3});  // [G, N, K]
  for (Tensor* t : {&lhs, &rhs})
    for (int64_t i = 0; i < t->numel(); ++i) t->data_as<float>()[i] = std::cos(0.41f * static_cast<float>(i) + t->numel());
  Tensor gs = Tensor::empty(DType::kI64, {3});
  gs.data_as<int64_t>()[0] = 2, gs.data_as<int64_t>()[1] = 4, gs.data_as<int64_t>()[2] = 1;
  npy::save(p("lhs.npy"), lhs), npy::save(p("rhs.npy"), rhs), npy::save(p("gs.npy"), gs);
  const std::string args = "run grouped_matmul --lhs " + p("lhs.npy") + " --rhs " + p("rhs.npy") + " --group-sizes " + p("gs.npy");
  Cmd c = sh(args + " --transpose-rhs --group-offset 1 --grad --out " + p("gm"));
  ASSERT_EQ(c.code, 0) << c.out;
  grouped_matmul::Options opt;
  opt.transpose_rhs = true;
  opt.group_offset = 1;
  Tensor ones = Tensor::empty(DType::kF32, {9, 4});
  for (int64_t i = 0; i < ones.numel(); ++i) ones.data_as<float>()[i] = 1.0f;
  const grouped_matmul::Result r = grouped_matmul::compute_with_grad({lhs.view(), rhs.view(), gs.view()}, ones.view(), opt);
  for (auto [name, want] : {std::pair{"out", &r.out}, {"dlhs", &r.dlhs}, {"drhs", &r.drhs}}) {
    const Tensor got = npy::load(p(std::string("gm/") + name + ".npy"));
    ASSERT_EQ(got.shape(), want->shape()) << name;
    for (int64_t i = 0; i < got.numel(); ++i) EXPECT_EQ(got.data_as<float>()[i], want->data_as<float>()[i]) << name << i;
  }
  // Rows 0-1 (group 0, another shard's) are zero; row 2 is not.
  const Tensor out = npy::load(p("gm/out.npy"));
  EXPECT_EQ(out.data_as<float>()[0], 0.0f);
  EXPECT_NE(out.data_as<float>()[2 * 4], 0.0f);
  c = sh(args + " --transpose-rhs --out " + p("gm2"));  // 3 sizes for 2 matrices, no offset
  EXPECT_EQ(c.code, 2) << c.out;
  EXPECT_NE(c.out.find("group_offset"), std::string::npos) << c.out;
  c = sh(args + " --group-offset -3 --out " + p("gm3"));
  EXPECT_EQ(c.code, 2) << c.out;
}

// Issue #17's CLI flags: --class-weights, --return-z-loss and --token-accuracy write what the API
// computes.
TEST_F(Cli, RunWritesClassWeightedLossZLossAndAccuracy) {
  Tensor x = Tensor::empty(DType::kF32, {6, 4}), w = Tensor::empty(DType::kF32, {4, 5});
  for (Tensor* t : {&x, &w})
    for (int64_t i = 0; i < t->numel(); ++i) t->data_as<float>()[i] = std::sin(0.7f * static_cast<float>(i) + 1.0f);
  Tensor y = Tensor::empty(DType::kI64, {6}), cw = Tensor::empty(DType::kF32, {5});
  const int64_t labels[6] = {0, 4, -100, 2, 2, 1};
  for (int i = 0; i < 6; ++i) y.data_as<int64_t>()[i] = labels[i];
  for (int i = 0; i < 5; ++i) cw.data_as<float>()[i] = 0.5f + 0.25f * static_cast<float>(i);
  npy::save(p("x.npy"), x), npy::save(p("w.npy"), w), npy::save(p("y.npy"), y), npy::save(p("cw.npy"), cw);
  const Cmd c = sh("run linear_cross_entropy --x " + p("x.npy") + " --w " + p("w.npy") + " --labels " + p("y.npy") +
                   " --class-weights " + p("cw.npy") + " --z-loss 0.01 --return-z-loss --token-accuracy --out " + p("m"));
  ASSERT_EQ(c.code, 0) << c.out;
  linear_cross_entropy::Options opt;
  opt.z_loss_weight = 0.01;
  opt.return_z_loss = opt.return_token_accuracy = true;
  linear_cross_entropy::Inputs in{x, w, std::nullopt, y, std::nullopt};
  in.class_weights = cw.view();
  const linear_cross_entropy::Result r = linear_cross_entropy::compute(in, opt);
  for (auto [name, want] : {std::pair{"loss", &r.loss}, {"z_loss", &r.z_loss}, {"accuracy", &r.accuracy}}) {
    const Tensor got = npy::load(p(std::string("m/") + name + ".npy"));
    ASSERT_EQ(got.numel(), 1) << name;
    EXPECT_EQ(got.data_as<float>()[0], want->data_as<float>()[0]) << name;
  }
  EXPECT_GT(r.z_loss.data_as<float>()[0], 0.0f);
}

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

Tensor mlstm_input(Shape s, float phase) {
  Tensor t = Tensor::empty(DType::kF32, std::move(s));
  for (int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = std::sin(0.37f * static_cast<float>(i) + phase);
  return t;
}

// A bool .npy mask (|b1), as numpy writes `resets.astype(bool)`.
void save_bool_mask(const std::string& path, const std::vector<uint8_t>& v, int64_t rows, int64_t cols) {
  std::string h = "{'descr': '|b1', 'fortran_order': False, 'shape': (" + std::to_string(rows) + ", " +
                  std::to_string(cols) + "), }";
  h.append((64 - (10 + h.size() + 1) % 64) % 64, ' ');
  h += '\n';
  std::ofstream f(path, std::ios::binary);
  f.write("\x93NUMPY\x01\x00", 8);
  f.put(static_cast<char>(h.size() & 0xff)), f.put(static_cast<char>(h.size() >> 8));
  f << h;
  f.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size()));
}

void expect_file_equals(const std::string& path, const Tensor& want, const char* name) {
  const Tensor got = npy::load(path);
  ASSERT_EQ(got.dtype(), DType::kF32) << name;
  ASSERT_EQ(got.shape(), want.shape()) << name;
  for (int64_t i = 0; i < got.numel(); ++i) EXPECT_EQ(got.data_as<float>()[i], want.data_as<float>()[i]) << name << i;
}

// Issue #25's command line, flag for flag: h, the last states, the gradients (dc0, dn0 with an
// initial state) from --dh, equal to the API's results on the same inputs; dh defaults to ones.
TEST_F(Cli, RunsMlstmAsTheIssueSpellsIt) {
  TESSERA_SKIP_WITHOUT_CPU_BACKEND();  // the issue spells --impl cpu
  const int64_t B = 2, NH = 1, S = 5, DK = 3, DV = 2;
  Tensor q = mlstm_input({B, NH, S, DK}, 0.1f), k = mlstm_input({B, NH, S, DK}, 0.7f), v = mlstm_input({B, NH, S, DV}, 1.3f);
  Tensor i = mlstm_input({B, NH, S}, 2.0f), f = mlstm_input({B, NH, S}, 2.9f), dh = mlstm_input({B, NH, S, DV}, 0.5f);
  Tensor c0 = mlstm_input({B, NH, DK, DV}, 3.3f), n0 = mlstm_input({B, NH, DK}, 4.1f), m0 = mlstm_input({B, NH}, 0.2f);
  const std::vector<uint8_t> mask{0, 0, 1, 0, 0, 1, 0, 0, 1, 1};
  Tensor resets = Tensor::empty(DType::kI32, {B, S});
  for (int64_t j = 0; j < B * S; ++j) resets.data_as<int32_t>()[j] = mask[static_cast<size_t>(j)];
  for (auto [name, t] : {std::pair{"Q", &q}, {"K", &k}, {"V", &v}, {"I", &i}, {"F", &f}, {"DH", &dh}, {"C", &c0},
                         {"N", &n0}, {"M", &m0}})
    npy::save(p(std::string(name) + ".npy"), *t);
  save_bool_mask(p("R.npy"), mask, B, S);
  const std::string ins = "run mlstm --q " + p("Q.npy") + " --k " + p("K.npy") + " --v " + p("V.npy") + " --i " +
                          p("I.npy") + " --f " + p("F.npy") + " --resets " + p("R.npy");
  const std::string state = " --c0 " + p("C.npy") + " --n0 " + p("N.npy") + " --m0 " + p("M.npy");
  Cmd c = sh(ins + state + " --eps 1e-5 --chunk-size 2 --return-last-states --grad --dh " + p("DH.npy") +
             " --impl cpu --out " + p("ml"));
  ASSERT_EQ(c.code, 0) << c.out;

  mlstm::Options opt;
  opt.implementation = "cpu", opt.eps = 1e-5, opt.chunk_size = 2;
  const mlstm::Inputs in{q.view(), k.view(), v.view(), i.view(), f.view(), resets.view(), c0.view(), n0.view(), m0.view()};
  Tensor h = Tensor::zeros(DType::kF32, v.shape()), cl = Tensor::zeros(DType::kF32, c0.shape()),
         nl = Tensor::zeros(DType::kF32, n0.shape()), ml = Tensor::zeros(DType::kF32, m0.shape());
  Tensor dq = Tensor::zeros(DType::kF32, q.shape()), dk = Tensor::zeros(DType::kF32, k.shape()),
         dv = Tensor::zeros(DType::kF32, v.shape()), di = Tensor::zeros(DType::kF32, i.shape()),
         df = Tensor::zeros(DType::kF32, f.shape()), dc0 = Tensor::zeros(DType::kF32, c0.shape()),
         dn0 = Tensor::zeros(DType::kF32, n0.shape());
  // `--grad` runs the fused pass: one forward_backward call (the cpu backend forms the chunk
  // states once for both; h and the last states round like the backward's sweep, not like a
  // forward call's in-place state).
  mlstm::forward_backward(in, h.view(), {cl.view(), nl.view(), ml.view()}, dh.view(),
                          {dq.view(), dk.view(), dv.view(), di.view(), df.view(), dc0.view(), dn0.view()}, opt);
  for (auto [name, want] : {std::pair{"h", &h}, {"c_last", &cl}, {"n_last", &nl}, {"m_last", &ml}, {"dq", &dq},
                            {"dk", &dk}, {"dv", &dv}, {"di", &di}, {"df", &df}, {"dc0", &dc0}, {"dn0", &dn0}})
    expect_file_equals(p(std::string("ml/") + name + ".npy"), *want, name);
  // A forward call gives the same h and last states as the fused pass, bit for bit, on the
  // micro-kernel route (the chain step rounds as the in-place state update does; the OpenBLAS
  // route, on a CPU without AVX-512, may differ in the last bits).
#ifdef TESSERA_HAVE_CPU_BACKEND
  if (cpu_f32_gemm::available()) {
    Tensor h2 = Tensor::zeros(DType::kF32, v.shape()), cl2 = Tensor::zeros(DType::kF32, c0.shape()),
           nl2 = Tensor::zeros(DType::kF32, n0.shape()), ml2 = Tensor::zeros(DType::kF32, m0.shape());
    mlstm::forward(in, h2.view(), {cl2.view(), nl2.view(), ml2.view()}, opt);
    for (auto [name, want] : {std::pair{"h", &h2}, {"c_last", &cl2}, {"n_last", &nl2}, {"m_last", &ml2}})
      expect_file_equals(p(std::string("ml/") + name + ".npy"), *want, name);
  }
#endif

  // Without an initial state or --dh: no dc0/dn0, upstream gradient of ones; without
  // --return-last-states no last states.
  c = sh(ins + " --grad --out " + p("ml2"));
  ASSERT_EQ(c.code, 0) << c.out;
  EXPECT_FALSE(fs::exists(p("ml2/dc0.npy")));
  EXPECT_FALSE(fs::exists(p("ml2/c_last.npy")));
  for (const char* name : {"h", "dq", "dk", "dv", "di", "df"}) EXPECT_TRUE(fs::exists(p(std::string("ml2/") + name + ".npy"))) << name;
  Tensor ones = Tensor::empty(DType::kF32, v.shape());
  std::fill_n(ones.data_as<float>(), ones.numel(), 1.0f);
  mlstm::Options dflt;
  const mlstm::Inputs plain{q.view(), k.view(), v.view(), i.view(), f.view(), resets.view()};
  mlstm::backward(plain, ones.view(), {dq.view(), dk.view(), dv.view(), di.view(), df.view()}, dflt);
  expect_file_equals(p("ml2/dv.npy"), dv, "dv (dh = ones)");

  // The last states' upstream gradients (--grad-c-last, --grad-n-last), as the API takes them.
  Tensor dcl = mlstm_input(c0.shape(), 5.1f), dnl = mlstm_input(n0.shape(), 6.7f);
  npy::save(p("DCL.npy"), dcl), npy::save(p("DNL.npy"), dnl);
  c = sh(ins + state + " --grad --dh " + p("DH.npy") + " --grad-c-last " + p("DCL.npy") + " --grad-n-last " +
         p("DNL.npy") + " --out " + p("mlg"));
  ASSERT_EQ(c.code, 0) << c.out;
  mlstm::forward_backward(in, h.view(), {}, dh.view(),
                          {dq.view(), dk.view(), dv.view(), di.view(), df.view(), dc0.view(), dn0.view()}, dflt,
                          dcl.view(), dnl.view());
  for (auto [name, want] : {std::pair{"dq", &dq}, {"dk", &dk}, {"dv", &dv}, {"di", &di}, {"df", &df}, {"dc0", &dc0},
                            {"dn0", &dn0}})
    expect_file_equals(p(std::string("mlg/") + name + ".npy"), *want, name);
  c = sh(ins + " --grad-c-last " + p("DCL.npy") + " --out " + p("mlx"));
  EXPECT_EQ(c.code, 2) << c.out;
  EXPECT_NE(c.out.find("--grad-c-last needs --grad"), std::string::npos) << c.out;

  // Errors: nothing written, exit 2.
  c = sh(ins + " --c0 " + p("C.npy") + " --out " + p("ml3"));
  EXPECT_EQ(c.code, 2) << c.out;
  EXPECT_NE(c.out.find("c0, n0 and m0 go together"), std::string::npos) << c.out;
  EXPECT_FALSE(fs::exists(p("ml3/h.npy")));
  c = sh(ins + " --chunk-size -1 --out " + p("ml4"));
  EXPECT_EQ(c.code, 2) << c.out;
  EXPECT_FALSE(fs::exists(p("ml4/h.npy")));
}

}  // namespace
}  // namespace tessera

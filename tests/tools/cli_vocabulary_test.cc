// `tessera run` derived from each kernel's call signature (issue #23): one vocabulary (the
// Python keyword in kebab case), the older CLI spellings as aliases giving the same bytes, the
// upstream gradient --grad-<output>, and nothing written when a call fails.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "harness/npy.h"
#include "tools/cli_test_util.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using cli_test::Cmd;
Cmd sh(const std::string& args) { return cli_test::run_cli(args); }

Tensor filled(DType dt, const Shape& shape, float phase) {
  Tensor t = Tensor::empty(dt, shape);
  for (int64_t i = 0; i < t.numel(); ++i) store_from_f32(t.data(), dt, i, std::sin(0.37f * static_cast<float>(i) + phase));
  return t;
}

class CliVocabulary : public ::testing::Test {
 protected:
  void SetUp() override {
    dir = tessera::cli_test::fresh_test_dir("tessera_cli_vocab");
  }
  void TearDown() override { fs::remove_all(dir); }
  std::string p(const std::string& name) const { return (dir / name).string(); }
  // x [2, 4], w [3, 4] and labels {0, second} saved; the `tessera run` arguments that read them.
  std::string lce_run(int64_t second) const {
    save("x.npy", filled(DType::kF32, {2, 4}, 0.1f));
    save("w.npy", filled(DType::kF32, {3, 4}, 0.2f));
    Tensor y = Tensor::empty(DType::kI64, {2});
    y.data_as<int64_t>()[0] = 0, y.data_as<int64_t>()[1] = second;
    save("y.npy", y);
    return "run linear_cross_entropy --x " + p("x.npy") + " --w " + p("w.npy") + " --labels " + p("y.npy");
  }
  void save(const std::string& name, const Tensor& t) const { npy::save(p(name), t); }
  // Every file of `a` equals the same file of `b`, byte for byte, and they hold the same names.
  void expect_same_outputs(const std::string& a, const std::string& b) const {
    size_t n = 0;
    for (const auto& e : fs::directory_iterator(p(a))) {
      const Tensor x = npy::load(e.path().string());
      const Tensor y = npy::load((fs::path(p(b)) / e.path().filename()).string());
      ASSERT_EQ(x.shape(), y.shape()) << e.path();
      ASSERT_EQ(x.view().nbytes(), y.view().nbytes()) << e.path();
      EXPECT_EQ(std::memcmp(x.data(), y.data(), x.view().nbytes()), 0) << e.path();
      ++n;
    }
    EXPECT_GT(n, 0u);
    EXPECT_EQ(n, static_cast<size_t>(std::distance(fs::directory_iterator(p(b)), fs::directory_iterator())));
  }
  fs::path dir;
};

TEST_F(CliVocabulary, LinearCrossEntropyOptionsHaveThePythonNamesAndTheOldSpellings) {
  save("x.npy", filled(DType::kF32, {5, 4}, 0.1f));
  save("w.npy", filled(DType::kF32, {7, 4}, 0.9f));
  Tensor y = Tensor::empty(DType::kI64, {5});
  const int64_t labels[5] = {0, 6, -100, 3, 3};
  std::memcpy(y.data(), labels, sizeof labels);
  save("y.npy", y);
  const std::string in = "run linear_cross_entropy --x " + p("x.npy") + " --w " + p("w.npy") + " --labels " + p("y.npy");
  Cmd c = sh(in + " --z-loss-weight 0.01 --softcap 0.3 --return-argmax --return-token-accuracy --grad --out " + p("new"));
  ASSERT_EQ(c.code, 0) << c.out;
  c = sh(in + " --z-loss 0.01 --soft-cap 0.3 --argmax --token-accuracy --grad --out " + p("old"));
  ASSERT_EQ(c.code, 0) << c.out;
  expect_same_outputs("new", "old");
  for (const char* f : {"loss", "lse", "argmax", "accuracy", "dx", "dw"})
    EXPECT_TRUE(fs::exists(p(std::string("new/") + f + ".npy"))) << f;
  // The z-loss changes the result: the option was read, not swallowed.
  c = sh(in + " --grad --out " + p("plain"));
  ASSERT_EQ(c.code, 0) << c.out;
  EXPECT_NE(npy::load(p("plain/loss.npy")).data_as<float>()[0], npy::load(p("new/loss.npy")).data_as<float>()[0]);
  // So does the soft cap (lse = 0.3·tanh(0.36/0.3) + log 7 against 0.36 + log 7): read under either name.
  EXPECT_NE(npy::load(p("plain/lse.npy")).data_as<float>()[0], npy::load(p("new/lse.npy")).data_as<float>()[0]);
  c = sh(in + " --z-loss 0.01 --grad --out " + p("uncapped"));
  ASSERT_EQ(c.code, 0) << c.out;
  EXPECT_NE(npy::load(p("uncapped/lse.npy")).data_as<float>()[0], npy::load(p("old/lse.npy")).data_as<float>()[0]);
}

TEST_F(CliVocabulary, UpstreamGradientIsGradOfTheOutputAndScalesTheGradients) {
  save("x.npy", filled(DType::kF32, {3, 4}, 0.2f));
  save("w.npy", filled(DType::kF32, {6, 4}, 0.4f));
  Tensor y = Tensor::empty(DType::kI64, {3});
  const int64_t labels[3] = {1, 5, 2};
  std::memcpy(y.data(), labels, sizeof labels);
  save("y.npy", y);
  Tensor g = Tensor::empty(DType::kF32, {});
  g.data_as<float>()[0] = 2.0f;
  save("g.npy", g);
  const std::string in = "run linear_cross_entropy --x " + p("x.npy") + " --w " + p("w.npy") + " --labels " + p("y.npy");
  ASSERT_EQ(sh(in + " --grad --out " + p("one")).code, 0);
  const Cmd c = sh(in + " --grad --grad-loss " + p("g.npy") + " --out " + p("two"));
  ASSERT_EQ(c.code, 0) << c.out;
  const Tensor d1 = npy::load(p("one/dx.npy")), d2 = npy::load(p("two/dx.npy"));
  ASSERT_EQ(d1.numel(), d2.numel());
  for (int64_t i = 0; i < d1.numel(); ++i) EXPECT_FLOAT_EQ(d2.data_as<float>()[i], 2.0f * d1.data_as<float>()[i]) << i;
}

TEST_F(CliVocabulary, AttentionOldAndNewSpellingsAgree) {
  save("q.npy", filled(DType::kF32, {1, 5, 2, 4}, 0.3f));
  save("k.npy", filled(DType::kF32, {1, 6, 1, 4}, 0.5f));
  save("v.npy", filled(DType::kF32, {1, 6, 1, 3}, 0.7f));
  save("do.npy", filled(DType::kF32, {1, 5, 2, 3}, 1.1f));
  Tensor seg = Tensor::empty(DType::kI32, {1, 5}), segk = Tensor::empty(DType::kI32, {1, 6});
  for (int i = 0; i < 5; ++i) seg.data_as<int32_t>()[i] = i < 3 ? 0 : 1;
  for (int i = 0; i < 6; ++i) segk.data_as<int32_t>()[i] = i < 2 ? 0 : 1;
  save("sq.npy", seg), save("sk.npy", segk);
  const std::string in = "run attention --q " + p("q.npy") + " --k " + p("k.npy") + " --v " + p("v.npy") + " --grad";
  Cmd c = sh(in + " --window-left 2 --window-right 1 --segment-ids-q " + p("sq.npy") + " --segment-ids-k " +
             p("sk.npy") + " --grad-o " + p("do.npy") + " --scale 0.3 --out " + p("new"));
  ASSERT_EQ(c.code, 0) << c.out;
  c = sh(in + " --window 2,1 --q-segment-ids " + p("sq.npy") + " --kv-segment-ids " + p("sk.npy") + " --do " +
         p("do.npy") + " --scale 0.3 --out " + p("old"));
  ASSERT_EQ(c.code, 0) << c.out;
  expect_same_outputs("new", "old");
  // The options were read: without them dq differs.
  ASSERT_EQ(sh(in + " --scale 0.3 --out " + p("plain")).code, 0);
  const Tensor a = npy::load(p("new/dq.npy")), b = npy::load(p("plain/dq.npy"));
  EXPECT_NE(std::memcmp(a.data(), b.data(), a.view().nbytes()), 0);
  c = sh(in + " --window 2 --out " + p("bad"));  // one value for two options
  EXPECT_EQ(c.code, 2) << c.out;
  EXPECT_NE(c.out.find("--window"), std::string::npos) << c.out;
  EXPECT_FALSE(fs::exists(p("bad")));
}

TEST_F(CliVocabulary, GroupedMatmulGradOutAndDoutAgree) {
  save("lhs.npy", filled(DType::kF32, {7, 3}, 0.1f));
  save("rhs.npy", filled(DType::kF32, {2, 3, 4}, 0.6f));
  save("dout.npy", filled(DType::kF32, {7, 4}, 0.8f));
  Tensor gs = Tensor::empty(DType::kI64, {2});
  gs.data_as<int64_t>()[0] = 3, gs.data_as<int64_t>()[1] = 4;
  save("gs.npy", gs);
  const std::string in = "run grouped_matmul --lhs " + p("lhs.npy") + " --rhs " + p("rhs.npy") + " --group-sizes " +
                         p("gs.npy") + " --grad --out ";
  ASSERT_EQ(sh(in + p("new") + " --grad-out " + p("dout.npy")).code, 0);
  ASSERT_EQ(sh(in + p("old") + " --dout " + p("dout.npy")).code, 0);
  expect_same_outputs("new", "old");
  ASSERT_EQ(sh(in + p("ones")).code, 0);  // the given gradient was used, not the default ones
  const Tensor a = npy::load(p("new/dlhs.npy")), b = npy::load(p("ones/dlhs.npy"));
  EXPECT_NE(std::memcmp(a.data(), b.data(), a.view().nbytes()), 0);
}

// A call that fails (here: a label out of range, found by the kernel's validation) writes no file
// and creates no directory.
TEST_F(CliVocabulary, AFailedRunWritesNothing) {
  const Cmd c = sh(lce_run(9) + " --grad --out " + p("out"));
  EXPECT_EQ(c.code, 2) << c.out;
  EXPECT_FALSE(fs::exists(p("out")));
}

// The outputs are written all or none: one that cannot be written (its name taken by a
// directory) fails the run before any file is replaced, and no temporary file stays behind.
TEST_F(CliVocabulary, AnOutputThatCannotBeWrittenReplacesNoOther) {
  const std::string args = lce_run(2);
  const Cmd ok = sh(args + " --out " + p("first"));
  ASSERT_EQ(ok.code, 0) << ok.out;
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(p("first"))) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  ASSERT_GE(names.size(), 2u);
  fs::create_directories(fs::path(p("out")) / names.back());
  const Tensor earlier = filled(DType::kF32, {1}, 42.0f);  // a file from an earlier run
  save("out/" + names.front(), earlier);
  const Cmd c = sh(args + " --out " + p("out"));
  EXPECT_NE(c.code, 0) << c.out;
  EXPECT_NE(c.out.find("is a directory"), std::string::npos) << c.out;
  const Tensor stale = npy::load(p("out/" + names.front()));
  ASSERT_EQ(stale.numel(), 1);
  EXPECT_EQ(stale.data_as<float>()[0], earlier.data_as<float>()[0]);
  for (const auto& e : fs::directory_iterator(p("out")))
    EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << e.path();
}

TEST_F(CliVocabulary, HelpListsTheNewNamesWithTheirAliases) {
  const Cmd c = sh("run attention --help");
  ASSERT_EQ(c.code, 0) << c.out;
  for (const char* f : {"--segment-ids-q", "--q-segment-ids", "--grad-o", "--do", "--window-left", "--window"})
    EXPECT_NE(c.out.find(f), std::string::npos) << f << "\n" << c.out;
  const Cmd l = sh("run linear_cross_entropy --help");
  for (const char* f : {"--z-loss-weight", "--z-loss", "--softcap", "--soft-cap", "--return-argmax", "--argmax", "--grad-loss"})
    EXPECT_NE(l.out.find(f), std::string::npos) << f << "\n" << l.out;
}

}  // namespace
}  // namespace tessera

// slstm through `tessera run`, as issue #26 spells it: h.npy; --return-last-states h_last, c_last,
// n_last, m_last; --grad dwx, dr, db (dh0, dc0, dn0 with an initial state), dh from --dh or ones;
// equal to the API's results.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>

#include "harness/npy.h"
#include "tessera/slstm.h"
#include "tools/cli_test_util.h"
#include "cpu_backend.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

Tensor wave(const Shape& shape, float freq, float scale) {
  Tensor t = Tensor::empty(DType::kF32, shape);
  for (int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = scale * std::sin(freq * float(i) + 0.3f);
  return t;
}

class SlstmCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir = tessera::cli_test::fresh_test_dir("tessera_slstm_cli");
    wx = wave({B, S, 4, NH, DH}, 0.37f, 1.0f), r = wave({4, NH, DH, DH}, 0.61f, 0.3f), b = wave({4, NH, DH}, 0.23f, 0.5f);
    resets = Tensor::zeros(DType::kI32, {B, S});
    resets.data_as<int32_t>()[1 * S + 2] = 1;
    for (Tensor* t : {&h0, &c0, &m0}) *t = wave({B, NH, DH}, 0.71f, 0.8f);
    n0 = wave({B, NH, DH}, 0.19f, 0.4f);
    for (int64_t i = 0; i < n0.numel(); ++i) n0.data_as<float>()[i] += 1.0f;
    dh = wave({B, S, NH, DH}, 0.53f, 1.0f);
    for (auto [n, t] : {std::pair{"wx", &wx}, {"r", &r}, {"b", &b}, {"rs", &resets}, {"h0", &h0}, {"c0", &c0}, {"n0", &n0},
                        {"m0", &m0}, {"dh", &dh}})
      npy::save(p(std::string(n) + ".npy"), *t);
  }
  void TearDown() override { fs::remove_all(dir); }
  std::string p(const std::string& name) const { return (dir / name).string(); }
  void expect_file(const std::string& path, const Tensor& want) const {
    const Tensor got = npy::load(p(path));
    ASSERT_EQ(got.shape(), want.shape()) << path;
    ASSERT_EQ(got.dtype(), DType::kF32) << path;
    for (int64_t i = 0; i < got.numel(); ++i) ASSERT_EQ(got.data_as<float>()[i], want.data_as<float>()[i]) << path << i;
  }
  const int64_t B = 2, S = 4, NH = 2, DH = 3;
  fs::path dir;
  Tensor wx, r, b, resets, h0, c0, n0, m0, dh;
};

TEST_F(SlstmCli, RunsAsTheIssueSpellsIt) {
  TESSERA_SKIP_WITHOUT_CPU_BACKEND();  // the issue spells --impl cpu
  const std::string in = "run slstm --wx " + p("wx.npy") + " --r " + p("r.npy") + " --b " + p("b.npy") + " --resets " +
                         p("rs.npy") + " --h0 " + p("h0.npy") + " --c0 " + p("c0.npy") + " --n0 " + p("n0.npy") +
                         " --m0 " + p("m0.npy");
  cli_test::Cmd c = cli_test::run_cli(in + " --return-last-states --grad --dh " + p("dh.npy") + " --impl cpu --out " + p("o"));
  ASSERT_EQ(c.code, 0) << c.out;
  const Shape st{B, NH, DH};
  Tensor h = Tensor::zeros(DType::kF32, {B, S, NH, DH});
  std::vector<Tensor> s(4), d0(3);
  for (Tensor& t : s) t = Tensor::zeros(DType::kF32, st);
  for (Tensor& t : d0) t = Tensor::zeros(DType::kF32, st);
  Tensor dwx = Tensor::zeros(DType::kF32, wx.shape()), dr = Tensor::zeros(DType::kF32, r.shape()),
         db = Tensor::zeros(DType::kF32, b.shape());
  slstm::Options opt;
  opt.implementation = "cpu";
  const slstm::Inputs inputs{wx.view(), r.view(), b.view(), resets.view(), h0.view(), c0.view(), n0.view(), m0.view()};
  slstm::forward_backward(inputs, {dh.view()}, {h.view(), s[0].view(), s[1].view(), s[2].view(), s[3].view()},
                          {dwx.view(), dr.view(), db.view(), d0[0].view(), d0[1].view(), d0[2].view()}, opt);
  expect_file("o/h.npy", h);
  expect_file("o/h_last.npy", s[0]), expect_file("o/c_last.npy", s[1]);
  expect_file("o/n_last.npy", s[2]), expect_file("o/m_last.npy", s[3]);
  expect_file("o/dwx.npy", dwx), expect_file("o/dr.npy", dr), expect_file("o/db.npy", db);
  expect_file("o/dh0.npy", d0[0]), expect_file("o/dc0.npy", d0[1]), expect_file("o/dn0.npy", d0[2]);
}

TEST_F(SlstmCli, ForwardOnlyAndDhDefaultsToOnes) {
  const std::string in = "run slstm --wx " + p("wx.npy") + " --r " + p("r.npy") + " --b " + p("b.npy");
  cli_test::Cmd c = cli_test::run_cli(in + " --out " + p("f"));
  ASSERT_EQ(c.code, 0) << c.out;
  EXPECT_TRUE(fs::exists(p("f/h.npy")));
  EXPECT_FALSE(fs::exists(p("f/h_last.npy")));
  c = cli_test::run_cli(in + " --grad --out " + p("g"));
  ASSERT_EQ(c.code, 0) << c.out;
  EXPECT_FALSE(fs::exists(p("g/dh0.npy")));
  Tensor ones = Tensor::empty(DType::kF32, {B, S, NH, DH});
  for (int64_t i = 0; i < ones.numel(); ++i) ones.data_as<float>()[i] = 1.0f;
  Tensor h = Tensor::zeros(DType::kF32, {B, S, NH, DH});
  Tensor dwx = Tensor::zeros(DType::kF32, wx.shape()), dr = Tensor::zeros(DType::kF32, r.shape()),
         db = Tensor::zeros(DType::kF32, b.shape());
  slstm::forward_backward({wx.view(), r.view(), b.view()}, {ones.view()}, {h.view()}, {dwx.view(), dr.view(), db.view()});
  expect_file("g/h.npy", h), expect_file("g/dwx.npy", dwx), expect_file("g/dr.npy", dr), expect_file("g/db.npy", db);
}

// The last states' upstream gradients, as the contract names them (--grad-h-last, --grad-c-last,
// --grad-n-last): the CLI once documented them and refused them as unknown options.
TEST_F(SlstmCli, GradOfTheLastStates) {
  const Tensor dhl = wave({B, NH, DH}, 0.29f, 0.7f), dcl = wave({B, NH, DH}, 0.43f, 0.5f),
               dnl = wave({B, NH, DH}, 0.17f, 0.3f);
  npy::save(p("dhl.npy"), dhl), npy::save(p("dcl.npy"), dcl), npy::save(p("dnl.npy"), dnl);
  const std::string in = "run slstm --wx " + p("wx.npy") + " --r " + p("r.npy") + " --b " + p("b.npy") + " --h0 " +
                         p("h0.npy") + " --c0 " + p("c0.npy") + " --n0 " + p("n0.npy") + " --m0 " + p("m0.npy");
  cli_test::Cmd c = cli_test::run_cli(in + " --grad --dh " + p("dh.npy") + " --grad-h-last " + p("dhl.npy") +
                                      " --grad-c-last " + p("dcl.npy") + " --grad-n-last " + p("dnl.npy") + " --out " + p("l"));
  ASSERT_EQ(c.code, 0) << c.out;
  Tensor h = Tensor::zeros(DType::kF32, {B, S, NH, DH});
  std::vector<Tensor> d0(3);
  for (Tensor& t : d0) t = Tensor::zeros(DType::kF32, {B, NH, DH});
  Tensor dwx = Tensor::zeros(DType::kF32, wx.shape()), dr = Tensor::zeros(DType::kF32, r.shape()),
         db = Tensor::zeros(DType::kF32, b.shape());
  const slstm::Inputs inputs{wx.view(), r.view(), b.view(), {}, h0.view(), c0.view(), n0.view(), m0.view()};
  const slstm::Grads g{dwx.view(), dr.view(), db.view(), d0[0].view(), d0[1].view(), d0[2].view()};
  slstm::forward_backward(inputs, {dh.view(), dhl.view(), dcl.view(), dnl.view()}, {h.view()}, g);
  expect_file("l/dwx.npy", dwx), expect_file("l/dr.npy", dr), expect_file("l/db.npy", db);
  expect_file("l/dh0.npy", d0[0]), expect_file("l/dc0.npy", d0[1]), expect_file("l/dn0.npy", d0[2]);
  // The last states' gradients do reach the result: without them dh0 differs.
  c = cli_test::run_cli(in + " --grad --dh " + p("dh.npy") + " --out " + p("n"));
  ASSERT_EQ(c.code, 0) << c.out;
  const Tensor without = npy::load(p("n/dh0.npy"));
  bool differs = false;
  for (int64_t i = 0; i < without.numel(); ++i) differs |= without.data_as<float>()[i] != d0[0].data_as<float>()[i];
  EXPECT_TRUE(differs);
  c = cli_test::run_cli(in + " --grad-h-last " + p("dhl.npy") + " --out " + p("x"));  // needs --grad, like --dh
  EXPECT_EQ(c.code, 2) << c.out;
  EXPECT_NE(c.out.find("--grad-h-last needs --grad"), std::string::npos) << c.out;
  EXPECT_FALSE(fs::exists(p("x/h.npy")));
}

TEST_F(SlstmCli, ErrorsWriteNothing) {
  const std::string in = "run slstm --wx " + p("wx.npy") + " --r " + p("b.npy") + " --b " + p("b.npy");
  cli_test::Cmd c = cli_test::run_cli(in + " --out " + p("e"));
  EXPECT_EQ(c.code, 2) << c.out;
  EXPECT_NE(c.out.find("r must be [4, NH="), std::string::npos) << c.out;
  EXPECT_FALSE(fs::exists(p("e/h.npy")));
  c = cli_test::run_cli("run slstm --wx " + p("wx.npy") + " --r " + p("r.npy") + " --b " + p("b.npy") + " --h0 " +
                        p("h0.npy") + " --out " + p("e2"));
  EXPECT_EQ(c.code, 2) << c.out;
  EXPECT_NE(c.out.find("h0, c0, n0 and m0 go together"), std::string::npos) << c.out;
}

}  // namespace
}  // namespace tessera

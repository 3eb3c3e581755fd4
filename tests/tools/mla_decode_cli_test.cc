// mla_decode through `tessera run`, spelled exactly as issue #28 (and scripts) call it: o.npy and
// lse.npy (f32) equal to the API's results; a rejected call exits 2 and writes nothing.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <string>

#include "harness/npy.h"
#include "tessera/mla_decode.h"
#include "tools/cli_test_util.h"
#include "cpu_backend.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using cli_test::Cmd;

class MlaDecodeCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir = tessera::cli_test::fresh_test_dir("tessera_mla_cli");
    // B 2, Sq 2, Hq 3, D 8, page_size 4; entry 0 has 6 keys on pages [3, 1], entry 1 has 9 on [0, 4, 2].
    q = Tensor::empty(DType::kF32, {2, 2, 3, 8});
    kv = Tensor::empty(DType::kF32, {5, 4, 1, 8});
    for (int64_t i = 0; i < q.numel(); ++i) q.data_as<float>()[i] = std::sin(0.37f * static_cast<float>(i));
    for (int64_t i = 0; i < kv.numel(); ++i) kv.data_as<float>()[i] = std::cos(0.23f * static_cast<float>(i));
    pt = Tensor::empty(DType::kI32, {2, 3});
    const int32_t pages[6] = {3, 1, -1, 0, 4, 2};
    for (int i = 0; i < 6; ++i) pt.data_as<int32_t>()[i] = pages[i];
    L = Tensor::empty(DType::kI32, {2});
    L.data_as<int32_t>()[0] = 6, L.data_as<int32_t>()[1] = 9;
    for (auto [n, t] : {std::pair{"Q.npy", &q}, {"KV.npy", &kv}, {"PT.npy", &pt}, {"L.npy", &L}}) npy::save(p(n), *t);
  }
  void TearDown() override { fs::remove_all(dir); }
  std::string p(const std::string& name) const { return (dir / name).string(); }
  std::string args() const {
    return "run mla_decode --q " + p("Q.npy") + " --kv-cache " + p("KV.npy") + " --page-table " + p("PT.npy") +
           " --cache-seqlens " + p("L.npy");
  }
  fs::path dir;
  Tensor q, kv, pt, L;
};

TEST_F(MlaDecodeCli, RunsAsTheIssueSpellsIt) {
  TESSERA_SKIP_WITHOUT_CPU_BACKEND();  // the issue spells --impl cpu
  for (const char* impl : {"reference", "cpu"}) {
    const std::string out = p(std::string("out_") + impl);
    const Cmd c = cli_test::run_cli(args() + " --dv 5 --causal --scale 0.3 --impl " + impl + " --out " + out);
    ASSERT_EQ(c.code, 0) << c.out;
    Tensor o = Tensor::empty(DType::kF32, {2, 2, 3, 5}), lse = Tensor::empty(DType::kF32, {2, 2, 3});
    mla_decode::Options opt;
    opt.dv = 5, opt.causal = true, opt.scale = 0.3, opt.implementation = impl;
    mla_decode::forward({q.view(), kv.view(), pt.view(), L.view()}, {o.view(), lse.view()}, opt);
    for (auto [name, want] : {std::pair{"o", &o}, {"lse", &lse}}) {
      const Tensor got = npy::load(out + "/" + name + ".npy");
      ASSERT_EQ(got.dtype(), DType::kF32) << name;
      ASSERT_EQ(got.shape(), want->shape()) << name;
      for (int64_t i = 0; i < got.numel(); ++i) EXPECT_EQ(got.data_as<float>()[i], want->data_as<float>()[i]) << name << i;
    }
  }
  // Defaults: dv 512 > D 8 is refused (naming dv), nothing written.
  const Cmd bad = cli_test::run_cli(args() + " --out " + p("bad"));
  EXPECT_EQ(bad.code, 2) << bad.out;
  EXPECT_NE(bad.out.find("dv"), std::string::npos) << bad.out;
  EXPECT_FALSE(fs::exists(p("bad/o.npy")));
}

TEST_F(MlaDecodeCli, RejectsABadPageNamingTheBatch) {
  pt.data_as<int32_t>()[4] = 9;  // entry 1's second page
  npy::save(p("PT.npy"), pt);
  const Cmd c = cli_test::run_cli(args() + " --dv 8 --out " + p("bad"));
  EXPECT_EQ(c.code, 2) << c.out;
  EXPECT_NE(c.out.find("page_table[1, 1] = 9"), std::string::npos) << c.out;
  EXPECT_FALSE(fs::exists(p("bad/o.npy")));
  EXPECT_FALSE(fs::exists(p("bad/lse.npy")));
}

}  // namespace
}  // namespace tessera

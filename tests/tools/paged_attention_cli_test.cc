// paged_attention through `tessera run`, spelled exactly as the issue writes it: o.npy and lse.npy
// (f32) equal to the API's results; a bad page id is exit 2 naming the sequence, nothing written.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "harness/npy.h"
#include "kernels/paged_attention/testing.h"
#include "tessera/paged_attention.h"
#include "tools/cli_test_util.h"
#include "cpu_backend.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

TEST(PagedAttentionCli, RunsAsTheIssueSpellsIt) {
  TESSERA_SKIP_WITHOUT_CPU_BACKEND();  // the issue spells --impl cpu
  const fs::path dir = fs::temp_directory_path() / ("tessera_paged_cli_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  auto p = [&](const std::string& name) { return (dir / name).string(); };
  paged_attention::testing::CaseSpec c;
  c.q_lens = {1, 4, 0}, c.kv_lens = {9, 6, 2}, c.sinks = true;  // NaN in the unused cache slots
  const paged_attention::testing::CaseData d = paged_attention::testing::make_case(c);
  npy::save(p("Q.npy"), d.q), npy::save(p("K.npy"), d.k_cache), npy::save(p("V.npy"), d.v_cache);
  npy::save(p("PT.npy"), d.page_table), npy::save(p("KL.npy"), d.kv_lens), npy::save(p("CQ.npy"), d.cu_q_lens);
  npy::save(p("S.npy"), d.sinks);
  const std::string args = "run paged_attention --q " + p("Q.npy") + " --k-cache " + p("K.npy") + " --v-cache " + p("V.npy") +
                           " --page-table " + p("PT.npy") + " --kv-lens " + p("KL.npy") + " --cu-q-lens " + p("CQ.npy");
  const cli_test::Cmd ok = cli_test::run_cli(args + " --causal --window 3 --softcap 4 --scale 0.2 --sinks " + p("S.npy") +
                                             " --impl cpu --out " + p("out"));
  ASSERT_EQ(ok.code, 0) << ok.out;
  paged_attention::Options opt;
  opt.causal = true, opt.window = 3, opt.softcap = 4, opt.scale = 0.2, opt.implementation = "cpu";
  const paged_attention::Result r = paged_attention::compute(d.inputs(), opt);
  const Tensor o = npy::load(p("out/o.npy")), lse = npy::load(p("out/lse.npy"));
  ASSERT_EQ(o.dtype(), DType::kF32);
  ASSERT_EQ(lse.dtype(), DType::kF32);
  ASSERT_EQ(o.shape(), r.o.shape());
  ASSERT_EQ(lse.shape(), r.lse.shape());
  for (int64_t i = 0; i < o.numel(); ++i) EXPECT_EQ(o.data_as<float>()[i], r.o.data_as<float>()[i]) << i;
  for (int64_t i = 0; i < lse.numel(); ++i) EXPECT_EQ(lse.data_as<float>()[i], r.lse.data_as<float>()[i]) << i;

  Tensor bad = Tensor::empty(DType::kI32, d.page_table.shape());
  std::memcpy(bad.data(), d.page_table.data(), d.page_table.view().nbytes());
  bad.data_as<int32_t>()[1 * bad.shape()[1] + 1] = 999;
  npy::save(p("PT2.npy"), bad);
  const std::string bad_args = "run paged_attention --q " + p("Q.npy") + " --k-cache " + p("K.npy") + " --v-cache " +
                               p("V.npy") + " --page-table " + p("PT2.npy") + " --kv-lens " + p("KL.npy") +
                               " --cu-q-lens " + p("CQ.npy") + " --out " + p("bad");
  const cli_test::Cmd err = cli_test::run_cli(bad_args);
  EXPECT_EQ(err.code, 2) << err.out;
  EXPECT_NE(err.out.find("sequence 1"), std::string::npos) << err.out;
  EXPECT_FALSE(fs::exists(p("bad/o.npy")));
  fs::remove_all(dir);
}

// An f8e4m3 KV cache from .npy files (a 1-byte void: what NumPy writes for ml_dtypes.float8_e4m3fn)
// with its dequantization scales: the same bits as the API's call.
TEST(PagedAttentionCli, F8CacheFromNpyWithItsScales) {
  TESSERA_SKIP_WITHOUT_CPU_BACKEND();
  const fs::path dir = fs::temp_directory_path() / ("tessera_paged_cli_f8_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  auto p = [&](const std::string& name) { return (dir / name).string(); };
  paged_attention::testing::CaseSpec c;
  c.q_lens = {1, 4, 0}, c.kv_lens = {9, 6, 2}, c.dtype = DType::kBF16, c.f8_cache = true, c.k_scale = 0.03, c.v_scale = 0.07;
  const paged_attention::testing::CaseData d = paged_attention::testing::make_case(c);
  npy::save(p("Q.npy"), d.q), npy::save(p("K.npy"), d.k_cache), npy::save(p("V.npy"), d.v_cache);
  npy::save(p("PT.npy"), d.page_table), npy::save(p("KL.npy"), d.kv_lens), npy::save(p("CQ.npy"), d.cu_q_lens);
  const Tensor back = npy::load(p("K.npy"));
  ASSERT_EQ(back.dtype(), DType::kF8E4M3);
  ASSERT_EQ(std::memcmp(back.data(), d.k_cache.data(), d.k_cache.view().nbytes()), 0);
  const std::string args = "run paged_attention --q " + p("Q.npy") + " --k-cache " + p("K.npy") + " --v-cache " + p("V.npy") +
                           " --page-table " + p("PT.npy") + " --kv-lens " + p("KL.npy") + " --cu-q-lens " + p("CQ.npy");
  const cli_test::Cmd ok = cli_test::run_cli(args + " --causal --k-scale 0.03 --v-scale 0.07 --impl cpu --out " + p("out"));
  ASSERT_EQ(ok.code, 0) << ok.out;
  paged_attention::Options opt = paged_attention::testing::options_of(c);
  opt.implementation = "cpu";
  const paged_attention::Result r = paged_attention::compute(d.inputs(), opt);
  const Tensor o = npy::load(p("out/o.npy"));
  ASSERT_EQ(o.numel(), r.o.numel());
  for (int64_t i = 0; i < o.numel(); ++i) EXPECT_EQ(o.data_as<float>()[i], load_as_f32(r.o.data(), DType::kBF16, i)) << i;
  const cli_test::Cmd bad = cli_test::run_cli(args + " --k-scale 0 --out " + p("bad"));
  EXPECT_EQ(bad.code, 2) << bad.out;
  EXPECT_NE(bad.out.find("k_scale must be finite in f32 and > 0, got 0"), std::string::npos) << bad.out;
  EXPECT_FALSE(fs::exists(p("bad/o.npy")));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tessera

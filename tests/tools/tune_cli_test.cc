// `tessera tune`, run as a user would. The sweep itself needs a tunable implementation (the
// optimized backends); here: listing, argument errors, raw results, and --emit-table writing a
// generated table (kept rows, header comment). Timing is never checked.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "tools/cli_test_util.h"

namespace {

namespace fs = std::filesystem;

using tessera::cli_test::Cmd;
using tessera::cli_test::run_cli;

class TuneCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir = tessera::cli_test::fresh_test_dir("tessera_tune_cli_test");
  }
  void TearDown() override { fs::remove_all(dir); }
  fs::path dir;
};

TEST_F(TuneCli, ListsBucketsWithoutTiming) {
  const Cmd c = run_cli("tune linear_cross_entropy --list");
  EXPECT_EQ(c.code, 0) << c.out;
  for (const char* b : {"small", "llama2-ish", "llama3-ish", "gemma-ish"})
    EXPECT_NE(c.out.find(b), std::string::npos) << c.out;
}

TEST_F(TuneCli, BadArgumentsFailWithOneLine) {
  Cmd c = run_cli("tune no_such_kernel");
  EXPECT_EQ(c.code, 2);
  EXPECT_NE(c.out.find("unknown kernel 'no_such_kernel'"), std::string::npos) << c.out;
  c = run_cli("tune linear_cross_entropy --buckets nope");
  EXPECT_EQ(c.code, 2);
  EXPECT_NE(c.out.find("unknown bucket 'nope'"), std::string::npos) << c.out;
  c = run_cli("tune linear_cross_entropy --impl reference");
  EXPECT_EQ(c.code, 2);
  EXPECT_NE(c.out.find("no tunable block sizes"), std::string::npos) << c.out;
  c = run_cli("tune linear_cross_entropy --dtype i32 --list");
  EXPECT_EQ(c.code, 2);
  c = run_cli("tune linear_cross_entropy --pass sideways --list");
  EXPECT_EQ(c.code, 2);
  c = run_cli("tune linear_cross_entropy --buckets llama3-ish --shape 8,8,100 --list");
  EXPECT_EQ(c.code, 2);
  EXPECT_NE(c.out.find("outside bucket 'llama3-ish'"), std::string::npos) << c.out;
  c = run_cli("tune linear_cross_entropy --shape 8,x,100 --list");
  EXPECT_EQ(c.code, 2);
}

TEST_F(TuneCli, WritesRawResultsAndAGeneratedTable) {
  const fs::path table = dir / "tuned_table.cc";
  const fs::path out = dir / "raw";
  // One bucket, one dtype, a tiny shape: with a tunable backend built in, the sweep stays short.
  const Cmd c = run_cli("tune linear_cross_entropy --buckets small --shape 16,32,256 --dtype f32 --repeats 1 --warmup 0 --out " +
                        out.string() + " --emit-table --table " + table.string());
  ASSERT_EQ(c.code, 0) << c.out;
  size_t csv = 0, json = 0;
  fs::path csv_path;
  for (const auto& e : fs::directory_iterator(out)) {
    csv += e.path().extension() == ".csv";
    json += e.path().extension() == ".json";
    if (e.path().extension() == ".csv") csv_path = e.path();
  }
  EXPECT_EQ(csv, 1u);
  EXPECT_EQ(json, 1u);
  // Every candidate was checked against the default's outputs, and none is wrong.
  std::ifstream rows(csv_path);
  std::string header, row;
  std::getline(rows, header);
  EXPECT_NE(header.find(",status,"), std::string::npos) << header;
  EXPECT_NE(header.find(",max_abs_dev,tolerance,dev_output,failure"), std::string::npos) << header;
  while (std::getline(rows, row)) EXPECT_EQ(row.find(",wrong,"), std::string::npos) << row;
  std::ifstream in(table);
  const std::string text((std::istreambuf_iterator<char>(in)), {});
  EXPECT_NE(text.find("GENERATED FILE"), std::string::npos);
  EXPECT_NE(text.find("tessera tune linear_cross_entropy --emit-table"), std::string::npos);
  EXPECT_NE(text.find("const std::vector<tune::TableEntry>& tuned_table()"), std::string::npos);
}

TEST_F(TuneCli, EmitTableNeedsAnExistingDirectory) {
  const Cmd c = run_cli("tune linear_cross_entropy --buckets small --dtype f32 --repeats 1 --out " +
                        (dir / "raw").string() + " --emit-table --table " + (dir / "no/such/dir/t.cc").string());
  EXPECT_EQ(c.code, 2) << c.out;
  EXPECT_NE(c.out.find("--table"), std::string::npos) << c.out;
}

}  // namespace

namespace {

TEST_F(TuneCli, AttentionSweepsItsHeadDimBuckets) {
  Cmd c = run_cli("tune attention --list");
  EXPECT_EQ(c.code, 0) << c.out;
  for (const char* b : {"d64", "d128", "d256"}) EXPECT_NE(c.out.find(b), std::string::npos) << c.out;
  const fs::path table = dir / "tuned_table.cc";
  c = run_cli("tune attention --buckets d64 --shape 1,64,2,32 --dtype f32 --pass fused --repeats 1 --warmup 0 --out " +
              (dir / "raw").string() + " --emit-table --table " + table.string());
  if (c.out.find("no tunable block sizes") != std::string::npos) GTEST_SKIP() << "built without the cpu backend";
  ASSERT_EQ(c.code, 0) << c.out;
  std::ifstream in(table);
  const std::string text((std::istreambuf_iterator<char>(in)), {});
  EXPECT_NE(text.find("tessera tune attention --emit-table"), std::string::npos) << text;
  EXPECT_NE(text.find("\"d64\""), std::string::npos) << text;
  EXPECT_NE(text.find("{\"q\", "), std::string::npos) << text;
}

}  // namespace

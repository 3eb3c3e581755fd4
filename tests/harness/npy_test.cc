#include "harness/npy.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "tessera/error.h"

namespace tessera::npy {
namespace {

std::string tmp(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("tessera_npy_test_" + std::to_string(::getpid()) + "_" + name)).string();
}

void write_raw(const std::string& path, const std::string& header_dict, const std::string& data, int major = 1) {
  std::string h = header_dict;
  const size_t pre = major == 1 ? 10 : 12;
  h.append((64 - (pre + h.size() + 1) % 64) % 64, ' ');
  h += '\n';
  std::ofstream f(path, std::ios::binary);
  f.write("\x93NUMPY", 6);
  f.put(static_cast<char>(major));
  f.put(0);
  if (major == 1) {
    f.put(static_cast<char>(h.size() & 0xff));
    f.put(static_cast<char>(h.size() >> 8));
  } else {
    for (int i = 0; i < 4; ++i) f.put(static_cast<char>((h.size() >> (8 * i)) & 0xff));
  }
  f << h << data;
}

TEST(Npy, RoundTripsEveryDtypeAndShape) {
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16, DType::kI32, DType::kI64}) {
    for (Shape s : {Shape{}, Shape{5}, Shape{2, 3}, Shape{0, 4}}) {
      Tensor t = Tensor::empty(dt, s);
      for (int64_t i = 0; i < t.numel(); ++i) {
        if (is_float(dt)) store_from_f32(t.data(), dt, i, 0.5f * static_cast<float>(i) - 1.0f);
        else if (dt == DType::kI32) t.data_as<int32_t>()[i] = static_cast<int32_t>(i * 7 - 3);
        else t.data_as<int64_t>()[i] = i * 7 - 3;
      }
      const std::string p = tmp("rt.npy");
      save(p, t);
      Tensor u = load(p);
      EXPECT_EQ(u.dtype(), dt);
      EXPECT_EQ(u.shape(), s);
      EXPECT_EQ(std::memcmp(u.data(), t.data(), t.view().nbytes()), 0);
      std::remove(p.c_str());
    }
  }
}

TEST(Npy, ReadsVersion2HeadersAndBf16Void) {
  const std::string p = tmp("v2.npy");
  const uint16_t bits[2] = {0x3f80, 0xc000};  // bf16 1.0, -2.0
  write_raw(p, "{'descr': '|V2', 'fortran_order': False, 'shape': (2,), }",
            std::string(reinterpret_cast<const char*>(bits), 4), 2);
  Tensor t = load(p);
  EXPECT_EQ(t.dtype(), DType::kBF16);
  EXPECT_EQ(load_as_f32(t.data(), t.dtype(), 0), 1.0f);
  EXPECT_EQ(load_as_f32(t.data(), t.dtype(), 1), -2.0f);
  std::remove(p.c_str());
}

void expect_load_error(const std::string& p, const std::string& needle);

TEST(Npy, WidensByteMasksToI32) {
  const std::string p = tmp("mask.npy");
  for (const char* descr : {"|b1", "|u1", "|i1"}) {
    write_raw(p, std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': (2, 2), }",
              std::string("\x00\x01\xff\x02", 4));
    Tensor t = load(p);
    EXPECT_EQ(t.dtype(), DType::kI32) << descr;
    EXPECT_EQ(t.shape(), (Shape{2, 2}));
    const int32_t third = std::string(descr) == "|i1" ? -1 : 255;
    EXPECT_EQ(t.data_as<int32_t>()[0], 0);
    EXPECT_EQ(t.data_as<int32_t>()[1], 1);
    EXPECT_EQ(t.data_as<int32_t>()[2], third) << descr;
    EXPECT_EQ(t.data_as<int32_t>()[3], 2);
  }
  write_raw(p, "{'descr': '|b1', 'fortran_order': False, 'shape': (5,), }", std::string("\x01", 1));
  expect_load_error(p, "truncated data");
  std::remove(p.c_str());
}

void expect_load_error(const std::string& p, const std::string& needle) {
  try {
    load(p);
    ADD_FAILURE() << "expected an error for " << p;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << "one-line errors";
  }
}

// np.save of a transposed view (w.T of a [V, H] lm_head weight) or of any column-major array
// writes fortran_order True: the loader returns the array in C order.
TEST(Npy, ReadsFortranOrderIntoCOrder) {
  const std::string p = tmp("fortran.npy");
  std::string data;  // a [2, 3, 4] array a[i][j][k] = 100i + 10j + k, column-major (i fastest)
  for (int k = 0; k < 4; ++k)
    for (int j = 0; j < 3; ++j)
      for (int i = 0; i < 2; ++i) {
        const int32_t v = 100 * i + 10 * j + k;
        data.append(reinterpret_cast<const char*>(&v), 4);
      }
  write_raw(p, "{'descr': '<i4', 'fortran_order': True, 'shape': (2, 3, 4), }", data);
  Tensor t = load(p);
  ASSERT_EQ(t.shape(), (Shape{2, 3, 4}));
  ASSERT_TRUE(t.view().is_contiguous());
  for (int i = 0, n = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 4; ++k, ++n) EXPECT_EQ(t.data_as<int32_t>()[n], 100 * i + 10 * j + k) << i << j << k;
  // A 2 x 2 byte mask [[1, 2], [3, 4]] stored column-major; an empty [0, 3] array.
  write_raw(p, "{'descr': '|u1', 'fortran_order': True, 'shape': (2, 2), }", std::string("\x01\x03\x02\x04", 4));
  Tensor m = load(p);
  EXPECT_EQ(std::vector<int32_t>(m.data_as<int32_t>(), m.data_as<int32_t>() + 4), (std::vector<int32_t>{1, 2, 3, 4}));
  write_raw(p, "{'descr': '<f4', 'fortran_order': True, 'shape': (0, 3), }", "");
  EXPECT_EQ(load(p).shape(), (Shape{0, 3}));
  write_raw(p, "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }", std::string(12, '\0'));
  expect_load_error(p, "truncated data");
  std::remove(p.c_str());
}

TEST(Npy, RejectsWhatItCannotReadFaithfully) {
  const std::string p = tmp("bad.npy");
  write_raw(p, "{'descr': '<f8', 'fortran_order': False, 'shape': (1,), }", std::string(8, '\0'));
  expect_load_error(p, "float64 is not supported");
  std::string dims;  // 65 dims of 1: past NumPy's limit of 64
  for (int k = 0; k < 65; ++k) dims += "1, ";
  write_raw(p, "{'descr': '<f4', 'fortran_order': False, 'shape': (" + dims + "), }", std::string(4, '\0'));
  expect_load_error(p, "more than 64 dimensions");
  write_raw(p, "{'descr': '>f4', 'fortran_order': False, 'shape': (1,), }", std::string(4, '\0'));
  expect_load_error(p, "big-endian");
  write_raw(p, "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }", std::string(8, '\0'));
  expect_load_error(p, "truncated data");
  {
    std::ofstream f(p, std::ios::binary);
    f << "not numpy at all";
  }
  expect_load_error(p, "bad magic");
  std::remove(p.c_str());
  expect_load_error(tmp("does_not_exist.npy"), "cannot open");
}

// A corrupt header's bytes are quoted escaped: the message is valid UTF-8 text, no raw bytes.
TEST(Npy, ErrorsQuoteCorruptHeadersEscaped) {
  const std::string p = tmp("corrupt.npy");
  write_raw(p, "{'descr': '<f\xff\x01', 'fortran_order': False, 'shape': (1,), }", std::string(4, '\0'));
  expect_load_error(p, "unsupported dtype '<f\\xff\\x01'");
  write_raw(p, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,\x93\n), }", std::string(8, '\0'));
  expect_load_error(p, "malformed shape '(2,\\x93\\n)'");
  {
    std::ofstream f(p, std::ios::binary);
    f << "\x89PNG\r\n\x1a\n and more";
  }
  expect_load_error(p, "starts with '\\x89PNG\\r\\n'");
  std::remove(p.c_str());
}

}  // namespace
}  // namespace tessera::npy

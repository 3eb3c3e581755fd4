#include "harness/npy.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <utility>
#include <vector>

#include "core/text.h"
#include "tessera/error.h"

namespace tessera::npy {
namespace {

// The message may quote bytes of a corrupt header: escaped, so the text stays valid UTF-8.
[[noreturn]] void bad(const std::string& path, const std::string& msg) {
  throw Error(ErrorCode::kInvalidArgument, text::printable(path + ": " + msg));
}

DType parse_descr(const std::string& path, const std::string& d) {
  if (d == "<f4") return DType::kF32;
  if (d == "<f2") return DType::kF16;
  if (d == "<i4") return DType::kI32;
  if (d == "<i8") return DType::kI64;
  if (d == "<V2" || d == "|V2" || d == "bfloat16" || d == "<bfloat16") return DType::kBF16;
  // ml_dtypes.float8_e4m3fn saves as a 1-byte void — as does every other 1-byte ml_dtypes type
  // (float8_e4m3fnuz, e4m3b11fnuz, e8m0fnu, int4, float4...): a file cannot tell them apart, so
  // such an array must be converted to float8_e4m3fn before it is saved (docs/kernels/paged_attention.md).
  if (d == "<V1" || d == "|V1" || d == "float8_e4m3fn" || d == "<float8_e4m3fn") return DType::kF8E4M3;
  if (d == "<f8") bad(path, "dtype float64 is not supported: save as float32 (x.astype(np.float32))");
  if (!d.empty() && d[0] == '>') bad(path, "big-endian dtype '" + d + "' is not supported");
  bad(path, "unsupported dtype '" + d + "' (expected <f4, <f2, bf16 as <V2, f8e4m3 as <V1, <i4, <i8, or |b1 |u1 |i1 widened to i32)");
}

// The value text after 'key': in the header dict (a Python literal), or "" if absent.
std::string dict_value(const std::string& header, const std::string& key) {
  const std::string k = "'" + key + "'";
  size_t i = header.find(k);
  if (i == std::string::npos) return "";
  i = header.find(':', i + k.size());
  if (i == std::string::npos) return "";
  ++i;
  while (i < header.size() && header[i] == ' ') ++i;
  if (i >= header.size()) return "";
  if (header[i] == '\'') {
    const size_t e = header.find('\'', i + 1);
    return e == std::string::npos ? "" : header.substr(i + 1, e - i - 1);
  }
  if (header[i] == '(') {
    const size_t e = header.find(')', i);
    return e == std::string::npos ? "" : header.substr(i + 1, e - i - 1);
  }
  size_t e = i;
  while (e < header.size() && header[e] != ',' && header[e] != '}') ++e;
  std::string v = header.substr(i, e - i);
  while (!v.empty() && v.back() == ' ') v.pop_back();
  return v;
}

// A Fortran-order array (np.save of a transposed view, of a column-major array): `stored` holds
// its bytes as the C-order array of the reversed shape; the result is `shape` in C order. Element
// (i_0, .., i_{n-1}) is at stored offset sum_k i_k * prod_{m<k} shape[m] (an odometer over the
// destination, one element copied at a time: the loader's path, not a kernel's).
Tensor from_fortran(Tensor stored, const Shape& shape) {
  const size_t n = shape.size(), es = dtype_size(stored.dtype());
  if (n < 2) return stored;  // one axis or none: both orders are the same bytes
  Tensor out = Tensor::empty(stored.dtype(), shape);
  const int64_t count = out.numel();
  std::vector<int64_t> stride(n), index(n, 0);
  for (size_t k = 0, s = 1; k < n; s *= static_cast<size_t>(shape[k]), ++k) stride[k] = static_cast<int64_t>(s);
  const char* src = static_cast<const char*>(stored.data());
  char* dst = static_cast<char*>(out.data());
  int64_t from = 0;
  for (int64_t j = 0; j < count; ++j) {
    std::memcpy(dst + static_cast<size_t>(j) * es, src + static_cast<size_t>(from) * es, es);
    for (size_t k = n; k-- > 0;) {  // next C-order index; `from` follows it
      from += stride[k];
      if (++index[k] < shape[k]) break;
      from -= stride[k] * shape[k];
      index[k] = 0;
    }
  }
  return out;
}

}  // namespace

Tensor load(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) throw Error(ErrorCode::kIo, path + ": is a directory, not a .npy file");
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(ErrorCode::kIo, path + ": cannot open for reading");
  return read(f, path);
}

Tensor read(std::istream& f, const std::string& path) {
  char magic[8];
  if (!f.read(magic, 8)) bad(path, "not a .npy file (shorter than its 8-byte preamble)");
  if (std::memcmp(magic, "\x93NUMPY", 6) != 0)
    bad(path, "not a .npy file (bad magic: starts with '" + std::string(magic, 6) + "', want '\\x93NUMPY')");
  const int major = static_cast<unsigned char>(magic[6]);
  size_t header_len = 0;
  if (major == 1) {
    unsigned char b[2];
    if (!f.read(reinterpret_cast<char*>(b), 2)) bad(path, "truncated header");
    header_len = b[0] | (b[1] << 8);
  } else if (major == 2 || major == 3) {
    unsigned char b[4];
    if (!f.read(reinterpret_cast<char*>(b), 4)) bad(path, "truncated header");
    header_len = b[0] | (b[1] << 8) | (b[2] << 16) | (static_cast<size_t>(b[3]) << 24);
  } else {
    bad(path, "unsupported .npy format version " + std::to_string(major));
  }
  if (header_len > (1u << 20)) bad(path, "header too long");
  std::string header(header_len, '\0');
  if (!f.read(header.data(), static_cast<std::streamsize>(header_len))) bad(path, "truncated header");

  const std::string descr = dict_value(header, "descr");
  if (descr.empty()) bad(path, "header has no descr");
  // One-byte masks (bool, uint8, int8) are widened to i32 on load: Tensor has no byte dtype.
  const bool bytes1 = descr == "|b1" || descr == "|u1" || descr == "|i1";
  const DType dtype = bytes1 ? DType::kI32 : parse_descr(path, descr);
  const std::string order = dict_value(header, "fortran_order");
  if (order != "True" && order != "False") bad(path, "header has no fortran_order");
  const bool fortran = order == "True";  // read as the reversed shape in C order, then reordered
  if (header.find("'shape'") == std::string::npos) bad(path, "header has no shape");
  Shape shape;
  const std::string dims = dict_value(header, "shape");
  for (size_t i = 0; i < dims.size();) {
    if (dims[i] >= '0' && dims[i] <= '9') {
      size_t e = i;
      while (e < dims.size() && dims[e] >= '0' && dims[e] <= '9') ++e;
      // Digits only, so the one failure is a value past int64 (std::stoll would throw
      // std::out_of_range, which is not a Tessera error).
      int64_t d = 0;
      for (size_t k = i; k < e; ++k)
        if (__builtin_mul_overflow(d, int64_t{10}, &d) || __builtin_add_overflow(d, int64_t{dims[k] - '0'}, &d))
          bad(path, "dimension " + dims.substr(i, e - i) + " in shape '(" + dims + ")' is too large");
      shape.push_back(d);
      // NumPy's NPY_MAXDIMS: a hostile header of 500k dims made loading quadratic (hours).
      if (shape.size() > 64) bad(path, "more than 64 dimensions in shape '(" + dims.substr(0, 40) + "...)'");
      i = e;
    } else if (dims[i] == ',' || dims[i] == ' ' || dims[i] == 'L') {
      ++i;
    } else {
      bad(path, "malformed shape '(" + dims + ")'");
    }
  }
  // The declared size, checked for overflow and against what the file holds, before allocating.
  // Zero dims count as 1 in the overflow check: an empty (0, 2^62, 2^62) still has strides.
  // span: the loaded tensor's (a one-byte mask widens to i32); bytes: the file's.
  uint64_t bytes = bytes1 ? 1 : dtype_size(dtype), span = dtype_size(dtype);
  for (int64_t d : shape)
    if (__builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes) ||
        __builtin_mul_overflow(span, static_cast<uint64_t>(std::max<int64_t>(d, 1)), &span) ||
        span > static_cast<uint64_t>(INT64_MAX))
      bad(path, "shape " + shape_str(shape) + " of " + dtype_name(dtype) + " overflows a 64-bit byte count");
  const std::streampos here = f.tellg();
  if (here != std::streampos(-1)) {
    f.seekg(0, std::ios::end);
    const std::streampos end = f.tellg();
    f.seekg(here);
    if (end != std::streampos(-1) && end >= here) {
      const uint64_t left = static_cast<uint64_t>(end - here);
      if (bytes > left)
        bad(path, "truncated data: shape " + shape_str(shape) + " of " + dtype_name(dtype) + " needs " +
                      std::to_string(bytes) + " bytes, the file has " + std::to_string(left) + " after the header");
    }
  }
  Tensor t = Tensor::empty(dtype, fortran ? Shape(shape.rbegin(), shape.rend()) : shape);
  if (bytes1) {
    std::vector<char> raw(bytes);
    if (bytes && !f.read(raw.data(), static_cast<std::streamsize>(bytes)))
      bad(path, "truncated data: expected " + std::to_string(bytes) + " bytes for " + descr + shape_str(shape));
    for (uint64_t j = 0; j < bytes; ++j)
      t.data_as<int32_t>()[j] = descr == "|i1" ? int32_t(static_cast<signed char>(raw[j])) : int32_t(static_cast<unsigned char>(raw[j]));
  } else if (bytes && !f.read(static_cast<char*>(t.data()), static_cast<std::streamsize>(bytes))) {
    bad(path, "truncated data: expected " + std::to_string(bytes) + " bytes for " + dtype_name(dtype) +
                  shape_str(shape));
  }
  return fortran ? from_fortran(std::move(t), shape) : t;
}

namespace {

// The file at `tmp`, named `path` in errors.
void write_file(const std::string& tmp, const std::string& path, const TensorView& t) {
  if (t.device.type != DeviceType::kCPU || !t.is_contiguous())
    throw Error(ErrorCode::kInvalidArgument, path + ": can only save contiguous host tensors");
  const char* descr = "<f4";
  switch (t.dtype) {
    case DType::kF32: descr = "<f4"; break;
    case DType::kF16: descr = "<f2"; break;
    case DType::kBF16: descr = "<V2"; break;
    case DType::kI32: descr = "<i4"; break;
    case DType::kI64: descr = "<i8"; break;
    case DType::kF8E4M3: descr = "|V1"; break;
  }
  std::string shape = "(";
  for (size_t i = 0; i < t.shape.size(); ++i) shape += std::to_string(t.shape[i]) + (t.shape.size() == 1 ? "," : (i + 1 < t.shape.size() ? ", " : ""));
  shape += ")";
  std::string header = std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': " + shape + ", }";
  const size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
  if (!f) throw Error(ErrorCode::kIo, path + ": cannot open for writing");
  const unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0,
                                 static_cast<unsigned char>(header.size() & 0xff),
                                 static_cast<unsigned char>(header.size() >> 8)};
  f.write(reinterpret_cast<const char*>(pre), 10);
  f.write(header.data(), static_cast<std::streamsize>(header.size()));
  f.write(static_cast<const char*>(t.data), static_cast<std::streamsize>(t.nbytes()));
  f.close();  // a small file is all in the buffer until here: a full disk shows only now
  if (!f) throw Error(ErrorCode::kIo, path + ": write failed");
}

}  // namespace

void save(const std::string& path, const TensorView& t) { save_all({{path, t}}); }

void save_all(const std::vector<std::pair<std::string, TensorView>>& files) {
  std::vector<std::string> tmps;
  const auto drop_tmps = [&tmps] {
    for (const std::string& tmp : tmps) std::remove(tmp.c_str());
  };
  for (const auto& [path, t] : files) {
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
      throw Error(ErrorCode::kIo, path + ": is a directory; nothing was written");
  }
  try {
    for (const auto& [path, t] : files) {
      tmps.push_back(path + ".tmp-" + std::to_string(::getpid()));
      write_file(tmps.back(), path, t);
    }
    for (size_t i = 0; i < files.size(); ++i)
      if (std::rename(tmps[i].c_str(), files[i].first.c_str()) != 0)
        throw Error(ErrorCode::kIo, files[i].first + ": cannot rename the written file into place: " + std::strerror(errno));
  } catch (...) {
    drop_tmps();
    throw;
  }
}

}  // namespace tessera::npy

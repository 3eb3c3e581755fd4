#include "dispatch/arg_check.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "tessera/error.h"

namespace tessera::dispatch {

void ArgCheck::fail(const std::string& msg) const { throw Error(ErrorCode::kInvalidArgument, kernel_ + ": " + msg); }

namespace {
constexpr double kF32Max = std::numeric_limits<float>::max();
// 1e+39, 1.17549435e-38: std::to_string's fixed notation prints 1e39 with 40 digits, 1e-39 as 0.
std::string g(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.9g", v);  // 9 digits: every f32 apart, FLT_MAX from just past it
  return b;
}
}  // namespace

double ArgCheck::softmax_scale(const std::optional<double>& scale, int64_t D) const {
  if (scale && !(*scale > 0.0 && *scale <= kF32Max))  // NaN fails both
    fail("scale must be finite in f32 and > 0, got " + g(*scale));
  return scale ? *scale : 1.0 / std::sqrt(static_cast<double>(D));
}

double ArgCheck::positive_f32(double v, const std::string& what) const {
  // Past FLT_MAX it is inf in f32; below half the smallest subnormal, 0 (a v_scale of 1e-50 gave o = 0).
  if (!(v > 0.0 && v <= kF32Max && static_cast<float>(v) > 0.0f))
    fail(what + " must be finite in f32 and > 0, got " + g(v));
  return v;
}

void ArgCheck::nonnegative_f32(double v, const std::string& what) const {
  if (!(v >= 0.0 && v <= kF32Max)) fail(what + " must be finite in f32 and >= 0, got " + g(v));
}

void ArgCheck::softcap(double c, const std::string& what) const {
  constexpr double kMin = std::numeric_limits<float>::min();
  if (!(c == 0.0 || (c >= kMin && c <= kF32Max)))
    fail(what + " must be 0 (off) or in [" + g(kMin) + ", " + g(kF32Max) + "] (a normal f32), got " + g(c));
}

int64_t ArgCheck::window(int64_t w, const std::string& what, int64_t span) const {
  if (w < -1) fail(what + " must be >= 0 or -1 (unbounded), got " + std::to_string(w));
  return span >= 0 && w >= span ? -1 : w;
}

int64_t ArgCheck::offsets(const TensorView& cu, int64_t total, const std::string& what, const std::string& rows) const {
  const int32_t* c = static_cast<const int32_t*>(cu.data);
  const int64_t n = cu.numel() - 1;  // sequences
  if (n < 0) fail(what + " must be [N+1] with N >= 0, got [0]");
  if (c[0] != 0) fail(what + "[0] must be 0, got " + std::to_string(c[0]));
  int64_t longest = 0;
  for (int64_t s = 0; s < n; ++s) {
    if (c[s + 1] < c[s])
      fail("sequence " + std::to_string(s) + ": " + what + " must be non-decreasing, got " + what + "[" +
           std::to_string(s) + "] = " + std::to_string(c[s]) + " then " + what + "[" + std::to_string(s + 1) +
           "] = " + std::to_string(c[s + 1]));
    longest = std::max<int64_t>(longest, c[s + 1] - c[s]);
  }
  if (c[n] != total)
    fail((n > 0 ? "sequence " + std::to_string(n - 1) + ": " : std::string("no sequences (N=0): ")) + what + "[N=" +
         std::to_string(n) + "] = " + std::to_string(c[n]) + " must equal the " + rows + " (" + std::to_string(total) +
         ")");
  return longest;
}

void ArgCheck::pages(const Pages& pg, const std::string& table, const std::string& lens) const {
  if (pg.page_size < 1) fail("page_size must be >= 1, got " + std::to_string(pg.page_size));
  for (int64_t s = 0; s < pg.N; ++s) {
    const std::string seq = "sequence " + std::to_string(s) + ": ", at = std::string("[").append(std::to_string(s));
    const int64_t L = pg.lens[s];
    // L <= max_pages·page_size without the product (it overflows for a huge page_size)
    if (L < 0 || (L > 0 && (L - 1) / pg.page_size >= pg.max_pages))
      fail(seq + lens + at + "] = " + std::to_string(L) + " is outside [0, max_pages·page_size = " +
           std::to_string(pg.max_pages) + "·" + std::to_string(pg.page_size) + "]");
    for (int64_t k = 0; k * pg.page_size < L; ++k) {
      const int64_t id = pg.table[s * pg.max_pages + k];
      if (id < 0 || id >= pg.P)
        fail(seq + table + at + ", " + std::to_string(k) + "] = " + std::to_string(id) + " is not a page of the cache [0, P=" +
             std::to_string(pg.P) + ")");
    }
  }
}

void ArgCheck::device(const TensorView& t, const Device& d, const std::string& what) const {
  if (t.device != d) fail(what + " is on " + t.device.str() + " but " + anchor_ + " is on " + d.str());
}

void ArgCheck::contiguous(const TensorView& t, const std::string& what) const {
  if (!t.is_contiguous())
    fail(what + " must be contiguous (row-major), got strides " + shape_str(t.strides) + " for shape " +
         shape_str(t.shape));
}

void ArgCheck::data(const TensorView& t, const std::string& what) const {
  if (t.data == nullptr && t.numel() > 0) fail(what + " has no data (null pointer)");
}

void ArgCheck::plain(const TensorView& t, const Device& d, const std::string& what) const {
  device(t, d, what);
  contiguous(t, what);
  data(t, what);
}

void ArgCheck::shape(const TensorView& t, const Shape& want, const std::string& what) const {
  if (t.shape != want) fail(what + " must have shape " + shape_str(want) + ", got " + shape_str(t.shape));
}

void ArgCheck::dtype(const TensorView& t, DType want, const std::string& what) const {
  if (t.dtype != want) fail(what + " must be " + dtype_name(want) + ", got " + dtype_name(t.dtype));
}

void ArgCheck::floating(const TensorView& t, const std::string& what) const {
  if (!is_float(t.dtype)) fail(what + " must be f32, bf16 or f16, got " + dtype_name(t.dtype));
}

void ArgCheck::integer(const TensorView& t, const std::string& what) const {
  if (t.dtype != DType::kI32 && t.dtype != DType::kI64) fail(what + " must be int32 or int64, got " + dtype_name(t.dtype));
}

void ArgCheck::host(const TensorView& t, const std::string& what) const {
  if (t.device.type != DeviceType::kCPU) fail(what + " must be in host memory (also for device inputs), got " + t.device.str());
  contiguous(t, what);
  data(t, what);
}

void ArgCheck::tensor(const TensorView& t, const Device& d, const Shape& s, DType dt, const std::string& what) const {
  shape(t, s, what);
  dtype(t, dt, what);
  plain(t, d, what);
}

void ArgCheck::output(const TensorView& t, DType input, const Shape& s, const Device& d, const std::string& what) const {
  if (t.dtype != DType::kF32 && t.dtype != input)
    fail(what + " must be f32" + (input != DType::kF32 ? std::string(" or ") + dtype_name(input) : "") + ", got " +
         dtype_name(t.dtype));
  shape(t, s, what);
  plain(t, d, what);
}

namespace {
// "a, b and c"; how many of the views are given.
std::pair<std::string, size_t> names_given(const std::vector<std::pair<std::string, TensorView>>& views) {
  std::string names;
  size_t n = 0;
  for (size_t i = 0; i < views.size(); ++i) {
    if (i > 0) names += i + 1 == views.size() ? " and " : ", ";
    names += views[i].first;
    n += given(views[i].second);
  }
  return {names, n};
}
}  // namespace

namespace {

// The bytes a view spans: [first, last) of its elements at any stride (0 for an empty view).
std::pair<uintptr_t, uintptr_t> span(const TensorView& t) {
  if (!t.data || t.numel() == 0) return {0, 0};
  int64_t lo = 0, hi = 0;  // element offsets from data
  for (size_t d = 0; d < t.shape.size(); ++d) {
    const int64_t reach = (t.shape[d] - 1) * t.strides[d];
    (reach < 0 ? lo : hi) += reach;
  }
  const auto base = reinterpret_cast<uintptr_t>(t.data);
  const auto esz = static_cast<int64_t>(dtype_size(t.dtype));
  return {base + uintptr_t(lo * esz), base + uintptr_t((hi + 1) * esz)};
}

bool overlap(const TensorView& a, const TensorView& b) {
  const auto [a0, a1] = span(a);
  const auto [b0, b1] = span(b);
  return a0 != a1 && b0 != b1 && a.device == b.device && a0 < b1 && b0 < a1;
}

}  // namespace

void ArgCheck::apart(const Named& outputs, const Named& inputs) const {
  for (size_t o = 0; o < outputs.size(); ++o) {
    const auto& [name, view] = outputs[o];
    for (const auto& [other, in] : inputs)
      if (overlap(view, in)) fail(name + " shares memory with " + other + ": an output must not alias an input (copy first)");
    for (size_t p = o + 1; p < outputs.size(); ++p)
      if (overlap(view, outputs[p].second))
        fail(name + " shares memory with " + outputs[p].first + ": outputs must not alias each other");
  }
}

bool ArgCheck::together(const std::vector<std::pair<std::string, TensorView>>& views) const {
  const auto [names, n] = names_given(views);
  need(n == 0 || n == views.size(), names + " go together: give all or none, got " + num(int64_t(n)) + " of " +
                                        num(int64_t(views.size())));
  return n == views.size() && n > 0;
}

bool ArgCheck::exactly_with(bool with, const std::string& what,
                            const std::vector<std::pair<std::string, TensorView>>& views) const {
  const auto [names, n] = names_given(views);
  if (with && n != views.size()) fail(names + " are required with " + what);
  if (!with && n != 0) fail(names + " are written only with " + what);
  return with;
}

void ArgCheck::finite(const TensorView& t, const std::string& what, bool allow_neg_inf) const {
  if (!all_finite(t, allow_neg_inf)) fail(what + " contains NaN or Inf");
}

void ArgCheck::positive(const TensorView& t, const std::string& what, const std::string& why) const {
  if (t.device.type != DeviceType::kCPU || t.data == nullptr) return;
  for (int64_t i = 0; i < t.numel(); ++i) {
    const double v = is_float(t.dtype) ? double(load_as_f32(t.data, t.dtype, i)) : double(load_as_i64(t.data, t.dtype, i));
    if (!(v > 0.0))
      fail(what + " must be > 0 everywhere (" + why + "), got " + what + "[" + std::to_string(i) + "] = " +
           std::to_string(v));
  }
}

bool all_finite(const TensorView& t, bool allow_neg_inf) {
  if (t.device.type != DeviceType::kCPU || t.data == nullptr) return true;  // device data is not inspected
  for (int64_t i = 0; i < t.numel(); ++i) {
    const float x = load_as_f32(t.data, t.dtype, i);
    if (std::isfinite(x) || (allow_neg_inf && x == -std::numeric_limits<float>::infinity())) continue;
    return false;
  }
  return true;
}

}  // namespace tessera::dispatch

// Tessera internal: the tensor checks every kernel's API runs before anything is written, written
// once. Each failure is one line, Error(kInvalidArgument) "<kernel>: <what> ...", so that a
// rejected call leaves every output untouched and names the argument at fault.
//
//   const dispatch::ArgCheck args{"slstm", "wx"};   // the kernel; the input other tensors follow
//   args.plain(r, dev, "r");                        // on dev, contiguous (row-major), with data
//   args.tensor(b, dev, {4, NH, DH}, dtype, "b");   // and this shape and dtype
//   args.output(dq, dtype, q.shape, dev, "dq");     // f32 or the inputs' dtype, shape, plain
//   if (opt.check_finite) args.finite(x, "x");      // host data only
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tessera/tensor.h"

namespace tessera::dispatch {

class ArgCheck {
 public:
  // kernel: the message prefix. anchor: the input whose device the others must share (named in
  // the device mismatch message: "k is on cuda:0 but q is on cpu").
  ArgCheck(std::string kernel, std::string anchor) : kernel_(std::move(kernel)), anchor_(std::move(anchor)) {}

  [[noreturn]] void fail(const std::string& msg) const;
  void need(bool ok, const std::string& msg) const {
    if (!ok) fail(msg);
  }

  // "<what> is on D but <anchor> is on E"
  void device(const TensorView& t, const Device& d, const std::string& what) const;
  // "<what> must be contiguous (row-major), got strides S for shape T"
  void contiguous(const TensorView& t, const std::string& what) const;
  // "<what> has no data (null pointer)" unless it is empty
  void data(const TensorView& t, const std::string& what) const;
  // device, contiguous and data together
  void plain(const TensorView& t, const Device& d, const std::string& what) const;
  // "<what> must have shape S, got T"
  void shape(const TensorView& t, const Shape& want, const std::string& what) const;
  // "<what> must be D, got E"
  void dtype(const TensorView& t, DType want, const std::string& what) const;
  // "<what> must be f32, bf16 or f16, got D"
  void floating(const TensorView& t, const std::string& what) const;
  // "<what> must be int32 or int64, got D" (sizes, masks)
  void integer(const TensorView& t, const std::string& what) const;
  // An index, size or mask tensor the API reads on the host whatever the device of the others:
  // "<what> must be in host memory (also for device inputs), got D", then contiguous with data.
  void host(const TensorView& t, const std::string& what) const;
  // shape, dtype, then plain
  void tensor(const TensorView& t, const Device& d, const Shape& shape, DType dt, const std::string& what) const;
  // An output (or upstream gradient) in f32 or the inputs' dtype `input`: "<what> must be f32 or
  // bf16, got f16", then shape and plain.
  void output(const TensorView& t, DType input, const Shape& shape, const Device& d, const std::string& what) const;
  // "<what> contains NaN or Inf" when a host element is NaN or ±Inf (-Inf allowed with
  // allow_neg_inf); device data is not inspected.
  void finite(const TensorView& t, const std::string& what, bool allow_neg_inf = false) const;
  // "<what> must be > 0 everywhere (<why>), got <what>[i] = v" for the first host element that is
  // not > 0 (NaN included; any dtype); device data is not inspected.
  void positive(const TensorView& t, const std::string& what, const std::string& why) const;

  // Scalar options the backends use in f32, where a finite double past FLT_MAX is inf (a scale of
  // 1e39 gave lse = inf, a softcap of 1e39 gave o = 0 and lse = -inf, before these were shared).
  // "scale must be finite in f32 and > 0, got X"; returns it, or 1/sqrt(D) when none is given.
  double softmax_scale(const std::optional<double>& scale, int64_t D) const;
  // "<what> must be finite in f32 and >= 0, got X"
  void nonnegative_f32(double v, const std::string& what) const;
  // "<what> must be finite in f32 and > 0, got X"; returns v (a dequantization scale).
  double positive_f32(double v, const std::string& what) const;
  // A soft cap c·tanh(s/c): 0 (off) or a normal f32 (below FLT_MIN the backward divides by 0:
  // NaN gradients, and LCE's forward dropped the cap). "<what> must be 0 (off) or in [..], got X"
  void softcap(double c, const std::string& what) const;
  // "<what> must be >= 0 or -1 (unbounded), got W". Returns w, or -1 when w >= span (a window
  // as long as every query's and key's span together reaches every key: i + w then cannot overflow).
  int64_t window(int64_t w, const std::string& what, int64_t span = -1) const;

  // Ragged sequences (host i32 index data, shapes already checked); each failure names the
  // sequence ("sequence 2: ..."). offsets [N+1]: start at 0, never decrease, end at `total` (the
  // <rows>, e.g. "rows of q"); returns the longest sequence.
  int64_t offsets(const TensorView& cu, int64_t total, const std::string& what, const std::string& rows) const;
  // Paged keys of N sequences: 0 <= lens[s] <= max_pages·page_size, and every page id in
  // page_table [N, max_pages] that the first lens[s] keys of sequence s read is a page in [0, P).
  struct Pages {
    const int32_t* table;  // [N, max_pages]
    const int32_t* lens;   // [N]
    int64_t N, max_pages, page_size, P;
  };
  void pages(const Pages& pg, const std::string& table, const std::string& lens) const;

  // Optional tensors given all or none: "h0, c0, n0 and m0 go together: give all or none, got 2
  // of 4". Returns whether all were given.
  bool together(const std::vector<std::pair<std::string, TensorView>>& views) const;
  // Tensors given exactly when `with` holds (gradients of an optional input): "dc0 and dn0 are
  // required with <what>" / "dc0 and dn0 are written only with <what>". Returns `with`.
  bool exactly_with(bool with, const std::string& what,
                    const std::vector<std::pair<std::string, TensorView>>& views) const;

  // No output shares memory with an input or with another output (the bytes each view spans, on
  // one device): "c_last shares memory with c0: an output must not alias an input or another
  // output (copy first)". A backend reads inputs after it has written outputs, and an autotune
  // sweep writes the outputs before the call it keeps.
  using Named = std::vector<std::pair<std::string, TensorView>>;
  void apart(const Named& outputs, const Named& inputs) const;

  const std::string& kernel() const { return kernel_; }

 private:
  std::string kernel_, anchor_;
};

// Whether an optional view was given (data or a shape: an empty tensor is given).
inline bool given(const TensorView& t) { return t.data != nullptr || !t.shape.empty(); }
// True when no host element is NaN (nor ±Inf; -Inf allowed with allow_neg_inf). Device data: true.
bool all_finite(const TensorView& t, bool allow_neg_inf = false);
inline std::string num(int64_t v) { return std::to_string(v); }

}  // namespace tessera::dispatch

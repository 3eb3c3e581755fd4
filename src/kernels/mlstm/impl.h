// Tessera internal: the contract between the mlstm API and its implementations.
//
// api.cc validates the user's views and hands implementations one Problem over f32 host arrays in
// the public header's shapes (DK = DHQK, DV = DHV; resets as 0/1 bytes), contiguous, row-major
// (inputs in other dtypes converted once, outputs converted back); absent optional ones nullptr.
// A device call (device not the CPU: the cuda backend) converts nothing: the f32 pointers of the
// f32 arrays (states, their gradients, c_last …) are the caller's device pointers, and the arrays
// that may be another dtype are handed over as they are in `dev` (q, k, v, i, f, resets, h, dh,
// dq … df), their f32 pointers left nullptr.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "dispatch/registry.h"
#include "tessera/mlstm.h"
#include "tune/fwd.h"

namespace tessera::mlstm {

inline constexpr const char* kKernelName = "mlstm";
inline constexpr int64_t kDefaultChunk = 64;
using dispatch::Availability;

// A device call's array in its own dtype (resets: i32 or i64).
struct DevIn {
  const void* data = nullptr;
  DType dtype = DType::kF32;
};
struct DevOut {
  void* data = nullptr;
  DType dtype = DType::kF32;
};

struct Problem {
  int64_t B = 0, NH = 0, S = 0, DK = 0, DV = 0;
  Device device;
  double eps = 1e-6;
  int64_t chunk = 0;  // Options::chunk_size (0: the backend's default)
  int num_threads = 1;
  const float *q = nullptr, *k = nullptr, *v = nullptr, *i = nullptr, *f = nullptr;
  const uint8_t* resets = nullptr;  // [B, S]
  const float *c0 = nullptr, *n0 = nullptr, *m0 = nullptr;
  struct {
    DevIn q, k, v, i, f, resets;
  } dev;                   // device calls only
  void* stream = nullptr;  // device calls: cudaStream_t (nullptr: the default stream)
  bool reset_at(int64_t b, int64_t t) const { return resets && t > 0 && resets[b * S + t] != 0; }
};

struct ForwardOut {
  float* h = nullptr;                                        // [B, NH, S, DV]
  float *c_last = nullptr, *n_last = nullptr, *m_last = nullptr;  // optional
  DevOut h_dev;                                              // device calls: h
};

struct BackwardArgs {
  const float* dh = nullptr;                                 // [B, NH, S, DV]
  const float *dc_last = nullptr, *dn_last = nullptr;        // optional
  float *dq = nullptr, *dk = nullptr, *dv = nullptr, *di = nullptr, *df = nullptr;
  float *dc0 = nullptr, *dn0 = nullptr;                      // with an initial state
  DevIn dh_dev;                                              // device calls: dh, dq … df
  DevOut dq_dev, dk_dev, dv_dev, di_dev, df_dev;
};

class Implementation : public dispatch::ImplementationBase {
 public:
  virtual Availability supports(const Problem& p) const = 0;
  virtual void forward(const Problem& p, const ForwardOut& out) const = 0;
  // Recomputes what it needs of the forward.
  virtual void backward(const Problem& p, const BackwardArgs& args) const = 0;
  // Both passes in one call (the fused pass: forward_backward in the API). The default runs them
  // one after the other; cpu shares the chunk states between them.
  virtual void forward_backward(const Problem& p, const ForwardOut& out, const BackwardArgs& args) const {
    forward(p, out);
    backward(p, args);
  }
};

using Registry = dispatch::Registry<Implementation>;
Registry& registry();

// The chunk length's tuning (tuning.cc) and its checked-in table (tuned_table.cc, generated).
const tune::Declared& tuning();
const std::vector<tune::TableEntry>& tuned_table();

std::unique_ptr<Implementation> make_reference_implementation();  // reference.cc
std::unique_ptr<Implementation> make_cpu_implementation();        // cpu.cc (TESSERA_CPU_BACKEND)
std::unique_ptr<Implementation> make_cuda_implementation();       // cuda.cu (the CUDA module)

}  // namespace tessera::mlstm

// Tessera internal: the contract between the slstm API and its implementations.
//
// api.cc validates the views and normalizes them into one Problem (sizes, raw pointers, dtypes).
// An implementation runs the forward (h, optional last state) and, when `backward`, the backward
// through time into the gradients; forward outputs it is not asked for are null.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "dispatch/registry.h"
#include "tessera/slstm.h"
#include "tune/fwd.h"

namespace tessera::slstm {

inline constexpr const char* kKernelName = "slstm";
using dispatch::Availability;

struct Problem {
  int64_t B = 0, S = 0, NH = 0, DH = 0;
  DType dtype = DType::kF32;  // of wx, r, b, dwx, dr, db
  Device device;
  const void* wx = nullptr;  // [B, S, 4, NH, DH]
  const void* r = nullptr;   // [4, NH, DH, DH]
  const void* b = nullptr;   // [4, NH, DH]
  // resets [B, S] as 0/1 bytes in host memory whatever the device (api.cc converts the caller's
  // mask); null: none.
  const uint8_t* resets = nullptr;
  const float *h0 = nullptr, *c0 = nullptr, *n0 = nullptr, *m0 = nullptr;  // [B, NH, DH] or all null

  // h [B, S, NH, DH] in h_dtype (f32 or the inputs' dtype: each value the f32 h rounded once);
  // null in a backward-only call. No implementation reads it back (the backward recomputes).
  void* h = nullptr;
  DType h_dtype = DType::kF32;
  float *h_last = nullptr, *c_last = nullptr, *n_last = nullptr, *m_last = nullptr;

  bool backward = false;
  const float* dh = nullptr;  // [B, S, NH, DH] f32 (host inputs: api.cc widens a rounded dh once)
  // The caller's dh as given (f32 or the inputs' dtype): what a device implementation reads.
  const void* dh_given = nullptr;
  DType dh_dtype = DType::kF32;
  const float *dh_last = nullptr, *dc_last = nullptr, *dn_last = nullptr;  // optional
  void *dwx = nullptr, *dr = nullptr, *db = nullptr;                         // dtype
  float *dh0 = nullptr, *dc0 = nullptr, *dn0 = nullptr;                      // with an initial state

  int num_threads = 1;
  int64_t batch_block = 0;  // Options::batch_block (0: tuned or the backend's default)
  void* stream = nullptr;   // ExecOptions::stream (device implementations)

  bool has_initial() const { return h0 != nullptr; }
  bool reset(int64_t bi, int64_t t) const { return t > 0 && resets != nullptr && resets[bi * S + t] != 0; }
  // Element offsets.
  int64_t wx_at(int64_t bi, int64_t t, int64_t g, int64_t hd, int64_t k) const {
    return (((bi * S + t) * 4 + g) * NH + hd) * DH + k;
  }
  int64_t r_at(int64_t g, int64_t hd, int64_t j, int64_t k) const { return ((g * NH + hd) * DH + j) * DH + k; }
  int64_t b_at(int64_t g, int64_t hd, int64_t k) const { return (g * NH + hd) * DH + k; }
  int64_t h_at(int64_t bi, int64_t t, int64_t hd, int64_t k) const { return ((bi * S + t) * NH + hd) * DH + k; }
  int64_t state_at(int64_t bi, int64_t hd, int64_t k) const { return (bi * NH + hd) * DH + k; }
};

class Implementation : public dispatch::ImplementationBase {
 public:
  virtual Availability supports(const Problem& p) const = 0;
  virtual void run(const Problem& p) const = 0;  // forward; then backward when p.backward
};

using Registry = dispatch::Registry<Implementation>;
Registry& registry();

// The batch block's tuning (tuning.cc) and its checked-in table (tuned_table.cc, generated).
const tune::Declared& tuning();
const std::vector<tune::TableEntry>& tuned_table();

std::unique_ptr<Implementation> make_reference_implementation();
std::unique_ptr<Implementation> make_cpu_implementation();   // cpu.cc (TESSERA_CPU_BACKEND)
std::unique_ptr<Implementation> make_cuda_implementation();  // cuda.cu (the CUDA module)

}  // namespace tessera::slstm

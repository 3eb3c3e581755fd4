// slstm, cuda backend: the host arithmetic of a launch — the shared memory a block needs and how
// many rows of r go to registers so that it fits the device. Plain C++ (no CUDA headers), so the
// tests check it without a GPU (SlstmCudaPlan.* in tests/kernels/slstm_cuda_test.cc) and cuda.cu
// uses exactly what was tested. Design: docs/kernels/slstm.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>

namespace tessera::slstm::cuda_plan {

inline constexpr int64_t kMaxDH = 128;
inline constexpr int kRows = 4;          // batch rows per block: r is read once per step for all of them
inline constexpr int kRegRows = 32;      // rows of r (columns of rᵀ) held in registers when shared memory is short
inline constexpr int kMaxThreads = 512;  // 4·kMaxDH columns: one thread each

// Threads of a block: one per column g·DH + k of the step's product, a whole number of warps.
inline int threads_for(int64_t DH) { return static_cast<int>((4 * DH + 31) / 32 * 32); }

// Bytes of shared memory of a block: f32 work arrays, then the resident part of r in the inputs'
// dtype (esz bytes per element), jr rows of it being in registers instead.
//   forward: h, c, n, m [kRows][DH], pre [kRows][4·DH]; r [DH − jr][4·DH]
//   backward: dh, dc, dn [kRows][DH], dpre and the gates' partial sums [kRows][4·DH]; rᵀ [4][DH − jr][DH]
inline size_t forward_smem(int64_t DH, size_t esz, int jr) {
  return sizeof(float) * size_t(4 * kRows * DH + kRows * 4 * DH) + esz * size_t((DH - jr) * 4 * DH);
}
inline size_t backward_smem(int64_t DH, size_t esz, int jr) {
  return sizeof(float) * size_t(3 * kRows * DH + 2 * kRows * 4 * DH) + esz * size_t(4 * (DH - jr) * DH);
}

// The rows of r held in registers (0, else kRegRows) so that both kernels' shared memory fits
// `optin` bytes (the device's opt-in limit per block); -1 when neither does.
inline int register_rows(int64_t DH, size_t esz, size_t optin) {
  for (int jr : {0, kRegRows})
    if (jr <= DH && forward_smem(DH, esz, jr) <= optin && backward_smem(DH, esz, jr) <= optin) return jr;
  return -1;
}

}  // namespace tessera::slstm::cuda_plan

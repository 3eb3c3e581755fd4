// slstm: the cuda backend's kernels (src/kernels/slstm/cuda_kernels.cuh, the very text nvcc
// compiles) run on the CPU against the reference: each CUDA thread of a block is a host thread,
// __syncthreads a std::barrier, the blocks of a grid one after another, shared memory filled with
// NaN bytes before each block (a read of something not written shows). This checks the kernels'
// indexing, layouts, phases and math on any machine; what it cannot check (launch configuration,
// the device's memory and timing) is left to SlstmCuda.* on a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tessera/dtype.h"
#include "tessera/slstm.h"

// ---- the CUDA vocabulary the kernels use, on host threads ----
namespace emu {
struct Dim3 {
  unsigned x = 0, y = 0, z = 0;
};
inline thread_local Dim3 thread_idx;
inline Dim3 block_idx, block_dim;
inline std::barrier<>* block_barrier = nullptr;
alignas(16) inline unsigned char shared[256 * 1024];
}  // namespace emu
#define TESSERA_CUDA_EMULATION 1
#define TESSERA_BLOCK_SMEM(name) unsigned char* name = emu::shared
#define threadIdx emu::thread_idx
#define blockIdx emu::block_idx
#define blockDim emu::block_dim
#define __syncthreads() emu::block_barrier->arrive_and_wait()
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(x)
#define __align__(x)
struct __nv_bfloat16 {  // the f32 instantiations are the ones run here; these only compile
  float v;
};
struct __half {
  float v;
};
inline float __bfloat162float(__nv_bfloat16 x) { return x.v; }
inline float __half2float(__half x) { return x.v; }
inline __nv_bfloat16 __float2bfloat16(float x) { return {x}; }
inline __half __float2half(float x) { return {x}; }
// The rounding stores (h in the inputs' dtype): the value the device stores, held as an f32.
inline __nv_bfloat16 __float2bfloat16_rn(float x) { return {tessera::bf16_to_f32(tessera::f32_to_bf16(x))}; }
inline __half __float2half_rn(float x) { return {tessera::f16_to_f32(tessera::f32_to_f16(x))}; }
using std::min;

#include "kernels/slstm/cuda_kernels.cuh"

namespace tessera::slstm {
namespace {

using namespace cuda_kernels;  // NOLINT

template <class Body>
void launch(unsigned gx, unsigned gy, int threads, Body body) {
  for (unsigned by = 0; by < gy; ++by)
    for (unsigned bx = 0; bx < gx; ++bx) {
      emu::block_idx = {bx, by, 0}, emu::block_dim = {unsigned(threads), 1, 1};
      std::memset(emu::shared, 0xff, sizeof(emu::shared));  // NaN in every f32
      std::barrier<> bar(threads);
      emu::block_barrier = &bar;
      std::vector<std::thread> ts;
      for (int t = 0; t < threads; ++t) ts.emplace_back([&body, t] { emu::thread_idx.x = unsigned(t), body(); });
      for (auto& t : ts) t.join();
    }
}

struct Case {
  int64_t B, S, NH, DH;
  int jr;  // rows of r in registers: 0 or kRegRows (both paths at any DH)
  bool initial, resets;
  float gate_scale;
};

// Built by appending: GCC 12 warns (-Wstringop-overflow, a false positive) on "B" + std::string.
std::string name(const Case& c) {
  std::string n;
  for (const auto& [key, v] : {std::pair<const char*, int64_t>{"B", c.B}, {"S", c.S}, {"NH", c.NH}, {"DH", c.DH}, {"_jr", c.jr}}) {
    n += key;
    n += std::to_string(v);
  }
  n += c.initial ? "_init" : "";
  n += c.resets ? "_resets" : "";
  n += "_gates";
  n += std::to_string(int(c.gate_scale));
  return n;
}

// Forward (h, last state) and backward (dwx, dr, db, dh0, dc0, dn0 from dh, dh_last, dc_last,
// dn_last) of the emulated kernels against the reference API. Tolerance: 1e-5 of each field's
// largest magnitude (both in f32 against double; measured ≤ 7e-7 on these cases).
void expect_matches_reference(const Case& c, uint64_t seed) {
  SCOPED_TRACE(name(c));
  const int64_t B = c.B, S = c.S, NH = c.NH, DH = c.DH;
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  auto make = [&](size_t n, float scale, float add = 0.0f) {
    std::vector<float> v(n);
    for (float& x : v) x = u(rng) * scale + add;
    return v;
  };
  const size_t cells = size_t(B * S * NH * DH), st = size_t(B * NH * DH);
  std::vector<float> wx = make(4 * cells, c.gate_scale), r = make(size_t(4 * NH * DH * DH), 0.5f / std::sqrt(float(DH)));
  std::vector<float> b = make(size_t(4 * NH * DH), 0.5f), h0 = make(st, 1), c0 = make(st, 1), n0 = make(st, 0.5f, 1.0f);
  std::vector<float> m0 = make(st, 1), dh = make(cells, 1), dhl = make(st, 1), dcl = make(st, 1), dnl = make(st, 1);
  std::vector<int32_t> rs(size_t(B * S));
  std::vector<uint8_t> rs8(rs.size());
  for (size_t i = 0; i < rs.size(); ++i) rs[i] = c.resets && u(rng) > 0.3f, rs8[i] = uint8_t(rs[i]);

  auto view = [](std::vector<float>& v, Shape s) { return TensorView(v.data(), DType::kF32, std::move(s)); };
  const Shape sts{B, NH, DH}, hs{B, S, NH, DH}, wxs{B, S, 4, NH, DH};
  std::vector<float> H(cells), HL(st), CL(st), NL(st), ML(st), DWX(4 * cells), DR(r.size()), DB(b.size());
  std::vector<float> DH0(st), DC0(st), DN0(st);
  Inputs in{view(wx, wxs), view(r, {4, NH, DH, DH}), view(b, {4, NH, DH}), {}, {}, {}, {}, {}};
  if (c.resets) in.resets = TensorView(rs.data(), DType::kI32, {B, S});
  if (c.initial) in.h0 = view(h0, sts), in.c0 = view(c0, sts), in.n0 = view(n0, sts), in.m0 = view(m0, sts);
  Upstream up;
  up.dh = view(dh, hs), up.dh_last = view(dhl, sts), up.dc_last = view(dcl, sts), up.dn_last = view(dnl, sts);
  const Outputs out{view(H, hs), view(HL, sts), view(CL, sts), view(NL, sts), view(ML, sts)};
  Grads g{view(DWX, wxs), view(DR, {4, NH, DH, DH}), view(DB, {4, NH, DH}), {}, {}, {}};
  if (c.initial) g.dh0 = view(DH0, sts), g.dc0 = view(DC0, sts), g.dn0 = view(DN0, sts);
  Options opt;
  opt.implementation = "reference";
  forward_backward(in, up, out, g, opt);

  std::vector<float> h(cells, NAN), hl(st, NAN), cl(st, NAN), nl(st, NAN), ml(st, NAN), tape(kTapeFields * cells, NAN);
  std::vector<float> dpre(4 * cells, NAN), dwx(4 * cells, NAN), dr(r.size(), NAN), db(b.size(), NAN);
  std::vector<float> dh0(st, NAN), dc0(st, NAN), dn0(st, NAN);
  auto init = [&](std::vector<float>& v) { return c.initial ? v.data() : nullptr; };
  const Args a{wx.data(), r.data(), b.data(), c.resets ? rs8.data() : nullptr, init(h0), init(c0), init(n0), init(m0),
               h.data(), 0, hl.data(), cl.data(), nl.data(), ml.data(), tape.data(), dh.data(), 0, dhl.data(), dcl.data(),
               dnl.data(), dwx.data(), dpre.data(), init(dh0), init(dc0), init(dn0), B, S, NH, DH};
  const unsigned gx = unsigned(NH), gy = unsigned((B + kRows - 1) / kRows);
  const int threads = threads_for(DH);
  if (c.jr == 0) {
    launch(gx, gy, threads, [&] { slstm_forward<float, 0>(a); });
    launch(gx, gy, threads, [&] { slstm_backward<float, 0>(a); });
  } else {
    launch(gx, gy, threads, [&] { slstm_forward<float, kRegRows>(a); });
    launch(gx, gy, threads, [&] { slstm_backward<float, kRegRows>(a); });
  }
  launch(gx, unsigned((DH + kWeightJ - 1) / kWeightJ), std::min(threads, kMaxThreads),
         [&] { slstm_weight_grads<float>(tape.data(), dpre.data(), B * S, NH, DH, dr.data(), db.data()); });

  auto expect_close = [](const char* field, const std::vector<float>& got, const std::vector<float>& want) {
    double scale = 0.0;
    for (float w : want) scale = std::max(scale, double(std::fabs(w)));
    for (size_t i = 0; i < want.size(); ++i)
      ASSERT_NEAR(got[i], want[i], 1e-5 * scale) << field << "[" << i << "]";
  };
  expect_close("h", h, H), expect_close("h_last", hl, HL), expect_close("c_last", cl, CL);
  expect_close("n_last", nl, NL), expect_close("m_last", ml, ML);
  expect_close("dwx", dwx, DWX), expect_close("dr", dr, DR), expect_close("db", db, DB);
  if (c.initial) expect_close("dh0", dh0, DH0), expect_close("dc0", dc0, DC0), expect_close("dn0", dn0, DN0);
}

TEST(SlstmCudaEmulation, KernelsMatchTheReference) {
  const Case cases[] = {
      {5, 6, 2, 8, 0, true, true, 1.0f},                 // two blocks of rows (4 + 1), resets, initial state
      {5, 6, 2, 13, 0, false, true, 1.0f},               // 52 columns in 64 threads, no initial state
      {1, 1, 1, 8, 0, false, false, 1.0f},               // one step
      {6, 4, 1, 40, kRegRows, true, true, 1.0f},         // rows of r in registers at a small DH
      {3, 5, 2, 16, 0, true, true, 50.0f},               // saturated gates
      {2, 3, 1, 128, kRegRows, true, true, 1.0f},        // f32 at DH = 128, as on an H100
      {2, 3, 1, 64, 0, true, false, 1.0f},
  };
  uint64_t seed = 1;
  for (const Case& c : cases) expect_matches_reference(c, seed++);
}

// h in the inputs' dtype (Args::h_dtype 1 bf16, 2 f16): each element the f32 forward's h rounded
// once, at the same index (the emulated types hold the rounded value as an f32).
TEST(SlstmCudaEmulation, HInBf16OrF16IsTheF32HRoundedOnce) {
  const int64_t B = 5, S = 3, NH = 2, DH = 8;
  const size_t cells = size_t(B * S * NH * DH);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> wx(4 * cells), r(size_t(4 * NH * DH * DH)), b(size_t(4 * NH * DH));
  for (auto* v : {&wx, &r, &b})
    for (float& x : *v) x = u(rng);
  auto run = [&](void* h, int h_dtype) {
    const Args a{wx.data(), r.data(), b.data(), nullptr, nullptr, nullptr, nullptr, nullptr, h, h_dtype,
                 nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 0, nullptr, nullptr, nullptr, nullptr,
                 nullptr, nullptr, nullptr, nullptr, B, S, NH, DH};
    launch(unsigned(NH), unsigned((B + kRows - 1) / kRows), threads_for(DH), [&] { slstm_forward<float, 0>(a); });
  };
  std::vector<float> h32(cells, NAN);
  std::vector<__nv_bfloat16> h16b(cells, __nv_bfloat16{NAN});
  std::vector<__half> h16h(cells, __half{NAN});
  run(h32.data(), 0), run(h16b.data(), 1), run(h16h.data(), 2);
  for (size_t i = 0; i < cells; ++i) {
    ASSERT_TRUE(std::isfinite(h32[i])) << i;
    ASSERT_EQ(h16b[i].v, bf16_to_f32(f32_to_bf16(h32[i]))) << "bf16 h[" << i << "]";
    ASSERT_EQ(h16h[i].v, f16_to_f32(f32_to_f16(h32[i]))) << "f16 h[" << i << "]";
  }
}

}  // namespace
}  // namespace tessera::slstm

// Size: paged_attention's and mla_decode's caches, and grouped_matmul's rhs, with the data a call
// reads around element 2^31 and past element 2^32 (relocated_pages.h): each host implementation
// gives the same bits as on the same case packed at the start. The caches are sparse: about 1 MiB
// of pages written, 8–16 GiB of address space a cache; label `large` with the rest of this
// executable (the three take well under a second).
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "core/random.h"
#include "kernels/mla_decode/testing.h"
#include "kernels/paged_attention/testing.h"
#include "reliability/relocated_pages.h"
#include "tessera/grouped_matmul.h"
#include "tessera/mla_decode.h"
#include "tessera/paged_attention.h"

namespace tessera {
namespace {

using relocated::k2To31;

// The names of the available host implementations of a kernel.
template <class Info>
std::vector<std::string> host_impls(const std::vector<Info>& infos) {
  std::vector<std::string> names;
  for (const auto& i : infos)
    if (i.available && i.device == DeviceType::kCPU) names.push_back(i.name);
  return names;
}

// far[0] holds element 2^31 − 1, far[2] starts at or past 2^31, far[1] is the cache's last page
// and starts past 2^32: the moved case reads all three.
void expect_far(const std::vector<int64_t>& far, int64_t page_elems, int64_t P) {
  ASSERT_GE(far.size(), 3u);
  EXPECT_LT(far[0] * page_elems, k2To31);
  EXPECT_GE((far[0] + 1) * page_elems, k2To31);
  EXPECT_GE(far[2] * page_elems, k2To31);
  EXPECT_EQ(far[1], P - 1);
  EXPECT_GE(far[1] * page_elems, relocated::k2To32);
}

// One sparse cache per tensor, each of `elems` f32 (the largest dtype), reused for the others.
struct SparseCaches {
  std::vector<std::unique_ptr<relocated::SparseHost>> maps;
  explicit SparseCaches(const std::vector<int64_t>& elems) {
    for (int64_t e : elems) maps.push_back(std::make_unique<relocated::SparseHost>(static_cast<size_t>(e) * sizeof(float)));
  }
  bool ok() const {
    return std::all_of(maps.begin(), maps.end(), [](const auto& m) { return m->data() != nullptr; });
  }
  void* operator[](int i) const { return maps[static_cast<size_t>(i)]->data(); }
};

TEST(PagedAttentionLarge, CachePast2To31ElementsGivesTheSameBits) {
  namespace pa = paged_attention;
  pa::testing::CaseSpec c;
  c.q_lens = {1, 5, 2}, c.kv_lens = {40, 37, 16};
  c.Hq = 4, c.Hkv = 2, c.D = 64, c.Dv = 96, c.page_size = 16;  // multiples of 32: the bf16 decode path too
  c.sinks = true, c.shared_pages = true, c.seed = 77;
  const int64_t k_elems = c.page_size * c.Hkv * c.D, v_elems = c.page_size * c.Hkv * c.Dv;
  const int64_t n = pa::testing::make_case(c).k_cache.shape()[0];
  const std::vector<int64_t> far = relocated::far_pages(k_elems, n);  // v's pages are larger: further out
  const int64_t P = relocated::pages_for(k_elems, n);
  expect_far(far, k_elems, P);
  SparseCaches caches({P * k_elems, P * v_elems});
  if (!caches.ok()) GTEST_SKIP() << "this system refuses sparse mappings of " << P * (k_elems + v_elems) * 4 << " bytes";
  for (const DType dt : {DType::kF32, DType::kBF16}) {
    c.dtype = dt;
    const pa::testing::CaseData d = pa::testing::make_case(c);
    relocated::place_pages(d.k_cache.data(), caches[0], k_elems * dtype_size(dt), far, relocated::host_copy);
    relocated::place_pages(d.v_cache.data(), caches[1], v_elems * dtype_size(dt), far, relocated::host_copy);
    const Tensor table = relocated::renumber(d.page_table, far);
    pa::Inputs big = d.inputs();
    big.k_cache = TensorView(caches[0], dt, {P, c.page_size, c.Hkv, c.D});
    big.v_cache = TensorView(caches[1], dt, {P, c.page_size, c.Hkv, c.Dv});
    big.page_table = table.view();
    for (const std::string& impl : host_impls(pa::implementations())) {
      pa::Options opt = pa::testing::options_of(c);
      opt.implementation = impl;
      const pa::Result a = pa::compute(d.inputs(), opt), b = pa::compute(big, opt);
      EXPECT_EQ(b.implementation, impl);
      EXPECT_TRUE(relocated::same_bits(a.o, b.o)) << impl << " " << dtype_name(dt) << ": o differs";
      EXPECT_TRUE(relocated::same_bits(a.lse, b.lse)) << impl << " " << dtype_name(dt) << ": lse differs";
    }
  }
}

// FlashMLA's layout: D = 576 (512 latent + 64 rope), 64 entries a page, 16 heads; two batch
// entries, two query rows each (causal), the second's pages shared with the first's.
TEST(MlaDecodeLarge, CachePast2To31ElementsGivesTheSameBits) {
  namespace mla = mla_decode;
  mla::testing::CaseSpec c;
  c.Sq = 2, c.Hq = 16, c.D = 576, c.Dv = 512, c.page_size = 64;
  c.seqlens = {150, 70};
  c.shared = true, c.seed = 78;
  c.opt.causal = true;
  const int64_t page_elems = c.page_size * c.D, n = mla::testing::make_case(c).kv.shape()[0];
  const std::vector<int64_t> far = relocated::far_pages(page_elems, n);
  const int64_t P = relocated::pages_for(page_elems, n);
  expect_far(far, page_elems, P);
  SparseCaches cache({P * page_elems});
  if (!cache.ok()) GTEST_SKIP() << "this system refuses a sparse mapping of " << P * page_elems * 4 << " bytes";
  const Shape o_shape{c.B(), c.Sq, c.Hq, c.Dv}, lse_shape{c.B(), c.Sq, c.Hq};
  for (const DType dt : {DType::kF32, DType::kBF16}) {
    c.dtype = dt;
    const mla::testing::CaseData d = mla::testing::make_case(c);
    relocated::place_pages(d.kv.data(), cache[0], page_elems * dtype_size(dt), far, relocated::host_copy);
    const Tensor table = relocated::renumber(d.page_table, far);
    mla::Inputs big = d.inputs();
    big.kv_cache = TensorView(cache[0], dt, {P, c.page_size, 1, c.D});
    big.page_table = table.view();
    for (const std::string& impl : host_impls(mla::implementations())) {
      for (const int64_t split : {int64_t{0}, int64_t{64}}) {  // the chosen split, and keys split at a page
        mla::Options opt = c.opt;
        opt.dv = c.Dv, opt.implementation = impl, opt.block_sizes = mla::BlockSizes{split};
        Tensor oa = Tensor::empty(DType::kF32, o_shape), la = Tensor::empty(DType::kF32, lse_shape);
        Tensor ob = Tensor::empty(DType::kF32, o_shape), lb = Tensor::empty(DType::kF32, lse_shape);
        mla::forward(d.inputs(), {oa.view(), la.view()}, opt);
        EXPECT_EQ(mla::forward(big, {ob.view(), lb.view()}, opt), impl);
        EXPECT_TRUE(relocated::same_bits(oa, ob)) << impl << " " << dtype_name(dt) << " split " << split << ": o differs";
        EXPECT_TRUE(relocated::same_bits(la, lb)) << impl << " " << dtype_name(dt) << " split " << split << ": lse differs";
      }
    }
  }
}

// rhs [G, K, N] whose groups sit around element 2^31 and past 2^32: groups 0, 1, 2 of a small
// case (5, 3 and 7 rows, then padding rows) moved to the group that holds element 2^31 − 1, the
// one after it and the last one, in order (rows are sorted by group), every other group empty.
// Forward in both rhs layouts (the backward's dlhs is this product with the layout flipped; its
// drhs would write every group). Block sizes fixed: the tuned ones differ by G's bucket.
TEST(GroupedMatmulLarge, RhsPast2To31ElementsGivesTheSameBits) {
  namespace gm = grouped_matmul;
  const int64_t K = 128, N = 192, G = 3, M = 18;
  const std::vector<int64_t> rows = {5, 3, 7};  // 3 padding rows after them
  std::vector<int64_t> far = relocated::far_pages(K * N, G);
  std::sort(far.begin(), far.end());
  const int64_t big_G = relocated::pages_for(K * N, G);
  ASSERT_EQ(far.back(), big_G - 1);
  ASSERT_GT(far[1] * K * N, k2To31);
  ASSERT_GT(far[2] * K * N, relocated::k2To32);
  SparseCaches rhs_map({big_G * K * N});
  if (!rhs_map.ok()) GTEST_SKIP() << "this system refuses a sparse mapping of " << big_G * K * N * 4 << " bytes";
  Tensor sizes = Tensor::empty(DType::kI64, {G}), big_sizes = Tensor::zeros(DType::kI64, {big_G});
  for (int64_t g = 0; g < G; ++g) {
    sizes.data_as<int64_t>()[g] = rows[static_cast<size_t>(g)];
    big_sizes.data_as<int64_t>()[far[static_cast<size_t>(g)]] = rows[static_cast<size_t>(g)];
  }
  for (const DType dt : {DType::kF32, DType::kBF16})
    for (const bool transposed : {false, true}) {
      const Tensor lhs = random_uniform(dt, {M, K}, 1.0f, 81);
      const Tensor rhs = random_uniform(dt, transposed ? Shape{G, N, K} : Shape{G, K, N}, 1.0f, 82);
      relocated::place_pages(rhs.data(), rhs_map[0], K * N * dtype_size(dt), far, relocated::host_copy);
      const TensorView big_rhs(rhs_map[0], dt, transposed ? Shape{big_G, N, K} : Shape{big_G, K, N});
      for (const std::string& impl : host_impls(gm::implementations())) {
        gm::Options opt;
        opt.transpose_rhs = transposed, opt.implementation = impl, opt.block_sizes = gm::BlockSizes{512, 512};
        const gm::Result a = gm::compute({lhs.view(), rhs.view(), sizes.view()}, opt);
        const gm::Result b = gm::compute({lhs.view(), big_rhs, big_sizes.view()}, opt);
        EXPECT_EQ(b.implementation, impl);
        EXPECT_TRUE(relocated::same_bits(a.out, b.out))
            << impl << " " << dtype_name(dt) << (transposed ? " transpose_rhs" : "") << ": out differs";
      }
    }
}

}  // namespace
}  // namespace tessera

// paged_attention: the bench's baseline, the same math without paging: copy every sequence's
// pages into contiguous k, v ([N·S, Hkv, D]), then attention's varlen forward (causal, cpu). The
// copy is timed with it.
#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>

#include "tessera/attention.h"

namespace tessera::paged_attention {

// q [T, H, D], k_cache and v_cache [P, page_size, Hkv, D], page_table [N, pages], cu_q_lens [N + 1]:
// every sequence holds S keys. The run reads the tensors by reference: they must outlive it.
std::function<void()> gather_attention_baseline(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                                                const Tensor& page_table, const Tensor& cu_q_lens, int64_t S,
                                                int threads) {
  const int64_t N = page_table.shape()[0], pages = page_table.shape()[1], T = q.shape()[0], H = q.shape()[1];
  const int64_t D = q.shape()[2], page_size = k_cache.shape()[1], Hkv = k_cache.shape()[2];
  const size_t row_bytes = static_cast<size_t>(Hkv * D) * dtype_size(q.dtype());
  auto gk = std::make_shared<Tensor>(Tensor::empty(q.dtype(), {N * S, Hkv, D}));
  auto gv = std::make_shared<Tensor>(Tensor::empty(q.dtype(), {N * S, Hkv, D}));
  auto ck = std::make_shared<Tensor>(Tensor::empty(DType::kI32, {N + 1}));
  for (int64_t i = 0; i <= N; ++i) ck->data_as<int32_t>()[i] = static_cast<int32_t>(i * S);
  auto o = std::make_shared<Tensor>(Tensor::empty(q.dtype(), {T, H, D}));
  auto lse = std::make_shared<Tensor>(Tensor::empty(DType::kF32, {H, T}));
  return [&q, &k_cache, &v_cache, &page_table, &cu_q_lens, N, pages, S, page_size, row_bytes, threads, gk, gv, ck, o, lse] {
    const int32_t* pt = page_table.data_as<int32_t>();
    for (int64_t s = 0; s < N; ++s)
      for (int64_t p = 0; p < pages; ++p) {
        const int64_t n = std::min(page_size, S - p * page_size), dst = s * S + p * page_size;
        const int64_t src = static_cast<int64_t>(pt[s * pages + p]) * page_size;
        std::memcpy(gk->data_as<char>() + dst * row_bytes, k_cache.data_as<char>() + src * row_bytes, n * row_bytes);
        std::memcpy(gv->data_as<char>() + dst * row_bytes, v_cache.data_as<char>() + src * row_bytes, n * row_bytes);
      }
    attention::Inputs in;
    in.q = q.view(), in.k = gk->view(), in.v = gv->view(), in.cu_seqlens_q = cu_q_lens.view(), in.cu_seqlens_k = ck->view();
    attention::Options opt;
    opt.causal = true, opt.num_threads = threads;
    attention::forward(in, {o->view(), lse->view()}, opt);
  };
}

}  // namespace tessera::paged_attention

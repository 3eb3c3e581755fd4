// mla_decode: the bench's baseline, the same math without paging: gather each sequence's keys out
// of its pages into contiguous k [B, T, 1, D] and v [B, T, 1, Dv] (values = the first Dv dims of
// each entry), then tessera's attention (cpu) with Hkv = 1. The gather is timed with it.
#include <cstring>
#include <functional>
#include <memory>

#include "tessera/attention.h"
#include "tessera/error.h"

namespace tessera::mla_decode {
namespace {

void gather(const Tensor& kv, const Tensor& page_table, int64_t T, Tensor& k, Tensor& v) {
  const int64_t B = k.shape()[0], D = k.shape()[3], Dv = v.shape()[3], page_size = kv.shape()[1];
  const int64_t pages = page_table.shape()[1];
  const size_t esz = dtype_size(kv.dtype());
  const int32_t* pt = page_table.data_as<int32_t>();
  const auto* cache = static_cast<const char*>(kv.data());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0; j < T; ++j) {
      const char* e = cache + ((int64_t{pt[b * pages + j / page_size]} * page_size + j % page_size) * D) * esz;
      std::memcpy(static_cast<char*>(k.data()) + (b * T + j) * D * esz, e, static_cast<size_t>(D) * esz);
      std::memcpy(static_cast<char*>(v.data()) + (b * T + j) * Dv * esz, e, static_cast<size_t>(Dv) * esz);
    }
}

}  // namespace

// q [B, Sq, Hq, D], kv [P, page_size, 1, D], page_table [B, pages]: every sequence holds T keys. The
// run reads the three tensors by reference: they must outlive it.
std::function<void()> gather_attention_baseline(const Tensor& q, const Tensor& kv, const Tensor& page_table, int64_t T,
                                                int64_t Dv, bool causal, int threads) {
  const int64_t B = q.shape()[0], Sq = q.shape()[1], Hq = q.shape()[2], D = q.shape()[3];
  check(kv.dtype() == q.dtype(), ErrorCode::kInvalidArgument,
        "mla_decode baseline: the cache's dtype must be q's (gather copies its bytes into q-typed k, v)");
  auto k = std::make_shared<Tensor>(Tensor::empty(q.dtype(), {B, T, 1, D}));
  auto v = std::make_shared<Tensor>(Tensor::empty(q.dtype(), {B, T, 1, Dv}));
  auto o = std::make_shared<Tensor>(Tensor::empty(DType::kF32, {B, Sq, Hq, Dv}));
  auto lse = std::make_shared<Tensor>(Tensor::empty(DType::kF32, {B, Hq, Sq}));
  return [&q, &kv, &page_table, T, causal, threads, k, v, o, lse] {
    gather(kv, page_table, T, *k, *v);
    attention::Options opt;
    opt.causal = causal;
    opt.num_threads = threads;
    opt.implementation = "cpu";
    attention::Inputs in;
    in.q = q.view(), in.k = k->view(), in.v = v->view();
    attention::forward(in, {o->view(), lse->view()}, opt);
  };
}

}  // namespace tessera::mla_decode

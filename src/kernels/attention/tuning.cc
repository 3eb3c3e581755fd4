// attention: its block sizes (q rows per query block, kv keys per tile), declared
// (tune/declared.h). The call-time choice (api.cc) and `tessera tune attention` (spec.cc) derive
// from this declaration; every size a call runs with is clamped to its lengths (sanitize_for_shape).
#include <algorithm>

#include "kernels/attention/impl.h"
#include "tune/declared.h"

namespace tessera::attention {

namespace {
using tune::kAny;
int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }
tune::Params params_of(const BlockSizes& b) { return {{"q", b.q}, {"kv", b.kv}}; }

// The default first, then the tunable implementation's own candidates (cpu.cc).
std::vector<tune::Params> candidates(const std::vector<int64_t>&, int) {
  const BlockSizes d;
  std::vector<tune::Params> out{params_of(d)};
  if (const Implementation* cpu = find_implementation("cpu"))
    for (const BlockSizes& b : cpu->candidate_block_sizes(Problem{}))
      if (!(b == d)) out.push_back(params_of(b));
  return out;
}
}  // namespace

BlockSizes sanitize_for_shape(const BlockSizes& bs, const Problem& p) {
  BlockSizes s = bs;
  s.q = std::max<int64_t>(1, std::min(bs.q, round_up(std::max<int64_t>(p.Sq, 1), 16)));
  s.kv = std::max<int64_t>(1, std::min(bs.kv, round_up(std::max<int64_t>(p.Sk, 1), 16)));
  return s;
}

std::string autotune_variant(const Problem& p) {
  auto on = [](bool b) { return b ? "on" : "off"; };
  auto num = [](int64_t v) { return std::to_string(v); };
  // Sq and Sk by their power-of-two class, as the dims (ragged_dims): a decode's keys grow by one
  // each step, a packing's lengths change with each batch.
  return "Sq<=" + num(tune::pow2_class(p.Sq)) + "|Sk<=" + num(tune::pow2_class(p.Sk)) + "|Hkv=" + num(p.Hkv) + "|D=" + num(p.D) + "|Dv=" + num(p.Dv) +
         "|varlen=" + on(p.varlen) + "|causal=" + on(p.causal) + "|window=" + num(p.window_left) + "," +
         num(p.window_right) + "|softcap=" + on(p.softcap > 0) + "|alibi=" + on(p.alibi) + "|segments=" + on(p.seg_q) +
         (p.dropout() ? "|dropout=on" : "") + (p.bias ? "|bias=on" : "");
}

const tune::Declared& tuning() {
  static const tune::Declared d{
      .kernel = kKernelName,
      .options = {"q", "kv"},
      // Dims (B, S, H, D), a call's S and D the larger of Sq, Sk and of D, Dv; first match wins. The
      // head dim changes the best tiles most (the width of every tile product, the bytes per kv row
      // a tile holds in cache). Representative shapes: one sequence of 1024 rows and 4 heads (a full
      // sweep, f32 and bf16, takes a few minutes on the 2-core development machine).
      .buckets = {
          {"d64", "D <= 64: small heads (BERT-style, many vision models)",
           {{"B", 1, kAny, 1}, {"S", 1, kAny, 1024}, {"H", 1, kAny, 4}, {"D", 1, 64, 64}}},
          {"d128", "64 < D <= 128: Llama, Mistral, Qwen",
           {{"B", 1, kAny, 1}, {"S", 1, kAny, 1024}, {"H", 1, kAny, 4}, {"D", 65, 128, 128}}},
          {"d256", "D > 128: Gemma (256)",
           {{"B", 1, kAny, 1}, {"S", 1, kAny, 1024}, {"H", 1, kAny, 4}, {"D", 129, kAny, 256}}},
      },
      .ragged_dims = {"B", "S"},  // varlen's sequence count; the lengths (decode: Sk grows)
      .implementations = {"cpu"},
      .candidates = candidates,
      .carrier = "block_sizes",  // the call's block_sizes option: "q=128,kv=256"
      // cuda and cudnn have fixed tiles of their own.
      .default_of = [](const std::string& impl) {
        const Implementation* i = find_implementation(impl);
        return params_of(i ? i->default_block_sizes(Problem{}) : BlockSizes{});
      },
      // B·H·S²·D multiply-adds: autotune-on-miss from 2^30 on.
      .work = [](const std::vector<int64_t>& d) {
        return double(d.at(0)) * d.at(2) * double(d.at(1)) * d.at(1) * d.at(3);
      },
      .table = tuned_table};
  return d;
}

}  // namespace tessera::attention

// linear_cross_entropy: its block sizes (b tokens, h hidden, v vocabulary per tile), declared
// (tune/declared.h): one declaration for the host backends (cpu, cpu_v2) and one for cuda, whose
// only tuned size is its chunk b. The call-time choice (api.cc) and `tessera tune
// linear_cross_entropy` (spec.cc) derive from them. A call whose choice is the default runs the
// implementation's own default_block_sizes(p) (it depends on the dtype and the memory budget);
// tuned sizes are clamped to the call's shape (sanitize_for_shape).
#include <algorithm>

#include "kernels/linear_cross_entropy/impl.h"
#include "tessera/error.h"
#include "tune/bucket.h"
#include "tune/declared.h"

namespace tessera::linear_cross_entropy {

namespace {
using tune::kAny;
int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

Problem shape(const std::vector<int64_t>& d, DType dtype) {
  Problem p;
  p.B = d.at(0), p.H = d.at(1), p.V = d.at(2);
  p.dtype = dtype;
  return p;
}

// The host backends' default and candidates at these dims, for every input dtype (a declaration's
// candidates see the dims only: the bf16 / f16 variants of h are timed for f32 too), the f32
// default first, duplicates dropped.
std::vector<tune::Params> host_candidates(const std::vector<int64_t>& d, int) {
  std::vector<tune::Params> out;
  const auto add = [&out](const BlockSizes& b) {
    if (std::find(out.begin(), out.end(), to_params(b)) == out.end()) out.push_back(to_params(b));
  };
  const Implementation* cpu = find_implementation("cpu");
  if (!cpu) return {to_params(BlockSizes{})};
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    add(cpu->default_block_sizes(shape(d, dt)));
    for (const BlockSizes& b : cpu->candidate_block_sizes(shape(d, dt))) add(b);
  }
  return out;
}

// cuda's chunk of b tokens (h, v unused): the whole batch first (its default, which the memory
// budget caps), then powers of two from 512 below it.
std::vector<tune::Params> cuda_candidates(const std::vector<int64_t>& d, int) {
  std::vector<tune::Params> out{to_params({d.at(0), d.at(1), d.at(2)})};
  for (int64_t b = 512; b <= 32768 && b < d.at(0); b *= 2) out.push_back(to_params({b, d.at(1), d.at(2)}));
  return out;
}

// The buckets: dimension order (B, H, V); first match wins. Vocabulary size is what separates
// real models most (how many vocabulary tiles a row streams through); token count and hidden
// size are left open. Representative shapes keep each bucket's V but use a small B and H, so
// that a full sweep, f32 and bf16, takes a few minutes on the 2-core development machine.
tune::Declared declare(std::vector<std::string> implementations,
                       std::vector<tune::Params> (*candidates)(const std::vector<int64_t>&, int)) {
  return {
      .kernel = kKernelName,
      .options = {"b", "h", "v"},
      .buckets = {
          {"small", "V <= 16k: toy models, unit-test sized vocabularies",
           {{"B", 1, kAny, 512}, {"H", 1, kAny, 256}, {"V", 1, 16384, 8192}}},
          {"llama2-ish", "16k < V <= 64k: Llama-2 / Mistral (32000), GPT-2 (50257)",
           {{"B", 1, kAny, 256}, {"H", 1, kAny, 512}, {"V", 16385, 65536, 32000}}},
          {"llama3-ish", "64k < V <= 192k: Llama-3 (128256), Qwen-2 (151936)",
           {{"B", 1, kAny, 128}, {"H", 1, kAny, 512}, {"V", 65537, 196608, 128256}}},
          {"gemma-ish", "V > 192k: Gemma (256000)",
           {{"B", 1, kAny, 64}, {"H", 1, kAny, 512}, {"V", 196609, kAny, 256000}}},
      },
      .implementations = std::move(implementations),
      .candidates = candidates,
      .carrier = "block_sizes",  // the call's block_sizes option: "b=256,h=512,v=2048"
      // B·H·V multiply-adds: autotune-on-miss from 2^26 on (a forward of that size takes a few
      // milliseconds on one core; below it the default tiles are within noise).
      .work = [](const std::vector<int64_t>& d) { return double(d.at(0)) * double(d.at(1)) * double(d.at(2)); },
      .min_work = double(int64_t{1} << 26),
      .table = tuned_table};
}
}  // namespace

const tune::Declared& tuning(const std::string& implementation) {
  static const tune::Declared host = declare({"cpu", "cpu_v2"}, host_candidates);
  static const tune::Declared cuda = declare({"cuda"}, cuda_candidates);
  return implementation == "cuda" ? cuda : host;
}

tune::Params to_params(const BlockSizes& bs) { return {{"b", bs.b}, {"h", bs.h}, {"v", bs.v}}; }

BlockSizes from_params(const tune::Params& p) {
  const auto b = tune::param(p, "b"), h = tune::param(p, "h"), v = tune::param(p, "v");
  check(b && h && v, ErrorCode::kInvalidArgument,
        std::string(kKernelName) + ": tuned parameters '" + tune::params_str(p) + "' lack one of b, h, v");
  return {*b, *h, *v};
}

BlockSizes sanitize_for_shape(const BlockSizes& bs, const Problem& p) {
  return {std::min(bs.b, round_up(p.B, 16)), std::min(bs.h, round_up(p.H, 16)), std::min(bs.v, round_up(p.V, 16))};
}

std::string autotune_variant(const Problem& p, const GradOut* g) {
  const auto on = [](bool b) { return b ? "on" : "off"; };
  std::string v = std::string("layout=") + w_layout_name(p.layout) + "|bias=" + (p.bias ? dtype_name(p.bias_dtype) : "none") +
                  "|softcap=" + on(p.softcap > 0) + "|label_smoothing=" + on(p.label_smoothing > 0) +
                  "|argmax=" + on(p.want_argmax);
  // A memory budget changes the route (cpu: a 16-bit dw's gradients in vocabulary slices, the
  // bf16 forward packing per block; cuda: its chunk rows): sizes timed under one class of budget
  // are not the other's. By power-of-two class; no budget keeps the key it always had.
  if (p.memory_budget > 0)
    v += "|budget=" + std::to_string(tune::pow2_class(static_cast<int64_t>(std::min<size_t>(p.memory_budget, size_t{1} << 62))));
  // Gradients left out (a frozen w: two GEMMs of three) time differently: the ones computed, only
  // when some are left out, so that a call with all of them keeps its key.
  const bool dbias_given = g && g->dbias, all = g && g->dx && g->dw && (dbias_given || !p.bias);
  if (g && !all)
    v += std::string("|grads=") + (g->dx ? "dx," : "") + (g->dw ? "dw," : "") + (dbias_given ? "dbias," : "") + ".";
  return v;
}

std::string BlockSizes::str() const { return tune::params_str(to_params(*this)); }

void validate_block_sizes(const std::string& implementation, const BlockSizes& bs) {
  registry().require(implementation).validate_block_sizes(bs);
}

}  // namespace tessera::linear_cross_entropy

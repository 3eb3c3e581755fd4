// Tessera internal: the contract between the linear_cross_entropy API and its implementations.
//
// api.cc validates the user's views and normalizes them into a Problem (flat B tokens, a
// resolved w layout, raw pointers); every implementation (reference, cpu, cuda, ...) receives
// exactly the same Problem and must give the same results (docs/kernels/linear_cross_entropy.md).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dispatch/registry.h"
#include "dispatch/sized_implementation.h"
#include "tessera/linear_cross_entropy.h"
#include "tune/fwd.h"

namespace tessera::linear_cross_entropy {

using dispatch::Availability;

struct Problem {
  int64_t B = 0, H = 0, V = 0;
  DType dtype = DType::kF32;  // of x and w
  Device device;

  const void* x = nullptr;     // [B, H] row-major, contiguous (row stride H)
  const void* w = nullptr;     // kHV: [H, V] row-major; kVH: [V, H] row-major (contiguous)
  WLayout layout = WLayout::kHV;  // resolved: never kAuto
  const void* bias = nullptr;  // [V] or nullptr
  DType bias_dtype = DType::kF32;
  const void* labels = nullptr;  // [B]
  DType label_dtype = DType::kI64;
  const float* weights = nullptr;  // [B] f32 or nullptr (all ones): token × class weights
  std::shared_ptr<const void> keep;  // storage the API made for this problem (combined weights)
  // Class weights with label smoothing (PyTorch's definition): the smoothing term of token t is
  //   smooth_weight(t) · ε/V · Σ_c σ_c · (lse_t − z_tc),   σ = class_weights (else 1).
  // Set only when label_smoothing > 0; without smoothing the API folds class weights into
  // `weights` and leaves these null. token_weights: the caller's token weights alone (or null).
  const float* class_weights = nullptr;  // [V] or nullptr
  const float* token_weights = nullptr;  // [B] or nullptr (ones); read only with class_weights
  double class_weight_sum = 0.0;         // Σ_c class_weights[c]

  Reduction reduction = Reduction::kMean;
  int64_t ignore_index = -100;
  double label_smoothing = 0.0;
  double z_loss_weight = 0.0;
  double softcap = 0.0;
  bool want_argmax = false;

  // Vocab-parallel partial form (Options::vocab_total): 0 = off. Labels are then relative to
  // the slice (a label outside [0, V) is a class held elsewhere: no label term here).
  int64_t V_total = 0;

  int num_threads = 0;  // resolved by the API: >= 1 for CPU backends
  void* stream = nullptr;
  size_t memory_budget = 0;
  // A vocabulary slice of cpu_vocab_slices (or the forward it runs first): the caller's
  // memory_budget went to the slices, so the backend takes no optional scratch (w packed once).
  bool budget_spent = false;

  int64_t label(int64_t t) const { return load_as_i64(labels, label_dtype, t); }
  float weight(int64_t t) const { return weights ? weights[t] : 1.0f; }
  bool ignored(int64_t t) const { return label(t) == ignore_index; }
  // The smoothing term's token weight and Σ_c σ_c (see class_weights).
  float smooth_weight(int64_t t) const {
    if (!class_weights) return weight(t);
    return token_weights ? token_weights[t] : 1.0f;
  }
  double smooth_total() const { return class_weights ? class_weight_sum : vocab(); }
  bool partial() const { return V_total > 0; }
  // The V of ε/V: every class, not only the slice's.
  double vocab() const { return static_cast<double>(partial() ? V_total : V); }
};

// Raw outputs. loss: B floats for kNone, 1 float for kSum / kMean. lse: B floats. argmax: B
// int64 or nullptr. All on problem.device.
struct ForwardOut {
  float* loss = nullptr;  // nullptr in the partial form
  float* lse = nullptr;
  int64_t* argmax = nullptr;
  // Partial form only (Problem::partial()), else nullptr: PartialOutputs in the public header.
  float* label_logit = nullptr;
  float* logit_sum = nullptr;
  float* max_logit = nullptr;  // exactly when argmax
};

struct GradIn {
  const float* grad_loss = nullptr;  // 1 float (kSum / kMean) or B floats (kNone)
  const float* lse = nullptr;        // optional [B]: the forward's lse
};

// A gradient the caller left out (Gradients) is null: an implementation whose skips_gradients()
// is true skips its work; for the others the API passes scratch in its place.
struct GradOut {
  void* dx = nullptr;  // [B, H]
  DType dx_dtype = DType::kF32;
  void* dw = nullptr;  // in problem.layout
  DType dw_dtype = DType::kF32;
  void* dbias = nullptr;  // [V] or nullptr (exactly when problem.bias)
  DType dbias_dtype = DType::kF32;
};

// The generic part (supports, block sizes, tuning hooks, device kind, synchronize) is
// dispatch::SizedImplementation's; a CUDA backend overrides device_kind and synchronize.
class Implementation : public dispatch::SizedImplementation<Problem, BlockSizes> {
 public:
  virtual void forward(const Problem& p, const BlockSizes& bs, const ForwardOut& out) const = 0;
  virtual void backward(const Problem& p, const BlockSizes& bs, const GradIn& g,
                        const GradOut& out) const = 0;
  // Whether backward and forward_backward take null dx / dw / dbias (GradOut) and skip their work.
  virtual bool skips_gradients() const { return false; }
  // Default: forward, then backward with the forward's lse.
  virtual void forward_backward(const Problem& p, const BlockSizes& bs, const GradIn& g,
                                const ForwardOut& fout, const GradOut& gout) const;
};

// Validates the inputs' dtypes, shapes, layouts and the options exactly as a call would, from
// metadata only: no data is read (label values and finiteness are checked by the call itself).
// For callers that must reject a call before they have data (JAX tracing, torch fake tensors).
// Throws the call's Error(kInvalidArgument). Defined in api.cc.
void validate_metadata(const Inputs& in, const Options& opt);

// The registry of this kernel, in default dispatch order. Defined in implementations.cc.
using Registry = dispatch::Registry<Implementation>;
Registry& registry();
const Implementation* find_implementation(const std::string& name);  // nullptr if unknown

// The block sizes' tuning (tuning.cc): cuda's declaration (its chunk b) or the host backends';
// the checked-in table (tuned_table.cc, generated); tuned sizes clamped to the shape (each of b,
// h, v at most its dimension rounded up to 16; never grown); the options besides the dims that
// key an autotuned result (layout, bias, soft cap, label smoothing, argmax).
const tune::Declared& tuning(const std::string& implementation);
const std::vector<tune::TableEntry>& tuned_table();
BlockSizes sanitize_for_shape(const BlockSizes& bs, const Problem& p);
std::string autotune_variant(const Problem& p, const GradOut* g = nullptr);  // g: a gradient pass's outputs
// The sizes as tune::Params ({b, h, v}; spelled out here for the C++17 cuda.cu) and back
// (Error(kInvalidArgument) if one of b, h, v is missing).
using TuneParams = std::vector<std::pair<std::string, int64_t>>;
TuneParams to_params(const BlockSizes& bs);
BlockSizes from_params(const TuneParams& p);

// Factories (each backend's file defines its own).
std::unique_ptr<Implementation> make_reference_implementation();
// Optimized CPU backend (cpu.cc); built when TESSERA_CPU_BACKEND is on (TESSERA_HAVE_CPU_BACKEND).
std::unique_ptr<Implementation> make_cpu_implementation();
// Version cpu_v2 of cpu (cpu.cc: one route differs, Call::use_w_copy; experimental until
// promoted, docs/VERSIONS.md).
std::unique_ptr<Implementation> make_cpu_v2_implementation();
// CUDA backend (cuda.cu): built into the CUDA device module, libtessera_cuda.so, which
// registers it when loaded on first use (implementations.cc declares it).
std::unique_ptr<Implementation> make_cuda_implementation();

}  // namespace tessera::linear_cross_entropy

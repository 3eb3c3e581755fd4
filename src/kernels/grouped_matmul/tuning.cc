// grouped_matmul: shape buckets, cache key, timing and fitting for the tuner.
#include "kernels/grouped_matmul/tuning.h"

#include <algorithm>
#include <limits>
#include <memory>

#include "core/random.h"
#include "tessera/error.h"
#include "tessera/version.h"

namespace tessera::grouped_matmul {

// The buckets, dimension order (M, K, N, G); first match wins. The number of groups sets the
// rows per sgemm call (few large groups: long calls where wide tiles amortize packing; many
// groups: short calls where the tile width trades packing against parallel items). Representative
// shapes: 2048 rows, K=512, N=1024 (a few ms per call on the 2-core development machine).
const std::vector<tune::Bucket>& tuning_buckets() {
  constexpr int64_t kAny = std::numeric_limits<int64_t>::max();
  static const std::vector<tune::Bucket> buckets = {
      {"g8", "G <= 8: few experts, hundreds of rows each",
       {{"M", 1, kAny, 2048}, {"K", 1, kAny, 512}, {"N", 1, kAny, 1024}, {"G", 1, 8, 8}}},
      {"g64", "G > 8: many experts, tens of rows each (fine-grained MoE)",
       {{"M", 1, kAny, 2048}, {"K", 1, kAny, 512}, {"N", 1, kAny, 1024}, {"G", 9, kAny, 64}}},
  };
  return buckets;
}

const tune::Bucket* bucket_for(const Problem& p) {
  return tune::match_bucket(tuning_buckets(), {p.M, p.K, p.N, p.G});
}

tune::Params to_params(const BlockSizes& bs) { return {{"m", bs.m}, {"n", bs.n}}; }

BlockSizes from_params(const tune::Params& p) {
  const auto m = tune::param(p, "m"), n = tune::param(p, "n");
  check(m && n, ErrorCode::kInvalidArgument,
        std::string(kKernelName) + ": tuned parameters '" + tune::params_str(p) + "' lack one of m, n");
  return {*m, *n};
}

namespace {
using tune::pow2_class;
int64_t largest_group(const Problem& p) {
  int64_t r = 0;
  for (int64_t g = 0; g < p.G; ++g) r = std::max(r, p.rows(g));
  return r;
}
}  // namespace

BlockSizes fit_to_shape(const BlockSizes& bs, const Problem& p) {
  // tgmm's items cut K by m: the larger of the largest group and K bounds it.
  const int64_t m_max = std::max<int64_t>({1, largest_group(p), p.K});
  return {std::clamp<int64_t>(bs.m, 1, m_max), std::clamp<int64_t>(bs.n, 1, std::max<int64_t>(1, p.N))};
}

bool worth_autotuning(const Problem& p, int64_t min_work) {
  return static_cast<double>(p.M) * static_cast<double>(p.K) * static_cast<double>(p.N) >= static_cast<double>(min_work);
}

std::string autotune_key(const Implementation& impl, const Problem& p, Pass op, const std::string& device_kind) {
  std::string k = std::string(kKernelName);
  k += "|impl=" + impl.name();
  k += "|device=" + device_kind;
  k += std::string("|dtype=") + dtype_name(p.dtype);
  k += "|M<=" + std::to_string(pow2_class(p.M)) + "|K=" + std::to_string(p.K) + "|N=" + std::to_string(p.N);
  k += "|G=" + std::to_string(p.G) + "|largest<=" + std::to_string(pow2_class(largest_group(p)));
  k += std::string("|transpose_rhs=") + (p.transpose_rhs ? "on" : "off");
  k += std::string("|op=") + pass_name(op) + (p.rhs ? "" : "(tgmm)");
  if (impl.device_type() == DeviceType::kCPU) k += "|threads=" + std::to_string(p.num_threads);
  k += std::string("|version=") + TESSERA_VERSION;
  return k;
}

namespace {

struct Scratch {
  Tensor out, dout, dlhs, drhs;
};

// The op as the API runs it; a tgmm-only problem (no rhs) times tgmm alone.
void run_op(const Implementation& impl, const Problem& p, const BlockSizes& bs, Pass op, Scratch& s) {
  if (op != Pass::kBackward && p.rhs) impl.gmm(p, bs, {p.lhs, p.rhs, s.out.data(), p.dtype});
  if (op == Pass::kForward) return;
  if (p.rhs) {
    Problem t = p;  // dlhs: gmm of dout against rhs transposed
    std::swap(t.K, t.N);
    t.transpose_rhs = !p.transpose_rhs;
    impl.gmm(t, bs, {s.dout.data(), p.rhs, s.dlhs.data(), p.dtype});
  }
  impl.tgmm(p, bs, {p.lhs, s.dout.data(), s.drhs.data(), p.dtype});
}

}  // namespace

tune::Runner make_timed_run(const Implementation& impl, const Problem& p, Pass op) {
  auto s = std::make_shared<Scratch>();
  s->out = Tensor::empty(p.dtype, {p.M, p.N}, p.device);
  if (op != Pass::kForward) {
    s->dout = random_uniform(p.dtype, {p.M, p.N}, 1.0f, 17).to(p.device);
    s->dlhs = Tensor::empty(p.dtype, {p.M, p.K}, p.device);
    s->drhs = Tensor::empty(p.dtype, {p.G, p.K, p.N}, p.device);
  }
  const bool has_rhs = p.rhs != nullptr;
  tune::OutputsFn outputs = [s, op, has_rhs] {  // as run_op writes them
    std::vector<tune::Output> o;
    if (op != Pass::kBackward && has_rhs) o.push_back({"out", s->out});
    if (op != Pass::kForward && has_rhs) o.push_back({"dlhs", s->dlhs});
    if (op != Pass::kForward) o.push_back({"drhs", s->drhs});
    return o;
  };
  const Implementation* ip = &impl;
  return tune::timed_runner<Tuning>(
      impl, p, [s, ip, p, op](const BlockSizes& bs) { run_op(*ip, p, bs, op, *s); }, std::move(outputs));
}

Problem shape_only_problem(int64_t M, int64_t K, int64_t N, int64_t G, DType dtype, Device device) {
  Problem p;
  p.M = M, p.K = K, p.N = N, p.G = G;
  p.begin.resize(static_cast<size_t>(G + 1));
  for (int64_t g = 0; g <= G; ++g) p.begin[static_cast<size_t>(g)] = G ? M * g / G : 0;
  p.dtype = dtype;
  p.device = device;
  p.num_threads = resolve_num_threads(0);
  return p;
}

OwnedProblem make_random_problem(int64_t M, int64_t K, int64_t N, int64_t G, DType dtype, Device device,
                                 uint64_t seed) {
  OwnedProblem o;
  o.lhs = random_uniform(dtype, {M, K}, 1.0f, seed * 3 + 1).to(device);
  o.rhs = random_uniform(dtype, {G, K, N}, 1.0f, seed * 3 + 2).to(device);
  o.problem = shape_only_problem(M, K, N, G, dtype, device);
  o.problem.lhs = o.lhs.data(), o.problem.rhs = o.rhs.data();
  return o;
}

std::string Tuning::describe(const Implementation& impl, const Problem& p, Pass op) {
  return std::string(kKernelName) + " " + impl.name() + " " + dtype_name(p.dtype) + " " + pass_name(op) +
         " M=" + std::to_string(p.M) + ",K=" + std::to_string(p.K) + ",N=" + std::to_string(p.N) +
         ",G=" + std::to_string(p.G);
}

std::string BlockSizes::str() const { return tune::params_str(to_params(*this)); }

void validate_block_sizes(const std::string& implementation, const BlockSizes& bs) {
  tune::validate_named<Tuning>(implementation, bs);
}

}  // namespace tessera::grouped_matmul

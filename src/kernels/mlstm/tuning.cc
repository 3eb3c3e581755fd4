// mlstm: its one tuned block size, the chunk length, declared (tune/declared.h). The call-time
// choice (api.cc) and `tessera tune mlstm` (spec.cc) derive from this declaration.

#include "kernels/mlstm/impl.h"
#include "tune/declared.h"

namespace tessera::mlstm {

namespace {
using tune::kAny;

// Per token of one head: Q̂Kᵀ and P·V over a chunk of L (2L(DK + DV)), Q̂·C and the state update
// (4·DK·DV) — the chunkwise forward's multiply-adds at the default chunk, halved.
double forward_macs(const std::vector<int64_t>& d) {
  const double tok = double(d.at(0)) * double(d.at(1)) * double(d.at(2)), DK = double(d.at(3)), DV = double(d.at(4));
  return tok * (double(kDefaultChunk) * (DK + DV) + 2 * DK * DV);
}
}  // namespace

const tune::Declared& tuning() {
  static const tune::Declared d{
      .kernel = kKernelName,
      .options = {"chunk_size"},
      // The chunk trades the L×L intra-chunk products (grow with L) against the per-chunk state
      // products (shrink with L); the head dims set where they cross.
      .buckets = {
          {"d128", "DHQK, DHV <= 128: small heads",
           {{"B", 1, kAny, 1}, {"NH", 1, kAny, 8}, {"S", 1, kAny, 2048}, {"DHQK", 1, 128, 128},
            {"DHV", 1, 128, 128}}},
          {"d256", "larger heads (xLSTM 7B: 256 or 512)",
           {{"B", 1, kAny, 1}, {"NH", 1, kAny, 4}, {"S", 1, kAny, 2048}, {"DHQK", 1, kAny, 256},
            {"DHV", 1, kAny, 256}}},
      },
      .implementations = {"cpu"},
      // At most 128: what cuda takes too, so a tuned chunk runs on every backend.
      .candidates = tune::each("chunk_size", {kDefaultChunk, 32, 128}),
      .work = forward_macs,
      .table = tuned_table};
  return d;
}

}  // namespace tessera::mlstm

// slstm: its one tuned block size, the batch rows per cpu task, declared (tune/declared.h). The
// call-time choice (api.cc) and `tessera tune slstm` (spec.cc) derive from this declaration.
#include "kernels/slstm/impl.h"
#include "tune/declared.h"

namespace tessera::slstm {

const tune::Declared& tuning() {
  using tune::kAny;
  static const tune::Declared d{
      .kernel = kKernelName,
      .options = {"batch_block"},
      // The block sets the rows of each step's GEMM against a head's packed weights (4·DH² floats:
      // 256 KiB at DH = 128) and the number of tasks the threads share; DH sets where the weights
      // and the block's state stop fitting in L2.
      .buckets = {
          {"dh64", "DH <= 64", {{"B", 1, kAny, 64}, {"S", 1, kAny, 256}, {"NH", 1, kAny, 4}, {"DH", 1, 64, 64}}},
          {"dh128", "DH > 64 (xLSTM 7B: 128 and up)",
           {{"B", 1, kAny, 16}, {"S", 1, kAny, 256}, {"NH", 1, kAny, 4}, {"DH", 65, kAny, 128}}},
      },
      .implementations = {"cpu"},
      .candidates = tune::each("batch_block", {64, 8, 16, 32, 128}),
      // Multiply-adds of a forward: the recurrent product 4·DH² per (row, step, head) and the gates.
      .work = [](const std::vector<int64_t>& d) {
        const double rows = double(d.at(0)) * double(d.at(1)) * double(d.at(2)), DH = double(d.at(3));
        return rows * (4 * DH * DH + 20 * DH);
      },
      .table = tuned_table};
  return d;
}

}  // namespace tessera::slstm

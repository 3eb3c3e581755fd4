// A downstream program: the mean linear cross-entropy loss of two tokens, against a hand value.
//   x = [[1, 0], [0, 1]],  W [H=2, V=3] = [[0, 0, 0], [1, 0, 0]],  labels = [0, 0]
//   logits: row 0 = [0, 0, 0] -> nll = ln 3
//           row 1 = [1, 0, 0] -> nll = ln(e + 2) - 1
//   mean = (ln 3 + ln(e + 2) - 1) / 2 = (1.0986123 + 1.5514448 - 1) / 2 = 0.8250286
#include <cmath>
#include <cstdio>
#include <cstring>

#include "tessera/tessera.h"

int main() {
  using namespace tessera;
  const float x[] = {1, 0, 0, 1};
  const float w[] = {0, 0, 0, 1, 0, 0};
  const int64_t labels[] = {0, 0};

  Tensor tx = Tensor::empty(DType::kF32, {2, 2});
  Tensor tw = Tensor::empty(DType::kF32, {2, 3});
  Tensor ty = Tensor::empty(DType::kI64, {2});
  std::memcpy(tx.data(), x, sizeof x);
  std::memcpy(tw.data(), w, sizeof w);
  std::memcpy(ty.data(), labels, sizeof labels);

  linear_cross_entropy::Inputs in;
  in.x = tx.view();
  in.w = tw.view();
  in.labels = ty.view();
  const linear_cross_entropy::Result r = linear_cross_entropy::compute(in);
  const float loss = *static_cast<const float*>(r.loss.data());

  const double want = 0.8250286;
  std::printf("tessera %s (headers %s): loss %.7f with '%s', want %.7f\n", tessera::version(),
              TESSERA_VERSION_STRING, loss, r.implementation.c_str(), want);
  if (std::strcmp(tessera::version(), TESSERA_VERSION_STRING) != 0) return 1;
  return std::fabs(loss - want) <= 1e-5 ? 0 : 1;
}

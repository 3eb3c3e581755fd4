// attention: the `cudnn` implementation of a CUDA module built without cuDNN (TESSERA_CUDNN=OFF,
// or cuDNN / the cuDNN frontend not found at configure time). It is listed as unavailable with
// the reason CMake recorded (TESSERA_CUDNN_WHY), so dispatch goes on to `cuda`. The real one is
// cudnn.cc.
#include <memory>
#include <string>

#include "core/cuda_module.h"
#include "kernels/attention/impl.h"
#include "tessera/error.h"

#ifndef TESSERA_CUDNN_WHY
#define TESSERA_CUDNN_WHY "cuDNN support was not built"
#endif

namespace tessera::attention {
namespace {

class CudnnUnavailable final : public Implementation {
 public:
  std::string name() const override { return "cudnn"; }
  std::string description() const override { return "cuDNN fused flash attention (not in this build)"; }
  DeviceType device_type() const override { return DeviceType::kCUDA; }
  Availability available() const override {
    return Availability::no(std::string("this CUDA module was built without cuDNN: ") + TESSERA_CUDNN_WHY);
  }
  Availability supports(const Problem&) const override { return available(); }
  BlockSizes default_block_sizes(const Problem&) const override { return {128, 128}; }
  void validate_block_sizes(const BlockSizes&) const override {}
  void forward(const Problem&, const BlockSizes&, const ForwardOut&) const override { unavailable(); }
  void backward(const Problem&, const BlockSizes&, const BackwardIn&, const GradOut&) const override { unavailable(); }

 private:
  [[noreturn]] void unavailable() const {
    throw Error(ErrorCode::kUnsupported, std::string(kKernelName) + " (cudnn): " + available().reason);
  }
};

std::unique_ptr<Implementation> make_cudnn_implementation() { return std::make_unique<CudnnUnavailable>(); }

}  // namespace

TESSERA_CUDA_MODULE_REGISTRATION([] { registry().add(make_cudnn_implementation()); });

}  // namespace tessera::attention

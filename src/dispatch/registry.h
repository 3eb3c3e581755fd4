// Tessera internal: the implementation registry every kernel uses.
//
// A kernel declares its Implementation interface (its own Problem, forward / backward ...)
// deriving from ImplementationBase, and keeps one Registry<ItsImplementation>. Registration
// order is the default dispatch order (fastest first); only implementations of the inputs'
// device type are in a call's default order. Implementations may be added at any time (a
// device module registers its implementations when it is loaded), from any thread; once added
// they live for the life of the process, so the pointers handed out stay valid.
//
// Registry::dispatch applies the fallback rules of dispatch.h: the kernel gives it the call's
// requested names, the device, a `supports` check and the body that runs the chosen one.
#pragma once

#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "dispatch/dispatch.h"
#include "tessera/error.h"
#include "tessera/exec.h"
#include "tessera/tensor.h"

namespace tessera::dispatch {

class ImplementationBase {
 public:
  virtual ~ImplementationBase() = default;
  virtual std::string name() const = 0;
  virtual std::string description() const = 0;
  // The device whose memory this implementation works on.
  virtual DeviceType device_type() const = 0;
  // Machine / build level: can this implementation run here at all?
  virtual Availability available() const { return Availability::yes(); }
  // Versions (docs/VERSIONS.md): current / experimental / retired, and what changed.
  virtual VersionStatus status() const { return VersionStatus::kCurrent; }
  virtual std::string what_changed() const { return {}; }

  ImplementationInfo info() const;
};

// Type-erased view of a kernel's registry for generic code (the CLI, the harness).
class RegistryView {
 public:
  virtual ~RegistryView() = default;
  virtual std::vector<const ImplementationBase*> implementations() const = 0;
  const ImplementationBase* find(const std::string& name) const;
  std::vector<ImplementationInfo> infos() const;
  std::vector<std::string> default_order(DeviceType device) const;
};

template <class Impl>
class Registry final : public RegistryView {
 public:
  explicit Registry(std::string kernel) : kernel_(std::move(kernel)) {}

  // Appends `impl` (later = lower in the default order). A second implementation with the
  // same name is an internal error.
  void add(std::unique_ptr<Impl> impl) {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& i : impls_)
      check(i->name() != impl->name(), ErrorCode::kInternal,
            kernel_ + ": implementation '" + impl->name() + "' registered twice");
    impls_.push_back(std::move(impl));
  }

  std::vector<const ImplementationBase*> implementations() const override {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<const ImplementationBase*> v;
    for (const auto& i : impls_) v.push_back(i.get());
    return v;
  }

  const Impl* find(const std::string& name) const {
    return static_cast<const Impl*>(RegistryView::find(name));
  }

  // Runs `body(const Impl&)` on the implementation the rules of dispatch.h choose for
  // `requested` (ExecOptions::implementation) on `device`; `supports(const Impl&)` says
  // whether one can take the call. Returns the name of the one that ran.
  template <class Supports, class Body>
  std::string dispatch(const std::string& requested, DeviceType device, Supports&& supports,
                       Body&& body) const {
    const Plan plan = make_plan(requested, default_order(device));
    Callbacks cb;
    cb.exists = [this](const std::string& n) { return find(n) != nullptr; };
    cb.supports = [&](const std::string& n) {
      const Impl* impl = find(n);
      Availability a = impl->available();
      return a.ok ? supports(*impl) : a;
    };
    cb.run = [&](const std::string& n) { body(*find(n)); };
    return run(kernel_, plan, cb);
  }

  const std::string& kernel() const { return kernel_; }

 private:
  std::string kernel_;
  mutable std::mutex mu_;
  std::deque<std::unique_ptr<Impl>> impls_;
};

}  // namespace tessera::dispatch

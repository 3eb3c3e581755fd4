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
//
// Implementations that live in a device module (core/device_module.h: the CUDA backend is
// libtessera_cuda.so, loaded on first use) are declared up front with add_module_implementation:
// the registry lists a placeholder in their place in the default order, whose available() loads
// the module (once per process) and says why it could not ("no CUDA device: ..."). When the
// module registers the real implementation with add(), it takes the placeholder's place. So
// `tessera list` shows "cuda  unavailable  <reason>" on a machine without a GPU, a request for
// "cuda" fails with that reason (not as an unknown name), and a process that only ever runs CPU
// inputs never loads the module (a CPU call's default order lists CPU implementations only).
#pragma once

#include <atomic>
#include <deque>
#include <functional>
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

// Loads whatever provides a module implementation (once); says why not when it cannot.
using ModuleLoader = std::function<Availability()>;
// The loader of the device module of `type` (core/device_module.h).
ModuleLoader device_module_loader(DeviceType type);

// The placeholder of an implementation that a device module registers when it is loaded.
// Generic: it knows the implementation's name, device and description, not its kernel.
class ModuleImplementation final : public ImplementationBase {
 public:
  ModuleImplementation(std::string name, DeviceType device, std::string description, ModuleLoader load,
                       VersionStatus status = VersionStatus::kCurrent)
      : name_(std::move(name)), device_(device), description_(std::move(description)), load_(std::move(load)),
        status_(status) {}
  std::string name() const override { return name_; }
  std::string description() const override { return loaded() ? loaded()->description() : description_; }
  DeviceType device_type() const override { return device_; }
  // Loads the module (first call only) and answers for the real implementation once registered.
  Availability available() const override;
  // Until the module is loaded: the status it was declared with (an experimental CUDA version
  // stays out of the default order before and after loading).
  VersionStatus status() const override { return loaded() ? loaded()->status() : status_; }
  std::string what_changed() const override { return loaded() ? loaded()->what_changed() : std::string(); }

  // The registered implementation, or nullptr while the module is not loaded.
  const ImplementationBase* loaded() const { return real_.load(std::memory_order_acquire); }
  // Loads the module if needed; the registered implementation or nullptr.
  const ImplementationBase* load() const {
    if (!loaded()) (void)load_();
    return loaded();
  }
  void set_loaded(const ImplementationBase* real) { real_.store(real, std::memory_order_release); }

 private:
  std::string name_;
  DeviceType device_;
  std::string description_;
  ModuleLoader load_;
  VersionStatus status_;
  std::atomic<const ImplementationBase*> real_{nullptr};
};

// Type-erased view of a kernel's registry for generic code (the CLI, the harness).
class RegistryView {
 public:
  virtual ~RegistryView() = default;
  // In registration (default) order; a module implementation not loaded yet is listed as its
  // placeholder (a ModuleImplementation). Loads nothing itself; the entries' available() may.
  virtual std::vector<const ImplementationBase*> implementations() const = 0;
  // The listed entry named `name` (maybe a placeholder), nullptr if none. Loads nothing.
  const ImplementationBase* find(const std::string& name) const;
  std::vector<ImplementationInfo> infos() const;
  std::vector<std::string> default_order(DeviceType device) const;
};

template <class Impl>
class Registry final : public RegistryView {
 public:
  explicit Registry(std::string kernel) : kernel_(std::move(kernel)) {}

  // A kernel's registry, filled once by `fill(registry)` in default dispatch order and never
  // destroyed (device modules hold pointers into it): `static Registry& r = Registry::leaked(...)`.
  template <class Fill>
  static Registry& leaked(std::string kernel, Fill&& fill) {
    auto* r = new Registry(std::move(kernel));
    fill(*r);
    return *r;
  }

  // Appends `impl` (later = lower in the default order), or, when a module implementation of
  // that name was declared, takes the placeholder's place. A second implementation with the
  // same name is an internal error.
  void add(std::unique_ptr<Impl> impl) {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& e : entries_) {
      if (e.name != impl->name()) continue;
      check(!e.impl && e.placeholder, ErrorCode::kInternal,
            kernel_ + ": implementation '" + impl->name() + "' registered twice");
      check(e.placeholder->device_type() == impl->device_type(), ErrorCode::kInternal,
            kernel_ + ": implementation '" + impl->name() + "' registered for another device than declared");
      e.impl = std::move(impl);
      e.placeholder->set_loaded(e.impl.get());
      return;
    }
    Entry e;
    e.name = impl->name();
    e.impl = std::move(impl);
    entries_.push_back(std::move(e));
  }

  // Declares an implementation that the device module of `device` registers when it is loaded
  // (see the top of this file). `load` defaults to that module's loader; `status` is what the
  // placeholder says until the module is loaded (a version: experimental, say).
  void add_module_implementation(std::string name, DeviceType device, std::string description,
                                 ModuleLoader load = {}, VersionStatus status = VersionStatus::kCurrent) {
    if (!load) load = device_module_loader(device);
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& e : entries_)
      check(e.name != name, ErrorCode::kInternal, kernel_ + ": implementation '" + name + "' registered twice");
    Entry e;
    e.name = name;
    e.placeholder = std::make_unique<ModuleImplementation>(std::move(name), device, std::move(description),
                                                           std::move(load), status);
    entries_.push_back(std::move(e));
  }

  std::vector<const ImplementationBase*> implementations() const override {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<const ImplementationBase*> v;
    for (const auto& e : entries_) v.push_back(e.impl ? static_cast<const ImplementationBase*>(e.impl.get())
                                                      : e.placeholder.get());
    return v;
  }

  // The implementation named `name`, loading its module first when it is a module
  // implementation; nullptr if there is none or its module cannot be loaded (the listed
  // entry's available() says why).
  const Impl* find(const std::string& name) const {
    const ModuleImplementation* pending = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const auto& e : entries_) {
        if (e.name != name) continue;
        if (e.impl) return e.impl.get();
        pending = e.placeholder.get();
      }
    }
    if (!pending || !pending->load()) return nullptr;
    return find(name);
  }

  // find(name), or Error(kNotFound) "<kernel>: unknown implementation '<name>'" (a kernel's public
  // validate_block_sizes(implementation, sizes)).
  // A declared implementation that cannot load here (a CUDA module on a machine without one) is
  // Error(kUnsupported) with its reason, not "unknown".
  const Impl& require(const std::string& name) const {
    const Impl* impl = find(name);
    check(impl != nullptr || RegistryView::find(name) == nullptr, ErrorCode::kUnsupported,
          kernel_ + ": implementation '" + name + "' is not available here: " +
              (RegistryView::find(name) ? RegistryView::find(name)->available().reason : std::string()));
    check(impl != nullptr, ErrorCode::kNotFound, kernel_ + ": unknown implementation '" + name + "'");
    return *impl;
  }

  // Error(kNotFound) for a name `requested` (or TESSERA_IMPLEMENTATION) gives that is not
  // registered, as dispatch() would: for a call with nothing to compute, which returns before
  // dispatch (a typo must fail there too, exec.h).
  void check_names(const std::string& requested, DeviceType device) const {
    const Plan plan = make_plan(requested, default_order(device));
    for (const std::string& n : plan.order)
      check(RegistryView::find(n) != nullptr, ErrorCode::kNotFound,
            kernel_ + ": unknown implementation '" + n + "' (from " + plan.source + ")");
  }
  // A call with nothing to compute: check_names, then "(empty)" for the caller to return.
  std::string empty_call(const std::string& requested, DeviceType device) const {
    check_names(requested, device);
    return "(empty)";
  }

  // Runs `body(const Impl&)` on the implementation the rules of dispatch.h choose for
  // `requested` (ExecOptions::implementation) on `device`; `supports(const Impl&)` says
  // whether one can take the call. Returns the name of the one that ran.
  template <class Supports, class Body>
  std::string dispatch(const std::string& requested, DeviceType device, Supports&& supports,
                       Body&& body) const {
    const Plan plan = make_plan(requested, default_order(device));
    Callbacks cb;
    cb.exists = [this](const std::string& n) { return RegistryView::find(n) != nullptr; };
    cb.supports = [&](const std::string& n) {
      // A module implementation's available() loads its module or says why it cannot.
      Availability a = RegistryView::find(n)->available();
      if (!a.ok) return a;
      const Impl* impl = find(n);
      if (!impl) return Availability::no("its module registered no implementation '" + n + "'");
      return supports(*impl);
    };
    cb.run = [&](const std::string& n) { body(*find(n)); };
    return run(kernel_, plan, cb);
  }

  // dispatch() of a normalized problem: on p.device, to the implementations whose supports(p)
  // says yes.
  template <class Problem, class Body>
  std::string dispatch_problem(const std::string& requested, const Problem& p, Body&& body) const {
    return dispatch(requested, p.device.type, [&](const Impl& impl) { return impl.supports(p); },
                    std::forward<Body>(body));
  }

  const std::string& kernel() const { return kernel_; }

 private:
  struct Entry {
    std::string name;
    std::unique_ptr<Impl> impl;                         // registered
    std::unique_ptr<ModuleImplementation> placeholder;  // declared for a module (kept once loaded)
  };
  std::string kernel_;
  mutable std::mutex mu_;
  std::deque<Entry> entries_;
};

}  // namespace tessera::dispatch

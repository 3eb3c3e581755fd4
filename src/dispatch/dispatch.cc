#include "dispatch/dispatch.h"
#include "dispatch/registry.h"

#include <new>
#include <sstream>

#include "core/device_module.h"
#include "core/env.h"
#include "core/log.h"
#include "tessera/error.h"

namespace tessera::dispatch {

std::vector<std::string> split_names(const std::string& list) {
  std::vector<std::string> out;
  std::string cur;
  auto flush = [&] {
    const auto b = cur.find_first_not_of(" \t");
    const auto e = cur.find_last_not_of(" \t");
    if (b != std::string::npos) out.push_back(cur.substr(b, e - b + 1));
    cur.clear();
  };
  for (char c : list) {
    if (c == ',') {
      flush();
    } else {
      cur += c;
    }
  }
  flush();
  return out;
}

Plan make_plan(const std::string& requested, const std::vector<std::string>& default_order,
               const char* env_var) {
  Plan p;
  std::vector<std::string> names = split_names(requested);
  if (!names.empty()) {
    p.order = names;
    p.mode = names.size() == 1 ? Mode::kSingle : Mode::kList;
    p.source = "options";
    return p;
  }
  if (env_var) {
    if (auto v = env::get(env_var)) {
      names = split_names(*v);
      if (!names.empty()) {
        p.order = names;
        p.mode = names.size() == 1 ? Mode::kSingle : Mode::kList;
        p.source = env_var;
        return p;
      }
    }
  }
  p.order = default_order;
  p.mode = Mode::kDefault;
  p.source = "default order";
  return p;
}

std::string run(const std::string& kernel, const Plan& plan, const Callbacks& cb) {
  // Unknown names fail at once, before anything runs: a typo must never fall back silently.
  for (const auto& name : plan.order) {
    if (!cb.exists(name))
      throw Error(ErrorCode::kNotFound, kernel + ": unknown implementation '" + name + "' (from " +
                                            plan.source + ")");
  }
  if (plan.order.empty())
    throw Error(ErrorCode::kNotFound, kernel + ": no implementation to try (from " + plan.source + ")");

  std::vector<std::string> reasons;
  for (size_t i = 0; i < plan.order.size(); ++i) {
    const std::string& name = plan.order[i];
    Availability a = cb.supports(name);
    if (a.ok) {
      try {
        try {
          cb.run(name);
        } catch (const std::bad_alloc&) {
          // An allocation anywhere in the implementation (a std::vector, a library) is a
          // Tessera error like any other, never an escaped std::bad_alloc or an abort.
          throw Error(ErrorCode::kOutOfMemory,
                      kernel + ": implementation '" + name + "' ran out of host memory (std::bad_alloc)");
        }
        if (i > 0 || plan.mode != Mode::kDefault)
          log::info_once(kernel + ": using implementation '" + name + "' (" + plan.source + ")");
        else
          log::info_once(kernel + ": using implementation '" + name + "'");
        return name;
      } catch (const Error& e) {
        if (plan.mode == Mode::kSingle ||
            (e.code() != ErrorCode::kUnsupported && e.code() != ErrorCode::kOutOfMemory))
          throw;
        a = Availability::no(e.what());
      }
    }
    if (plan.mode == Mode::kSingle)
      throw Error(ErrorCode::kUnsupported,
                  kernel + ": implementation '" + name + "' cannot run these inputs: " + a.reason);
    reasons.push_back(name + ": " + a.reason);
    const bool more = i + 1 < plan.order.size();
    if (more) {
      const std::string msg = kernel + ": skipping implementation '" + name + "' (" + a.reason +
                              "), falling back to '" + plan.order[i + 1] + "'";
      if (plan.mode == Mode::kList)
        log::warn(msg);
      else
        log::warn_once(msg);
    }
  }
  std::ostringstream os;
  os << kernel << ": no implementation could run these inputs (" << plan.source << "):";
  for (const auto& r : reasons) os << " [" << r << "]";
  throw Error(ErrorCode::kUnsupported, os.str());
}

ImplementationInfo ImplementationBase::info() const {
  ImplementationInfo info;
  info.name = name();
  info.description = description();
  info.device = device_type();
  const Availability a = available();
  info.available = a.ok;
  info.unavailable_reason = a.reason;
  info.status = status();
  info.what_changed = what_changed();
  return info;
}

ModuleLoader device_module_loader(DeviceType type) {
  return [type] {
    const device_module::Status& s = device_module::load(type);
    return s.loaded ? Availability::yes() : Availability::no(s.reason);
  };
}

Availability ModuleImplementation::available() const {
  if (const ImplementationBase* real = loaded()) return real->available();
  const Availability a = load_();
  if (const ImplementationBase* real = loaded()) return real->available();
  if (!a.ok) return a;
  return Availability::no("its module is loaded but registered no implementation '" + name_ + "'");
}

const ImplementationBase* RegistryView::find(const std::string& name) const {
  for (const ImplementationBase* impl : implementations())
    if (impl->name() == name) return impl;
  return nullptr;
}

std::vector<ImplementationInfo> RegistryView::infos() const {
  std::vector<ImplementationInfo> out;
  for (const ImplementationBase* impl : implementations()) out.push_back(impl->info());
  return out;
}

std::vector<std::string> RegistryView::default_order(DeviceType device) const {
  std::vector<std::string> order;
  for (const ImplementationBase* impl : implementations())
    if (impl->device_type() == device && impl->status() == VersionStatus::kCurrent)
      order.push_back(impl->name());
  return order;
}

}  // namespace tessera::dispatch

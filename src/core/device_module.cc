#include "core/device_module.h"

#include <dlfcn.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <mutex>
#include <vector>

#include "core/env.h"
#include "core/log.h"

// Set by CMake when the CUDA module is part of this build (only for the wording of "why not").
#ifndef TESSERA_CUDA_MODULE_BUILT
#define TESSERA_CUDA_MODULE_BUILT 0
#endif
#ifndef TESSERA_VERSION
#define TESSERA_VERSION "unknown"
#endif

namespace tessera::device_module {
namespace {

namespace fs = std::filesystem;

// The module's entry point: registers everything the module provides; returns nullptr on
// success, else why not (a string owned by the module).
using InitFn = const char* (*)(int abi_version, const char* library_version);

struct ModuleSpec {
  const char* label;        // "CUDA"
  const char* file;         // "libtessera_cuda.so"
  const char* init_symbol;  // "tessera_cuda_module_init"
  const char* path_env;     // explicit path to the module
  const char* force_env;    // skip the driver check
  bool built;               // part of this build?
  std::string (*driver_missing)();  // empty when a driver is there; else why not
};

// Cheap: a device node and the driver library, without loading any CUDA runtime. The driver
// library stays loaded when it is there (cudart would load it right after anyway).
std::string cuda_driver_missing() {
  if (::access("/dev/nvidiactl", F_OK) != 0 && ::access("/dev/dxg", F_OK) != 0)
    return "no CUDA device: no NVIDIA driver on this machine (/dev/nvidiactl does not exist)";
  if (!::dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL)) {
    const char* e = ::dlerror();
    return std::string("no CUDA device: the NVIDIA driver library libcuda.so.1 cannot be loaded (") +
           (e ? e : "unknown error") + ")";
  }
  return {};
}

const ModuleSpec* spec_of(DeviceType type) {
  static const ModuleSpec cuda{"CUDA",
                               "libtessera_cuda.so",
                               "tessera_cuda_module_init",
                               "TESSERA_CUDA_MODULE",
                               "TESSERA_CUDA_MODULE_FORCE",
                               TESSERA_CUDA_MODULE_BUILT != 0,
                               cuda_driver_missing};
  switch (type) {
    case DeviceType::kCUDA: return &cuda;
    case DeviceType::kCPU: return nullptr;
  }
  return nullptr;
}

// The directory of the file this code was loaded from (libtessera.so, or the executable when
// the library is linked statically).
std::string this_library_dir() {
  Dl_info info{};
  if (::dladdr(reinterpret_cast<const void*>(&spec_of), &info) && info.dli_fname && *info.dli_fname) {
    std::error_code ec;
    const fs::path p = fs::canonical(info.dli_fname, ec);
    if (!ec) return p.parent_path().string();
  }
  return {};
}

std::string executable_dir() {
  std::error_code ec;
  const fs::path p = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string() : p.parent_path().string();
}

struct Slot {
  std::once_flag once;
  Status status;
  std::atomic<bool> attempted{false};
};

Slot& slot_of(DeviceType type) {
  static Slot slots[2];
  return slots[static_cast<int>(type) & 1];
}

thread_local bool t_loading = false;  // re-entry from the module's own initialization

Status do_load(const ModuleSpec& m) {
  Status s;
  // 1. Find the module file.
  std::vector<std::string> candidates;
  if (auto p = env::get(m.path_env)) {
    candidates.push_back(*p);
  } else {
    std::vector<std::string> dirs;
    if (auto d = this_library_dir(); !d.empty()) dirs.push_back(d);
    if (auto d = executable_dir(); !d.empty()) {
      dirs.push_back(d);
      dirs.push_back((fs::path(d).parent_path() / "lib").string());
    }
    for (const auto& d : dirs) {
      const std::string c = (fs::path(d) / m.file).string();
      bool dup = false;
      for (const auto& e : candidates) dup |= e == c;
      if (!dup) candidates.push_back(c);
    }
  }
  for (const auto& c : candidates) {
    std::error_code ec;
    if (fs::is_regular_file(c, ec)) {
      s.path = c;
      break;
    }
  }
  if (s.path.empty()) {
    if (env::get(m.path_env)) {
      s.reason = std::string("the ") + m.label + " module " + candidates[0] + " (from " + m.path_env +
                 ") does not exist";
    } else if (!m.built) {
      s.reason = std::string("Tessera was built without the ") + m.label + " backend (no " + m.file + ")";
    } else {
      std::string where;
      for (const auto& c : candidates) where += (where.empty() ? "" : ", ") + c;
      s.reason = std::string("the ") + m.label + " module " + m.file + " was not found (looked for " + where +
                 "; set " + m.path_env + " to its path)";
    }
    return s;
  }

  // 2. A driver must be there before any runtime is loaded.
  if (!env::flag(m.force_env, false)) {
    s.reason = m.driver_missing();
    if (!s.reason.empty()) return s;
  }

  // 3. Load it and let it register. RTLD_NOW: a missing symbol fails here, with its name, not
  // later in the middle of a call. The module is never unloaded: what it registered points into it.
  void* h = ::dlopen(s.path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char* e = ::dlerror();
    s.reason = std::string("the ") + m.label + " module " + s.path + " cannot be loaded: " + (e ? e : "unknown error");
    return s;
  }
  auto init = reinterpret_cast<InitFn>(::dlsym(h, m.init_symbol));
  if (!init) {
    s.reason = std::string("the ") + m.label + " module " + s.path + " has no entry point " + m.init_symbol;
    return s;
  }
  if (const char* err = init(kAbiVersion, TESSERA_VERSION)) {
    s.reason = std::string("the ") + m.label + " module " + s.path + " did not initialize: " + err;
    return s;
  }
  s.loaded = true;
  return s;
}

}  // namespace

const Status& load(DeviceType type) {
  static const Status cpu{true, {}, {}};
  const ModuleSpec* m = spec_of(type);
  if (!m) return cpu;
  Slot& slot = slot_of(type);
  if (t_loading) {
    // The module's initialization asked for its own device (a registration that looks itself up):
    // report "not yet" instead of deadlocking in call_once.
    static const Status busy{false, {}, "the device module is being loaded"};
    return busy;
  }
  std::call_once(slot.once, [&] {
    t_loading = true;
    try {
      slot.status = do_load(*m);
    } catch (const std::exception& e) {
      slot.status.loaded = false;
      slot.status.reason = std::string("loading the ") + m->label + " module failed: " + e.what();
    }
    t_loading = false;
    slot.attempted.store(true, std::memory_order_release);
    if (slot.status.loaded)
      log::info(std::string("loaded the ") + m->label + " module " + slot.status.path);
    else
      log::debug(std::string(m->label) + " module not loaded: " + slot.status.reason);
  });
  return slot.status;
}

bool attempted(DeviceType type) {
  if (!spec_of(type)) return true;
  return slot_of(type).attempted.load(std::memory_order_acquire);
}

std::string module_file_name(DeviceType type) {
  const ModuleSpec* m = spec_of(type);
  return m ? m->file : "";
}

}  // namespace tessera::device_module

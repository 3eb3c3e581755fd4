// Tessera internal: a kernel's TuneSpec (kernels/registry.h: what `tessera tune` sweeps) from
// its tuning traits, written once for every kernel.
//
// Besides what tune/adapter.h asks of K, this needs:
//   using Owned;  a problem that owns its inputs, with a member `problem`
//   static const Impl* find(const std::string& name);             nullptr if unknown
//   static Owned random_problem(const std::vector<int64_t>& shape, DType, Device);  bucket dims
//   static Problem shape_only(const std::vector<int64_t>& shape, DType, Device);   no data
//   static const std::vector<Bucket>& buckets();
// and, where tuned_table() does not live by the convention (kernels/<kKernel>/tuning.h declares it
// in tessera::<kKernel>, src/kernels/<kKernel>/tuned_table.cc defines it):
//   static constexpr const char* kInclude, kNamespace, kTablePath;
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kernels/registry.h"
#include "tessera/error.h"
#include "tune/adapter.h"

namespace tessera::kernels {

template <class K>
TuneJob tune_job_for(const std::string& name, const std::vector<int64_t>& shape, DType dtype, Pass pass,
                     bool with_data) {
  const typename K::Impl* impl = K::find(name);
  check(impl != nullptr, ErrorCode::kNotFound, std::string(K::kKernel) + ": unknown implementation '" + name + "'");
  const Device dev{impl->device_type(), 0};
  std::shared_ptr<typename K::Owned> owned;
  if (with_data) owned = std::make_shared<typename K::Owned>(K::random_problem(shape, dtype, dev));
  const typename K::Problem p = owned ? owned->problem : K::shape_only(shape, dtype, dev);
  TuneJob job;
  job.device_kind = impl->device_kind(p);
  for (const auto& c : tune::candidates_for<K>(*impl, p)) job.candidates.push_back(K::to_params(c));
  job.support = impl->supports(p);
  job.make_run = [owned, impl, pass]() -> tune::Runner {
    check(owned != nullptr, ErrorCode::kInternal, "tune job built without data");
    return K::timed_run(*impl, owned->problem, pass);
  };
  return job;
}

// Where K's tuned table lives (kInclude, kNamespace, kTablePath, else the convention).
template <class K>
std::string table_include() {
  if constexpr (requires { K::kInclude; }) return K::kInclude;
  return "kernels/" + std::string(K::kKernel) + "/tuning.h";
}
template <class K>
std::string table_namespace() {
  if constexpr (requires { K::kNamespace; }) return K::kNamespace;
  return "tessera::" + std::string(K::kKernel);
}
template <class K>
std::string table_path() {
  if constexpr (requires { K::kTablePath; }) return K::kTablePath;
  return "src/kernels/" + std::string(K::kKernel) + "/tuned_table.cc";
}

template <class K>
TuneSpec make_tune_spec() {
  TuneSpec t;
  t.buckets = []() -> const std::vector<tune::Bucket>& { return K::buckets(); };
  t.table = []() -> const std::vector<tune::TableEntry>& { return K::table(); };
  t.tunable = [](const std::string& n) {
    const typename K::Impl* impl = K::find(n);
    return impl && impl->tunable();
  };
  t.job = tune_job_for<K>;
  t.source.kernel = K::kKernel;
  t.source.include = table_include<K>();
  t.source.cpp_namespace = table_namespace<K>();
  t.source.function = "tuned_table";
  t.source.regenerate = std::string("tessera tune ") + K::kKernel +
                        " --emit-table   (from the repository root, on the machine to tune; rebuild first: rows of "
                        "other machines are kept)";
  t.source.empty_note = "No rows: no tunable implementation was measured yet. Every lookup misses and falls to "
                        "autotune-on-miss or the backend defaults.";
  t.table_path = table_path<K>();
  return t;
}

}  // namespace tessera::kernels

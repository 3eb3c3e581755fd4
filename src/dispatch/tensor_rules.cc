#include "dispatch/tensor_rules.h"

#include <algorithm>
#include <cctype>
#include <stdexcept>


namespace tessera::dispatch {

namespace {
bool is_number(const std::string& s) { return !s.empty() && std::isdigit(static_cast<unsigned char>(s[0])); }

// "=q|f32" -> {"q", "f32"} (q's dtype or f32); "=q" -> {"q", ""}; anything else -> {"", ""}.
// The alternative is f32 or f8e4m3 (a storage type: paged_attention's caches).
std::pair<std::string, std::string> like_of(const std::string& rule) {
  if (rule.empty() || rule[0] != '=') return {"", ""};
  const size_t bar = rule.find('|');
  if (bar == std::string::npos) return {rule.substr(1), ""};
  const std::string alt = rule.substr(bar + 1);
  if (alt != "f32" && alt != "f8e4m3") throw std::logic_error("tensor rule: only '=x|f32' and '=x|f8e4m3' are known, got " + rule);
  return {rule.substr(1, bar - 1), alt};
}
}  // namespace

std::vector<std::string> dim_names(const std::string& dims) {
  std::vector<std::string> out;
  if (dims.empty()) return out;
  for (size_t start = 0;;) {  // no stringstream: every call of every kernel binds its rules
    const size_t comma = dims.find(',', start);
    const std::string f = dims.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    const size_t a = f.find_first_not_of(' '), b = f.find_last_not_of(' ');
    out.push_back(a == std::string::npos ? std::string() : f.substr(a, b - a + 1));
    if (comma == std::string::npos) return out;
    start = comma + 1;
  }
}

std::string rule_text(const TensorRule& rule) {
  std::string dims, dtype = rule.dtype;
  for (const std::string& n : dim_names(rule.dims)) {
    if (!dims.empty()) dims += ", ";
    dims += n;
  }
  const auto [like, alt] = like_of(rule.dtype);
  if (!like.empty()) dtype = like + "'s dtype" + (alt.empty() ? "" : " or " + alt);
  if (rule.dtype == "float") dtype = "f32, bf16 or f16";
  if (rule.dtype == "int") dtype = "int32 or int64";
  if (rule.dtype == "any") dtype = "any dtype";
  if (rule.dtype == "i32" || rule.dtype == "i64") dtype = rule.dtype == "i32" ? "int32" : "int64";
  return "[" + dims + "] (" + dtype + (rule.host ? ", host memory" : "") + ")";
}

std::string help_text(const std::string& help, const TensorRule& rule) {
  const size_t at = std::min(help.find(':'), help.find(';'));
  std::string out = help.substr(0, at);
  out += ' ';
  out += rule_text(rule);
  if (at != std::string::npos) out += help.substr(at);
  return out;
}

TensorRules::TensorRules(std::string kernel, std::vector<TensorRule> rules)
    : rules_(std::move(rules)), args_(std::move(kernel), rules_.empty() ? std::string() : rules_.front().name) {}

namespace {
// Binds each given view to its rule, in the rules' order (any range of (name, view) pairs: no copy).
template <class Views>
Dims bind_views(const std::vector<TensorRule>& rules, const ArgCheck& args, const Views& views, BindMode mode) {
  Dims d(args, mode);
  for (const auto& [name, view] : views) {
    bool known = false;
    for (const TensorRule& r : rules) known = known || r.name == name;
    if (!known) throw std::logic_error(args.kernel() + ": no tensor rule for '" + std::string(name) + "'");
  }
  for (const TensorRule& r : rules)
    for (const auto& [name, view] : views)
      if (r.name == name && given(view)) d.check(view, r);
  return d;
}
}  // namespace

Dims TensorRules::bind(std::initializer_list<std::pair<const char*, TensorView>> views, BindMode mode) const {
  return bind_views(rules_, args_, views, mode);
}

Dims TensorRules::bind(const std::vector<std::pair<std::string, TensorView>>& views, BindMode mode) const {
  return bind_views(rules_, args_, views, mode);
}

int64_t Dims::operator[](const std::string& name) const {
  const auto it = sizes_.find(name);
  if (it == sizes_.end()) throw std::logic_error(args_->kernel() + ": dim '" + name + "' is not bound");
  return it->second;
}

Shape Dims::shape(const std::string& dims) const {
  Shape s;
  for (const std::string& n : dim_names(dims)) s.push_back(is_number(n) ? std::stoll(n) : (*this)[n]);
  return s;
}

DType Dims::dtype(const std::string& rule) const {
  const std::string like = like_of(rule).first;
  if (like.empty()) return parse_dtype(rule);
  const auto it = dtypes_.find(like);
  if (it == dtypes_.end()) throw std::logic_error(args_->kernel() + ": '" + like + "' is not bound (rule " + rule + ")");
  return it->second;
}

std::string Dims::spelled(const std::string& dims) const {
  std::string s = "[";
  for (const std::string& n : dim_names(dims)) {
    if (s.size() > 1) s += ", ";
    s += n;
    if (!is_number(n) && has(n)) s.append("=").append(std::to_string(sizes_.at(n)));
  }
  return s + "]";
}

void Dims::check(const TensorView& t, const TensorRule& rule) {
  check_dims(t, rule);
  check_dtype(t, rule);
  if (mode_ == BindMode::kFull) check_place(t, rule);
  dtypes_[rule.name] = t.dtype;
}

void Dims::check_dims(const TensorView& t, const TensorRule& rule) {
  const std::vector<std::string> names = dim_names(rule.dims);
  const auto wrong = [&] { args_->fail(rule.name + " must be " + spelled(rule.dims) + ", got " + shape_str(t.shape)); };
  if (t.ndim() != static_cast<int64_t>(names.size())) wrong();
  for (int64_t size : t.shape)  // a negative size passed every rule (and a reference call ran on it)
    if (size < 0) args_->fail(rule.name + " has a negative size: " + shape_str(t.shape));
  std::map<std::string, int64_t> fresh;  // bound by this tensor: a repeated name must agree with itself
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string& n = names[i];
    const int64_t size = t.shape[i];
    if (is_number(n) ? size != std::stoll(n) : (has(n) && sizes_.at(n) != size) || (fresh.count(n) && fresh[n] != size))
      wrong();
    if (!is_number(n) && !has(n)) fresh[n] = size;
  }
  for (const auto& [n, size] : fresh) sizes_[n] = size;
}

void Dims::check_dtype(const TensorView& t, const TensorRule& rule) const {
  const std::string& r = rule.dtype;
  if (r == "any") return;
  if (r == "float") return args_->floating(t, rule.name);
  if (r == "int") return args_->integer(t, rule.name);
  const auto [like, alt] = like_of(r);
  if (like.empty()) return args_->dtype(t, parse_dtype(r), rule.name);
  const DType want = dtype(r);
  if (t.dtype == want || (!alt.empty() && t.dtype == parse_dtype(alt))) return;
  if (alt == "f32" && want != DType::kF32)
    args_->fail(rule.name + " must be f32 or " + dtype_name(want) + " (" + like + "'s dtype), got " + dtype_name(t.dtype));
  if (!alt.empty() && want != parse_dtype(alt))
    args_->fail(rule.name + " must be " + dtype_name(want) + " (" + like + "'s dtype) or " + alt + ", got " +
                dtype_name(t.dtype));
  args_->fail(rule.name + " must be " + dtype_name(want) + " like " + like + ", got " + dtype_name(t.dtype));
}

void Dims::check_place(const TensorView& t, const TensorRule& rule) {
  if (rule.host) return args_->host(t, rule.name);
  if (!placed_) device_ = t.device, placed_ = true;
  args_->plain(t, device_, rule.name);
}

}  // namespace tessera::dispatch

#include "models/nets/pretrained.hpp"

#include <torch/nn/module.h>
#include <torch/types.h>

#include <functional>
#include <map>
#include <regex>

#include "models/nets/weights.hpp"

namespace segflow::models {

namespace {

std::string pretrained_shape(at::IntArrayRef s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

/// "a, b, c" (the first 20, then "and N more").
std::string pretrained_names(const std::vector<std::string>& names) {
  std::string out;
  for (std::size_t i = 0; i < names.size() && i < 20; ++i) out += (i ? ", " : "") + names[i];
  if (names.size() > 20) out += ", and " + std::to_string(names.size() - 20) + " more";
  return out;
}

bool is_head(const ModelOptions& o, const std::string& name) {
  for (const auto& prefix : o.network->head_prefixes)
    if (name.rfind(prefix, 0) == 0) return true;
  return false;
}

/// The scheme `auto` stands for with this model and archive.
std::string resolve_scheme(const std::string& names, const ModelOptions& o, const TensorMap& src) {
  if (names != "auto") return names;
  auto any_prefix = [&](const char* prefix) {
    for (const auto& [n, t] : src)
      if (n.rfind(prefix, 0) == 0) return true;
    return false;
  };
  for (const auto& f : o.network->foreign_names)
    if (!f.marker.empty() && any_prefix(f.marker.c_str())) return f.scheme;
  return "segflow";
}

using Matcher = std::function<bool(const std::string&)>;

/// The archive's tensors under segflow names. Names without a counterpart go to `unused`
/// unless `skip` matches them as written; nnU-Net's duplicates are dropped.
Result<TensorMap> to_segflow_names(const TensorMap& src, const std::string& scheme, const ModelOptions& o,
                                   const TensorMap& model, const Matcher& skip,
                                   std::vector<std::string>& unused) {
  if (scheme == "segflow") return src;
  const ForeignNames* foreign = nullptr;
  std::string schemes = "segflow";
  for (const auto& f : o.network->foreign_names) {
    if (f.scheme == scheme) foreign = &f;
    schemes += ", " + f.scheme;
  }
  if (!foreign)
    return invalid_argument("names: " + scheme + ": " + o.name() + " (" + o.network->description +
                            ") has no " + scheme + " names; expected one of " + schemes);
  std::vector<std::string> model_names;
  for (const auto& [name, t] : model) model_names.push_back(name);
  const auto rename = foreign->renamer(o.net, model_names);
  TensorMap out;
  for (const auto& [name, t] : src) {
    if (foreign->duplicate && foreign->duplicate(name))
      continue;  // the same tensors again under a second name
    const std::string s = rename(name);
    if (!s.empty())
      out.emplace(s, t);
    else if (!skip(name))
      unused.push_back(name);
  }
  return out;
}

/// A weight that differs from the model's only in the input-channel axis, where the model
/// has its input channels.
bool adaptable(const at::Tensor& model, const at::Tensor& src, std::int64_t in_channels) {
  if (model.dim() < 3 || src.dim() != model.dim() || model.size(1) != in_channels) return false;
  for (std::int64_t d = 0; d < model.dim(); ++d)
    if (d != 1 && model.size(d) != src.size(d)) return false;
  return true;
}

at::Tensor adapt_channels(const at::Tensor& src, std::int64_t c_model, const std::string& how) {
  const std::int64_t c_src = src.size(1);
  at::Tensor out;
  if (how == "repeat") {
    out = src.index_select(1, at::arange(c_model, at::TensorOptions().dtype(at::kLong)).remainder(c_src));
  } else {
    auto sizes = src.sizes().vec();
    sizes[1] = c_model;
    out = src.mean(1, /*keepdim=*/true).expand(sizes).contiguous();
  }
  return out * (static_cast<double>(c_src) / static_cast<double>(c_model));
}

Result<std::vector<std::regex>> compile_rules(const std::vector<std::string>& rules,
                                              const std::string& field) {
  std::vector<std::regex> out;
  for (const auto& r : rules) {
    try {
      out.emplace_back(r, std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      return invalid_argument(field + ": '" + r + "' is not a regular expression (" + e.what() + ")");
    }
  }
  return out;
}

}  // namespace

const std::vector<std::string>& channel_adaptations() {
  static const std::vector<std::string> k{"none", "repeat", "mean"};
  return k;
}

nlohmann::json WeightsReport::to_json() const {
  nlohmann::json j{{"path", path}, {"names", names}, {"unfreeze_epoch", unfreeze_epoch}};
  const std::pair<const char*, const std::vector<std::string>*> lists[] = {
      {"loaded", &loaded},   {"skipped", &skipped}, {"reinitialised", &reinitialised},
      {"adapted", &adapted}, {"unused", &unused},   {"missing", &missing},
      {"frozen", &frozen}};
  for (const auto& [key, v] : lists) {
    j["counts"][key] = v->size();
    j[key] = *v;
  }
  return j;
}

std::string WeightsReport::summary() const {
  std::string s =
      path.empty() ? std::string("train.freeze: ") : "weights " + path + " (" + names + " names): ";
  if (!path.empty())
    s += std::to_string(loaded.size()) + " loaded, " + std::to_string(skipped.size()) + " skipped, " +
         std::to_string(reinitialised.size()) + " reinitialised, " + std::to_string(adapted.size()) +
         " adapted, ";
  s += std::to_string(frozen.size()) + " frozen";
  if (!frozen.empty())
    s +=
        unfreeze_epoch > 0 ? " (until epoch " + std::to_string(unfreeze_epoch) + ")" : " (for the whole run)";
  if (!unused.empty()) s += ", " + std::to_string(unused.size()) + " unused";
  if (!missing.empty()) s += ", " + std::to_string(missing.size()) + " missing";
  if (!adapted.empty()) s += "; adapted: " + pretrained_names(adapted);
  if (!reinitialised.empty()) s += "; reinitialised: " + pretrained_names(reinitialised);
  return s;
}

Result<WeightsReport> load_pretrained(torch::nn::Module& module, const ModelOptions& options,
                                      const std::string& path, const WeightsOptions& w, bool strict) {
  if (!options.network) return invalid_argument(path + ": model: no network to load the weights into");
  SEGFLOW_ASSIGN_OR_RETURN(auto rules, compile_rules(w.skip, path + ": model.weights.skip"));
  SEGFLOW_ASSIGN_OR_RETURN(TensorMap archive, read_tensor_archive(path));
  WeightsReport r;
  r.path = path;
  r.names = resolve_scheme(w.names, options, archive);
  std::map<std::string, at::Tensor> targets;
  for (auto& p : module.named_parameters(true)) targets.emplace(p.key(), p.value());
  for (auto& b : module.named_buffers(true)) targets.emplace(b.key(), b.value());
  const Matcher skip = [&](const std::string& n) {
    for (const auto& re : rules)
      if (std::regex_match(n, re)) return true;
    return false;
  };
  auto renamed = to_segflow_names(archive, r.names, options, named_tensors(module), skip, r.unused);
  if (!renamed.is_ok()) return renamed.status().with_context(path);
  const TensorMap& src = *renamed;
  const std::int64_t in_channels = options.network->in_channels(options.net);
  std::vector<std::string> mismatched;
  std::map<std::string, at::Tensor> plan;
  for (const auto& [name, t] : targets) {
    if (skip(name)) {
      r.skipped.push_back(name);
      continue;
    }
    if (w.reinit_head && is_head(options, name)) {
      r.reinitialised.push_back(name);
      continue;
    }
    auto it = src.find(name);
    if (it == src.end() || !it->second.defined()) {
      r.missing.push_back(name);
    } else if (it->second.sizes() == t.sizes()) {
      plan.emplace(name, it->second);
      r.loaded.push_back(name);
    } else if (w.channels != "none" && adaptable(t, it->second, in_channels)) {
      plan.emplace(name, adapt_channels(it->second, t.size(1), w.channels));
      r.adapted.push_back(name);
    } else {
      mismatched.push_back(name + " (model " + pretrained_shape(t.sizes()) + ", weights " +
                           pretrained_shape(it->second.sizes()) + ")");
    }
  }
  for (const auto& [name, t] : src)
    if (!targets.count(name) && !skip(name) && !(w.reinit_head && is_head(options, name)))
      r.unused.push_back(name);
  if (!mismatched.empty())
    return invalid_argument(
        path + ": shape mismatch: " + std::to_string(mismatched.size()) + " tensors do not fit the model (" +
        r.names + " names) and no skip rule covers them: " + pretrained_names(mismatched) +
        "; expected matching shapes, or model.weights.skip: [regex...], reinit_head: true "
        "(output layer) or channels: repeat|mean (input channels)");
  if (strict && (!r.missing.empty() || !r.unused.empty())) {
    std::string msg = path + " (" + r.names + " names):";
    if (!r.missing.empty())
      msg += " " + std::to_string(r.missing.size()) +
             " model tensors missing from the weights: " + pretrained_names(r.missing) + ";";
    if (!r.unused.empty())
      msg += " " + std::to_string(r.unused.size()) +
             " weights the model does not have: " + pretrained_names(r.unused) + ";";
    return invalid_argument(msg +
                            " expected every tensor to match (add model.weights.skip rules, or "
                            "weights_strict: false)");
  }
  at::NoGradGuard no_grad;
  for (const auto& [name, value] : plan) targets.at(name).copy_(value);
  return r;
}

Result<std::vector<std::string>> frozen_parameters(const torch::nn::Module& module,
                                                   const std::vector<std::string>& patterns,
                                                   const std::string& field) {
  SEGFLOW_ASSIGN_OR_RETURN(auto rules, compile_rules(patterns, field));
  std::vector<std::string> out;
  std::vector<bool> used(rules.size(), false);
  for (const auto& p : module.named_parameters(true)) {
    bool hit = false;
    for (std::size_t i = 0; i < rules.size(); ++i)
      if (std::regex_match(p.key(), rules[i])) hit = used[i] = true;
    if (hit) out.push_back(p.key());
  }
  for (std::size_t i = 0; i < rules.size(); ++i)
    if (!used[i])
      return invalid_argument(field + ": '" + patterns[i] +
                              "' matches no parameter of the model; expected a regex over names such as '" +
                              (module.named_parameters(true).is_empty()
                                   ? std::string("?")
                                   : module.named_parameters(true)[0].key()) +
                              "'");
  return out;
}

}  // namespace segflow::models

#include "pipeline/transforms/map_labels.hpp"

#include <torch/torch.h>

#include <algorithm>
#include <charconv>
#include <map>
#include <mutex>
#include <set>

#include "messages/log.hpp"
#include "pipeline/options.hpp"
#include "pipeline/stage_registry.hpp"
#include "pipeline/transforms/detail/tensor_util.hpp"
#include "pipeline/transforms/register.hpp"

namespace segflow::pipeline {

namespace {

bool parse_label(const std::string& s, std::int64_t& v) {
  const char* b = s.data();
  const char* e = b + s.size();
  auto [p, ec] = std::from_chars(b, e, v);
  return ec == std::errc() && p == e && v >= 0;
}

bool json_label(const nlohmann::json& j, std::int64_t& v) {
  if (j.is_number_integer()) {
    v = j.get<std::int64_t>();
    return v >= 0;
  }
  if (j.is_number_float()) {
    const double d = j.get<double>();
    if (d < 0 || d != static_cast<double>(static_cast<std::int64_t>(d))) return false;
    v = static_cast<std::int64_t>(d);
    return true;
  }
  return false;
}

constexpr std::int64_t kChunk = 1 << 24;  // voxels per pass: bounds the int32 index copies

}  // namespace

void MapLabelsOptions::bind(OptionParser& p) {
  p.string("key", key, "the label map tensor (integer values)");
  p.json_value("mapping", mapping, "map of integers",
               "{source: target} label values; values not listed become 0 (background)");
  p.integer_list("keep", keep, Range::non_negative(), /*unique=*/true,
                 "source labels kept and renumbered 1..n in this order; the rest become 0");
  p.strings("names", names, false, "names of the classes 0..n after mapping, background first");
  p.boolean("allow_missing_keys", allow_missing_keys, "pass samples without `key` through");
  if (key.empty()) p.fail("key", "expected a non-empty name");
  if (!p.ok()) return;
  const bool has_mapping = !(mapping.is_object() && mapping.empty());
  if (has_mapping && !keep.empty())
    return p.fail("keep",
                  "expected either mapping or keep, got both (mapping " + format_value(mapping) + ")");
  pairs.clear();
  if (!keep.empty()) {
    for (std::size_t i = 0; i < keep.size(); ++i)
      pairs.emplace_back(keep[i], static_cast<std::int64_t>(i) + 1);
  } else if (has_mapping) {
    if (!mapping.is_object())
      return p.fail("mapping", "expected a map {source: target} of label values (integers >= 0), got " +
                                   format_value(mapping));
    std::map<std::int64_t, std::string> seen;
    for (auto it = mapping.begin(); it != mapping.end(); ++it) {
      std::int64_t s = 0, t = 0;
      if (!parse_label(it.key(), s) || !json_label(it.value(), t))
        return p.fail("mapping", "expected a map {source: target} of label values (integers >= 0), got " +
                                     format_value(mapping) + " (entry " + it.key() + ": " +
                                     format_value(it.value()) + ")");
      if (auto d = seen.find(s); d != seen.end())
        return p.fail("mapping", "expected each source label once, got source " + std::to_string(s) +
                                     " twice (as \"" + d->second + "\" and \"" + it.key() + "\")");
      seen[s] = it.key();
      pairs.emplace_back(s, t);
    }
    // JSON objects iterate in key order; keep the numeric order of the sources.
    std::sort(pairs.begin(), pairs.end());
  } else {
    if (!names.empty())
      p.fail("names",
             "expected names only with a mapping or a keep list (without them the labels are unchanged)");
    return;  // the default: labels unchanged
  }
  const std::int64_t n = map_labels_num_classes(*this);
  if (n < 2)
    return p.fail(keep.empty() ? "mapping" : "keep", "expected at least one target label > 0, got none");
  if (!names.empty() && static_cast<std::int64_t>(names.size()) != n)
    p.fail("names", "expected " + std::to_string(n) + " names (classes 0.." + std::to_string(n - 1) +
                        ", background first), got " + std::to_string(names.size()));
}

Result<MapLabelsOptions> parse_map_labels_options(const nlohmann::json& options, const std::string& where) {
  MapLabelsOptions o;
  OptionParser p(options, where, "map_labels");
  o.bind(p);
  SEGFLOW_RETURN_IF_ERROR(p.finish());
  return o;
}

std::int64_t map_labels_num_classes(const MapLabelsOptions& o) {
  if (o.pairs.empty()) return 0;
  std::int64_t mx = 0;
  for (const auto& [s, t] : o.pairs) mx = std::max(mx, t);
  return mx + 1;
}

std::vector<std::string> map_labels_class_names(const MapLabelsOptions& o,
                                                const std::vector<std::string>& source_names) {
  if (!o.names.empty()) return o.names;
  if (o.pairs.empty()) return source_names;  // unchanged labels
  const std::int64_t n = map_labels_num_classes(o);
  std::vector<std::vector<std::string>> parts(static_cast<std::size_t>(n));
  bool any = false;
  for (const auto& [s, t] : o.pairs) {
    if (t == 0) continue;
    const bool named = s < static_cast<std::int64_t>(source_names.size()) && !source_names[s].empty();
    any = any || named;
    parts[static_cast<std::size_t>(t)].push_back(named ? source_names[s] : "label_" + std::to_string(s));
  }
  if (!any) return {};
  std::vector<std::string> out(static_cast<std::size_t>(n));
  out[0] = source_names.empty() || source_names[0].empty() ? "background" : source_names[0];
  for (std::int64_t t = 1; t < n; ++t)
    out[t] = parts[t].empty() ? "class_" + std::to_string(t) : join(parts[t], "+");
  return out;
}

Result<at::Tensor> map_label_values(const at::Tensor& labels,
                                    const std::vector<std::pair<std::int64_t, std::int64_t>>& pairs,
                                    std::vector<std::int64_t>* absent) {
  if (!labels.defined()) return invalid_argument("map_labels: expected a label map, got an undefined tensor");
  const auto type = labels.scalar_type();
  if (at::isFloatingType(type) || at::isComplexType(type) || type == at::kBool)
    return invalid_argument(std::string("map_labels: expected an integer label map, got ") +
                            c10::toString(type));
  std::int64_t max_source = 0, max_target = 0;
  for (const auto& [s, t] : pairs) {
    max_source = std::max(max_source, s);
    max_target = std::max(max_target, t);
  }
  if (type == at::kByte && max_target > 255)
    return invalid_argument("map_labels: target " + std::to_string(max_target) +
                            " does not fit the uint8 label map; use load's label_dtype: int64");
  const at::Tensor flat = labels.contiguous().reshape({-1});
  std::int64_t max_value = 0;
  if (flat.numel() > 0) {
    const auto [mn, mx] = torch::aminmax(flat);
    if (mn.item<std::int64_t>() < 0)
      return invalid_argument("map_labels: expected label values >= 0, got " +
                              std::to_string(mn.item<std::int64_t>()));
    max_value = mx.item<std::int64_t>();
  }
  constexpr std::int64_t kMaxLabel = 1 << 24;
  if (max_value >= kMaxLabel || max_source >= kMaxLabel)
    return invalid_argument("map_labels: expected label values below " + std::to_string(kMaxLabel) +
                            ", got " + std::to_string(std::max(max_value, max_source)));
  const std::int64_t n = std::max(max_value, max_source) + 1;
  at::Tensor lut = torch::zeros({n}, torch::kLong);
  auto* l = lut.data_ptr<std::int64_t>();
  for (const auto& [s, t] : pairs) l[s] = t;
  lut = lut.to(labels.device());
  at::Tensor counts =
      absent ? torch::zeros({n}, torch::TensorOptions().dtype(torch::kLong).device(labels.device()))
             : at::Tensor();
  at::Tensor out = torch::empty({flat.numel()}, labels.options());
  for (std::int64_t b = 0; b < flat.numel(); b += kChunk) {
    const std::int64_t len = std::min(kChunk, flat.numel() - b);
    const at::Tensor idx = flat.narrow(0, b, len).to(torch::kInt);
    out.narrow(0, b, len).copy_(lut.index_select(0, idx));
    if (absent) counts += torch::bincount(idx, {}, n);
  }
  if (absent) {
    absent->clear();
    if (max_value == 0) return out.reshape(labels.sizes());  // all background (inference feeds these)
    const at::Tensor c = counts.cpu();
    const auto* cp = c.data_ptr<std::int64_t>();
    std::set<std::int64_t> done;
    for (const auto& [s, t] : pairs)
      if (cp[s] == 0 && done.insert(s).second) absent->push_back(s);
  }
  return out.reshape(labels.sizes());
}

namespace {

class MapLabelsStage final : public MapStage {
 public:
  using Options = MapLabelsOptions;
  static constexpr const char* kName = "map_labels";
  static constexpr const char* kDoc =
      "select, merge and renumber label values ({source: target} or keep: [...]); the rest -> 0";
  static constexpr bool kDeterministic = true;

  MapLabelsStage(Options o, nlohmann::json resolved)
      : MapStage(kName, std::move(resolved), {o.key}), o_(std::move(o)) {}
  bool deterministic() const override { return true; }

  Status apply_sample(Sample& s, Rng&) const override {
    if (o_.pairs.empty()) return Status::ok();  // no mapping, no keep: unchanged
    if (!s.has(o_.key)) {
      if (o_.allow_missing_keys) return Status::ok();
      return invalid_argument(std::string(kName) + ": sample '" + s.id + "' has no '" + o_.key + "'");
    }
    std::vector<std::int64_t> absent;
    auto r = map_label_values(s.at(o_.key), o_.pairs, &absent);
    if (!r.is_ok()) return r.status().with_context("case '" + s.id + "'");
    s.at(o_.key) = std::move(r).value();
    detail::drop_indices(s);  // foreground changed
    for (std::int64_t label : absent) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (!reported_.insert(label).second) continue;
      }
      log::warn(std::string(kName) + ": source label " + std::to_string(label) + " does not occur in case '" +
                s.id + "' (reported once per label)");
    }
    return Status::ok();
  }

 private:
  Options o_;
  mutable std::mutex mu_;
  mutable std::set<std::int64_t> reported_;
};

}  // namespace

Status register_map_labels_stage(StageRegistry& r) { return add_stage<MapLabelsStage>(r); }

}  // namespace segflow::pipeline

#include "models/training/class_names.hpp"

#include <cctype>
#include <filesystem>

#include "pipeline/io/dataset.hpp"
#include "pipeline/options.hpp"
#include "pipeline/transforms/map_labels.hpp"

namespace segflow::models {

using nlohmann::json;

namespace {

constexpr const char* kMapLabels = "map_labels";

std::string stage_place(const JobConfig& cfg, std::size_t i) {
  const std::string at = cfg.stages.path + "[" + std::to_string(i) + "].options";
  return cfg.file.empty() ? at : cfg.file + ": " + at;
}

/// Where configured_num_classes came from, for messages.
std::string num_classes_source(const JobConfig& cfg) {
  return cfg.data.num_classes > 0 ? "data.num_classes" : "model.out_channels";
}

}  // namespace

std::int64_t configured_num_classes(const JobConfig& cfg) {
  if (cfg.data.num_classes > 0) return cfg.data.num_classes;
  const json& model = cfg.resolved.is_object() ? cfg.resolved.value("model", json::object()) : json::object();
  const auto it = model.find("out_channels");
  if (it == model.end() || !it->is_number_integer()) return 0;
  const auto out = it->get<std::int64_t>();
  return out == 1 ? 2 : out;
}

namespace {

/// The error of one map_labels stage whose targets do not fit `k` classes; ok when they fit.
Status check_one(const pipeline::MapLabelsOptions& o, std::int64_t k, const std::string& where,
                 const std::string& source) {
  std::string of = "num_classes " + std::to_string(k);
  of += ", from " + source;
  if (!o.keep.empty()) {
    if (static_cast<std::int64_t>(o.keep.size()) <= k - 1) return Status::ok();
    std::string m = where + ".keep: expected at most " + std::to_string(k - 1);
    m += " labels (targets 1.." + std::to_string(k - 1) + " of " + of + "), got ";
    m += std::to_string(o.keep.size()) + " " + pipeline::format_value(json(o.keep));
    return invalid_config(m);
  }
  for (const auto& [s, t] : o.pairs) {
    if (t < k) continue;
    std::string m = where + ".mapping: expected targets in 0.." + std::to_string(k - 1);
    m += " (" + of + "), got " + std::to_string(t);
    m += " (for source " + std::to_string(s) + ")";
    return invalid_config(m);
  }
  return Status::ok();
}

}  // namespace

Status check_label_mapping(const JobConfig& cfg) {
  const std::int64_t k = configured_num_classes(cfg);
  for (std::size_t i = 0; i < cfg.stages.stages.size(); ++i) {
    const auto& s = cfg.stages.stages[i];
    if (s.name != kMapLabels) continue;
    const std::string where = stage_place(cfg, i);
    SEGFLOW_ASSIGN_OR_RETURN(pipeline::MapLabelsOptions o,
                             pipeline::parse_map_labels_options(s.options, where));
    if (k <= 0 || o.pairs.empty()) continue;
    SEGFLOW_RETURN_IF_ERROR(check_one(o, k, where, num_classes_source(cfg)));
  }
  return Status::ok();
}

std::vector<std::string> job_class_names(const JobConfig& cfg,
                                         const std::vector<std::string>& dataset_names) {
  std::vector<std::string> names = dataset_names;
  for (std::size_t i = 0; i < cfg.stages.stages.size(); ++i) {
    const auto& s = cfg.stages.stages[i];
    if (s.name != kMapLabels) continue;
    auto o = pipeline::parse_map_labels_options(s.options, stage_place(cfg, i));
    if (!o.is_ok()) return {};  // the pipeline build reports it
    names = pipeline::map_labels_class_names(*o, names);
  }
  bool any = false;
  for (const auto& n : names) any = any || !n.empty();
  return any ? names : std::vector<std::string>{};
}

std::vector<std::string> job_class_names(const JobConfig& cfg) {
  namespace fs = std::filesystem;
  const fs::path root = cfg.data.root;
  std::vector<std::string> names = pipeline::dataset_label_names(root);
  std::error_code ec;
  if (names.empty() && !fs::is_directory(root, ec) && root.is_relative() && !cfg.file.empty())
    names = pipeline::dataset_label_names(fs::path(cfg.file).parent_path() / root);
  return job_class_names(cfg, names);
}

std::string metric_name(const std::string& name) {
  std::string out = name;
  for (char& c : out) {
    const auto u = static_cast<unsigned char>(c);
    if (!std::isalnum(u) && c != '_' && c != '-' && c != '+' && c != '.') c = '_';
  }
  return out;
}

std::string class_key(const ValidationInfo& v, std::size_t k) {
  if (k + 1 < v.class_names.size() && !v.class_names[k + 1].empty()) return metric_name(v.class_names[k + 1]);
  return "class_" + std::to_string(k + 1);
}

}  // namespace segflow::models

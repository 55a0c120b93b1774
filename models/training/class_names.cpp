#include "models/training/class_names.hpp"

#include <cctype>
#include <filesystem>

#include "pipeline/io/dataset.hpp"
#include "pipeline/transforms/map_labels.hpp"

namespace segflow::models {

using nlohmann::json;

namespace {

constexpr const char* kMapLabels = "map_labels";

}  // namespace

std::vector<std::string> job_class_names(const JobConfig& cfg,
                                         const std::vector<std::string>& dataset_names) {
  std::vector<std::string> names = dataset_names;
  for (std::size_t i = 0; i < cfg.stages.stages.size(); ++i) {
    const auto& s = cfg.stages.stages[i];
    if (s.name != kMapLabels) continue;
    auto o = pipeline::parse_map_labels_options(s.options, stage_options_where(cfg, i));
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

std::vector<std::string> model_class_names(const Trainer& trainer) {
  if (!trainer.class_names().empty()) return trainer.class_names();
  return job_class_names(trainer.config());
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

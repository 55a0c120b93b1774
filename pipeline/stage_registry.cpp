#include "pipeline/stage_registry.hpp"

#include <algorithm>
#include <sstream>

#include "pipeline/transforms/register.hpp"

namespace segflow::pipeline {

Status register_builtin_stages(StageRegistry& r) {
  // Deterministic (cacheable) stages, in the order a pipeline usually lists them.
  SEGFLOW_RETURN_IF_ERROR(register_load_stage(r));
  SEGFLOW_RETURN_IF_ERROR(register_map_labels_stage(r));
  SEGFLOW_RETURN_IF_ERROR(register_reorient_stage(r));
  SEGFLOW_RETURN_IF_ERROR(register_resample_stage(r));
  SEGFLOW_RETURN_IF_ERROR(register_scale_intensity_range_stage(r));
  SEGFLOW_RETURN_IF_ERROR(register_normalize_intensity_stage(r));
  SEGFLOW_RETURN_IF_ERROR(register_normalize_ct_stage(r));
  SEGFLOW_RETURN_IF_ERROR(register_zscore_stage(r));
  SEGFLOW_RETURN_IF_ERROR(register_clip_percentiles_stage(r));
  SEGFLOW_RETURN_IF_ERROR(register_crop_foreground_stage(r));
  SEGFLOW_RETURN_IF_ERROR(register_fg_bg_indices_stage(r));
  // Random stages.
  SEGFLOW_RETURN_IF_ERROR(register_rand_crop_pos_neg_stage(r));
  SEGFLOW_RETURN_IF_ERROR(register_rand_flip_stage(r));
  SEGFLOW_RETURN_IF_ERROR(register_rand_rotate90_stage(r));
  SEGFLOW_RETURN_IF_ERROR(register_rand_affine_stage(r));
  SEGFLOW_RETURN_IF_ERROR(register_rand_intensity_stages(r));
  SEGFLOW_RETURN_IF_ERROR(register_rand_gaussian_blur_stage(r));
  SEGFLOW_RETURN_IF_ERROR(register_rand_brightness_stage(r));
  SEGFLOW_RETURN_IF_ERROR(register_rand_contrast_stage(r));
  SEGFLOW_RETURN_IF_ERROR(register_rand_simulate_low_resolution_stage(r));
  SEGFLOW_RETURN_IF_ERROR(register_medsam_box_stage(r));
  SEGFLOW_RETURN_IF_ERROR(register_medsam_preprocess_stages(r));
  return Status::ok();
}

StageRegistry builtin_registry() {
  StageRegistry r;
  Status st = register_builtin_stages(r);
  (void)st;  // built-in names are distinct; a failure here is a bug caught by the tests
  return r;
}

nlohmann::json describe_stages(const StageRegistry& registry) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& name : registry.names()) {
    const StageInfo* info = registry.info(name);
    nlohmann::json opts = nlohmann::json::array();
    for (const auto& o : info->options) opts.push_back(to_json(o));
    out.push_back({{"name", info->name},
                   {"doc", info->doc},
                   {"deterministic", info->deterministic},
                   {"origin", info->origin},
                   {"options", std::move(opts)}});
  }
  return out;
}

std::string format_stages(const StageRegistry& registry) {
  std::ostringstream os;
  for (const auto& name : registry.names()) {
    const StageInfo* info = registry.info(name);
    os << info->name << "  (" << (info->deterministic ? "deterministic, cached" : "random") << ")";
    if (info->origin != "builtin") os << "  [" << info->origin << "]";
    os << "\n    " << info->doc << "\n";
    std::size_t wn = 0, wt = 0, wd = 0;
    std::vector<std::string> defaults;
    for (const auto& o : info->options) {
      defaults.push_back(format_value(o.default_value));
      wn = std::max(wn, o.name.size());
      wt = std::max(wt, o.type.size());
      wd = std::max(wd, defaults.back().size());
    }
    for (std::size_t i = 0; i < info->options.size(); ++i) {
      const auto& o = info->options[i];
      os << "    " << o.name << std::string(wn - o.name.size() + 2, ' ') << o.type
         << std::string(wt - o.type.size() + 2, ' ') << "default " << defaults[i]
         << std::string(wd - defaults[i].size() + 2, ' ') << o.doc;
      std::string extra;
      if (!o.unit.empty()) extra += o.unit;
      if (!o.range.empty()) extra += (extra.empty() ? "" : ", ") + o.range;
      if (!extra.empty()) os << " (" << extra << ")";
      os << "\n";
    }
    os << "\n";
  }
  return os.str();
}

}  // namespace segflow::pipeline

#include "models/inference/postprocessing_plan.hpp"

#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <limits>

#include "messages/file_util.hpp"
#include "pipeline/connected_components.hpp"
#include "pipeline/io/image_io.hpp"

namespace segflow::models {

namespace fs = std::filesystem;

const char* to_string(PostprocessMetric m) {
  switch (m) {
    case PostprocessMetric::dice:
      return "dice";
    case PostprocessMetric::iou:
      return "iou";
    case PostprocessMetric::nsd:
      return "nsd";
  }
  return "?";
}

Result<PostprocessMetric> postprocess_metric_from_string(const std::string& text) {
  for (auto m : {PostprocessMetric::dice, PostprocessMetric::iou, PostprocessMetric::nsd})
    if (text == to_string(m)) return m;
  return invalid_argument("metric: expected dice, iou or nsd, got '" + text + "'");
}

const char* to_string(PostprocessKind k) {
  return k == PostprocessKind::keep_largest ? "keep_largest" : "remove_small";
}

Status apply_postprocessing_step(at::Tensor& labels, const PostprocessStep& s, int connectivity) {
  const at::Tensor mask = s.label == 0 ? labels.gt(0) : labels.eq(s.label);
  auto keep = s.kind == PostprocessKind::keep_largest
                  ? pipeline::keep_largest_component(mask, connectivity)
                  : pipeline::remove_small_components(mask, s.min_voxels, connectivity);
  if (!keep.is_ok()) return keep.status();
  labels.masked_fill_(mask.logical_and(keep->logical_not()), 0);
  return Status::ok();
}

namespace {

nlohmann::json pp_number(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); }

double pp_number_of(const nlohmann::json& j) {
  return j.is_number() ? j.get<double>() : std::numeric_limits<double>::quiet_NaN();
}

/// One step of postprocessing.json; `where` is "FILE: steps[i]".
Result<PostprocessStep> read_step(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object()) return invalid_config(where + ": expected an object");
  PostprocessStep s;
  const std::string kind = j.value("kind", "");
  if (kind == "keep_largest")
    s.kind = PostprocessKind::keep_largest;
  else if (kind == "remove_small")
    s.kind = PostprocessKind::remove_small;
  else
    return invalid_config(where + ".kind: expected keep_largest or remove_small, got '" + kind + "'");
  const auto& c = j.contains("class") ? j["class"] : nlohmann::json();
  if (c.is_string() && c.get<std::string>() == "foreground")
    s.label = 0;
  else if (c.is_number_integer() && c.get<std::int64_t>() > 0)
    s.label = c.get<std::int64_t>();
  else
    return invalid_config(where + ".class: expected \"foreground\" or a label > 0, got " + c.dump());
  if (!j.contains("kept") || !j["kept"].is_boolean())
    return invalid_config(where + ".kept: expected true or false, got " +
                          (j.contains("kept") ? j["kept"].dump() : "nothing"));
  s.kept = j["kept"].get<bool>();
  if (s.kind == PostprocessKind::remove_small) {
    const auto& n = j.contains("min_voxels") ? j["min_voxels"] : nlohmann::json();
    if (!n.is_number_integer() || n.get<std::int64_t>() < 0)
      return invalid_config(where + ".min_voxels: expected an integer >= 0, got " + n.dump());
    s.min_voxels = n.get<std::int64_t>();
  }
  s.before = pp_number_of(j.value("before", nlohmann::json()));
  s.after = pp_number_of(j.value("after", nlohmann::json()));
  return s;
}

}  // namespace

nlohmann::json postprocessing_json(const PostprocessPlan& p) {
  nlohmann::json steps = nlohmann::json::array();
  for (const auto& s : p.steps) {
    nlohmann::json j = {{"kind", to_string(s.kind)},
                        {"class", s.label == 0 ? nlohmann::json("foreground") : nlohmann::json(s.label)},
                        {"kept", s.kept},
                        {"before", pp_number(s.before)},
                        {"after", pp_number(s.after)}};
    if (s.kind == PostprocessKind::remove_small) {
      j["min_voxels"] = s.min_voxels;
      nlohmann::json tried = nlohmann::json::object();
      for (const auto& [n, v] : s.tried) tried[std::to_string(n)] = pp_number(v);
      j["tried"] = tried;
    }
    steps.push_back(j);
  }
  nlohmann::json runs = nlohmann::json::array();
  for (const auto& r : p.runs) runs.push_back(r.string());
  return {{"metric", to_string(p.metric)},
          {"connectivity", p.connectivity},
          {"classes", p.classes},
          {"runs", runs},
          {"cases", p.cases},
          {"before", pp_number(p.before)},
          {"after", pp_number(p.after)},
          {"dice_before", pp_number(p.dice_before)},
          {"dice_after", pp_number(p.dice_after)},
          {"steps", steps}};
}

Result<PostprocessPlan> read_postprocessing(const fs::path& file) {
  SEGFLOW_ASSIGN_OR_RETURN(nlohmann::json j,
                           read_json_object(file, "no such file (expected postprocessing.json)"));
  const std::string f = file.string();
  PostprocessPlan p;
  const nlohmann::json metric = j.contains("metric") ? j["metric"] : nlohmann::json("dice");
  auto m = postprocess_metric_from_string(metric.is_string() ? metric.get<std::string>() : metric.dump());
  if (!m.is_ok()) return invalid_config(f + ": " + m.status().message());
  p.metric = *m;
  const auto& conn = j.contains("connectivity") ? j["connectivity"] : nlohmann::json(26);
  if (!conn.is_number_integer() || (conn != 6 && conn != 18 && conn != 26))
    return invalid_config(f + ": connectivity: expected 6, 18 or 26, got " + conn.dump());
  p.connectivity = conn.get<int>();
  if (!j.contains("steps") || !j["steps"].is_array())
    return invalid_config(f + ": steps: expected a list of steps, got " +
                          (j.contains("steps") ? j["steps"].dump() : std::string("nothing")));
  for (std::size_t i = 0; i < j["steps"].size(); ++i) {
    SEGFLOW_ASSIGN_OR_RETURN(PostprocessStep s,
                             read_step(j["steps"][i], f + ": steps[" + std::to_string(i) + "]"));
    p.steps.push_back(s);
  }
  if (j.contains("classes") && j["classes"].is_array())
    for (const auto& c : j["classes"])
      if (c.is_number_integer()) p.classes.push_back(c.get<std::int64_t>());
  p.cases = j.value("cases", std::int64_t{0});
  p.before = pp_number_of(j.value("before", nlohmann::json()));
  p.after = pp_number_of(j.value("after", nlohmann::json()));
  p.dice_before = pp_number_of(j.value("dice_before", nlohmann::json()));
  p.dice_after = pp_number_of(j.value("dice_after", nlohmann::json()));
  return p;
}

Result<at::Tensor> apply_postprocessing(const at::Tensor& labels, const PostprocessPlan& plan) {
  at::Tensor v;
  if (labels.dim() == 2)
    v = labels.unsqueeze(0);
  else if (labels.dim() == 3)
    v = labels;
  else if (labels.dim() == 4 && labels.size(0) == 1)
    v = labels[0];
  else
    return invalid_argument("postprocess: label map: expected (Y, X), (Z, Y, X) or (1, Z, Y, X), got " +
                            std::to_string(labels.dim()) + " dimensions");
  v = v.clone();
  for (const auto& s : plan.steps)
    if (s.kept) SEGFLOW_RETURN_IF_ERROR(apply_postprocessing_step(v, s, plan.connectivity));
  return v.reshape(labels.sizes());
}

Status apply_postprocessing_file(const fs::path& in, const fs::path& out, const PostprocessPlan& plan) {
  SEGFLOW_ASSIGN_OR_RETURN(pipeline::Image img, pipeline::read_image(in));
  auto v = apply_postprocessing(img.voxels, plan);
  if (!v.is_ok()) return v.status().with_context(in.string());
  img.voxels = *v;
  return pipeline::write_image(out, img);
}

}  // namespace segflow::models

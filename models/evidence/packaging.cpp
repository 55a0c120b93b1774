#include "models/evidence/packaging.hpp"

#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <ctime>
#include <fstream>
#include <set>

#include "messages/file_util.hpp"
#include "messages/hashing.hpp"
#include "models/evidence/cross_validation.hpp"
#include "models/inference/model_package.hpp"
#include "models/training/checkpoint.hpp"
#include "models/training/class_names.hpp"
#include "models/training/run_layout.hpp"
#include "models/training/trainer.hpp"

namespace segflow::models {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

/// A run path written in `file` (absolute, relative to the working folder, else to the file's folder).
fs::path resolve_listed(const std::string& p, const fs::path& file) {
  const fs::path path(p);
  std::error_code ec;
  if (path.is_absolute() || fs::exists(path, ec)) return path;
  const fs::path beside = file.parent_path() / path;
  return fs::exists(beside, ec) ? beside : path;
}

/// The run folders a JSON array of paths (or of {"run": path}) names.
Result<std::vector<fs::path>> listed_runs(const json& list, const fs::path& file, const std::string& field) {
  std::vector<fs::path> runs;
  if (!list.is_array() || list.empty())
    return invalid_argument(file.string() + ": " + field + ": expected a non-empty list of run folders");
  for (std::size_t i = 0; i < list.size(); ++i) {
    const json& e = list[i];
    const json& p = e.is_object() && e.contains("run") ? e["run"] : e;
    if (!p.is_string())
      return invalid_argument(file.string() + ": " + field + "[" + std::to_string(i) +
                              "]: expected a run folder path, got " + e.dump());
    runs.push_back(resolve_listed(p.get<std::string>(), file));
  }
  return runs;
}

/// A cv summary without its per-case rows, with the file it came from.
json cv_figures(json cv, const std::string& source) {
  cv.erase("cases");
  cv["source"] = source;
  return cv;
}

/// The runs to pack and the figures they were chosen on, from the options' three sources.
struct Sources {
  std::vector<fs::path> runs;
  json cv = json::array();
  json selection;  ///< null unless packaged from a selection
};

/// segflow select's selection.json (docs/reference/run-folder.md#selectionjson): the
/// winner's runs, its configurations' cv summaries as the figures, and the verdict.
Status add_selection(const fs::path& file, Sources& s) {
  SEGFLOW_ASSIGN_OR_RETURN(json sel, read_json_object(file, "no such selection file"));
  const json winner = sel.is_object() ? sel.value("winner", json()) : json();
  if (!winner.is_object() || !winner.contains("runs"))
    return invalid_argument(file.string() +
                            ": winner.runs: missing (expected segflow select's selection.json)");
  SEGFLOW_ASSIGN_OR_RETURN(std::vector<fs::path> runs, listed_runs(winner["runs"], file, "winner.runs"));
  s.runs.insert(s.runs.end(), runs.begin(), runs.end());
  for (const auto& m : winner.value("members", json::array())) {
    if (!m.is_object() || !m.value("summary", json()).is_string()) continue;
    auto cv = read_json_object(resolve_listed(m["summary"].get<std::string>(), file), "no such cv summary");
    if (cv.is_ok()) s.cv.push_back(cv_figures(*cv, m["summary"].get<std::string>()));
  }
  s.selection = {{"source", file.string()}};
  for (const char* key :
       {"metric", "class", "confidence", "winner", "runner_up", "distinguishable", "statement"})
    if (sel.contains(key)) s.selection[key] = sel[key];
  for (const char* key : {"winner", "runner_up"})
    if (s.selection.value(key, json()).is_object()) s.selection[key].erase("values");
  return Status::ok();
}

Result<Sources> gather_sources(const PackageOptions& o) {
  Sources s;
  s.runs = o.runs;
  for (const auto& file : o.cv) {
    SEGFLOW_ASSIGN_OR_RETURN(json cv, read_json_object(file, "no such cv summary"));
    if (!cv.is_object() || !cv.contains("runs"))
      return invalid_argument(file.string() + ": runs: missing (expected segflow cv's cv_summary.json)");
    SEGFLOW_ASSIGN_OR_RETURN(std::vector<fs::path> runs, listed_runs(cv["runs"], file, "runs"));
    s.runs.insert(s.runs.end(), runs.begin(), runs.end());
    s.cv.push_back(cv_figures(cv, file.string()));
  }
  if (!o.selection.empty()) SEGFLOW_RETURN_IF_ERROR(add_selection(o.selection, s));
  if (s.runs.empty())
    return invalid_argument("expected run folders, --cv cv_summary.json or --selection selection.json");
  std::set<std::string> seen;
  for (const auto& r : s.runs)
    if (!seen.insert(fs::weakly_canonical(r).string()).second)
      return invalid_argument(r.string() + ": this run is named twice");
  return s;
}

/// Packaged from runs alone: the figures are segflow cv's on their out-of-fold predictions
/// (when every run has them).
Status add_computed_cv(const PackageOptions& o, Sources& s) {
  if (!o.cv.empty() || !o.selection.empty()) return Status::ok();
  std::error_code ec;
  for (const auto& r : s.runs)
    if (!fs::exists(RunLayout(r).validation_summary(), ec)) {
      if (o.note) o.note("no cross-validation figures: " + r.string() + " has no validation/summary.json");
      return Status::ok();
    }
  CvOptions co;
  co.runs = s.runs;
  // Runs of several configurations share cases: pass their cv summaries (--cv) instead.
  auto report = cross_validate(co);
  if (report.is_ok())
    s.cv.push_back(cv_figures(cv_json(*report), "segflow cv of the members"));
  else if (o.note)
    o.note("no cross-validation figures: " + report.status().message());
  return Status::ok();
}

/// A member before it is copied: its checkpoint loaded once to check it.
struct Candidate {
  fs::path run, checkpoint;
  ModelInfo info;
  json config;  ///< the checkpoint's resolved job config
  std::int64_t classes = 2, fold = -1;
  std::string name;
  double overlap = 0.25;
  std::vector<std::string> class_names;
};

Result<Candidate> load_candidate(const fs::path& run, const std::string& which) {
  Candidate c;
  c.run = run;
  c.checkpoint = RunLayout(run).checkpoint(which);
  std::error_code ec;
  if (!fs::is_directory(run, ec)) return not_found(run.string() + ": no such run folder");
  if (!fs::is_regular_file(c.checkpoint, ec))
    return not_found(c.checkpoint.string() + ": no such checkpoint (--checkpoint " + which + ")");
  SEGFLOW_ASSIGN_OR_RETURN(auto trainer, load_for_inference(c.checkpoint, "cpu"));
  SEGFLOW_ASSIGN_OR_RETURN(json meta, read_checkpoint_meta(c.checkpoint));
  c.info = trainer->model().info();
  if (c.info.needs_box)
    return unsupported(c.checkpoint.string() +
                       ": box-prompted models cannot be packaged (segflow infer runs "
                       "them without boxes)");
  c.classes = c.info.out_channels == 1 ? 2 : c.info.out_channels;
  const JobConfig& cfg = trainer->config();
  c.config = meta.value("config", json::object());
  c.fold = cfg.data.fold;
  c.name = cfg.name;
  c.overlap = cfg.validation.overlap;
  c.class_names = model_class_names(*trainer);
  return c;
}

/// Every member predicts what the first does: the same classes (count and known names) from
/// the same input channels (2D and 3D members may mix: infer averages them on one grid).
Status check_members(const std::vector<Candidate>& cs) {
  const Candidate& a = cs.front();
  for (const Candidate& b : cs) {
    const std::string head = b.run.string() + ": cannot be packaged with " + a.run.string() + ": ";
    if (b.classes != a.classes)
      return invalid_argument(head + "classes: " + std::to_string(b.classes) + " (labels 0.." +
                              std::to_string(b.classes - 1) + "), expected " + std::to_string(a.classes));
    if (b.info.in_channels != a.info.in_channels)
      return invalid_argument(head + "input channels: " + std::to_string(b.info.in_channels) + ", expected " +
                              std::to_string(a.info.in_channels));
    if (!a.class_names.empty() && !b.class_names.empty() && a.class_names != b.class_names)
      for (std::size_t k = 0; k < a.class_names.size(); ++k)
        if (a.class_names[k] != b.class_names[k])
          return invalid_argument(head + "class " + std::to_string(k) + " is '" + b.class_names[k] +
                                  "', expected '" + a.class_names[k] + "'");
  }
  return Status::ok();
}

/// The plan's classes and steps must be classes 1..K-1 of the package.
Status check_postprocessing(const PostprocessPlan& plan, const fs::path& file, std::int64_t classes) {
  const auto bad = [&](const std::string& field, std::int64_t label) {
    return invalid_argument(file.string() + ": " + field + ": class " + std::to_string(label) +
                            " is not a class of the model (labels 1.." + std::to_string(classes - 1) +
                            "): a postprocessing.json of other classes");
  };
  for (std::size_t i = 0; i < plan.classes.size(); ++i)
    if (plan.classes[i] < 1 || plan.classes[i] >= classes)
      return bad("classes[" + std::to_string(i) + "]", plan.classes[i]);
  for (std::size_t i = 0; i < plan.steps.size(); ++i)
    if (plan.steps[i].label < 0 || plan.steps[i].label >= classes)
      return bad("steps[" + std::to_string(i) + "].class", plan.steps[i].label);
  return Status::ok();
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

/// The manifest's members and shared fields (files and hashes are added by the writer).
json manifest_of(const std::vector<Candidate>& cs, const PackageOptions& o, const Sources& src,
                 const std::optional<PostprocessPlan>& plan) {
  const Candidate& a = cs.front();
  json classes = json::array();
  for (std::int64_t k = 0; k < a.classes; ++k) {
    const auto n = static_cast<std::size_t>(k);
    classes.push_back(
        {{"label", k}, {"name", n < a.class_names.size() ? json(a.class_names[n]) : json(nullptr)}});
  }
  bool same_overlap = true;
  for (const auto& c : cs) same_overlap = same_overlap && c.overlap == a.overlap;
  json members = json::array();
  for (std::size_t i = 0; i < cs.size(); ++i) {
    const Candidate& c = cs[i];
    const fs::path folder = fs::path("members") / (std::to_string(i) + "-" + c.run.filename().string());
    members.push_back({{"checkpoint", (folder / c.checkpoint.filename()).string()},
                       {"config", RunLayout(folder).config().string()},
                       {"run", c.run.filename().string()},
                       {"source", fs::absolute(c.checkpoint).lexically_normal().string()},
                       {"fold", c.fold},
                       {"configuration", c.name},
                       {"family", c.info.name},
                       {"spatial_dims", c.info.spatial_dims},
                       {"overlap", c.overlap}});
  }
  json m = {{"format", kModelPackageFormat},
            {"created", utc_now()},
            {"classes", classes},
            {"spatial_dims", a.info.spatial_dims},
            {"in_channels", a.info.in_channels},
            {"family", a.info.name},
            {"tta", to_string(o.tta)},
            {"overlap", same_overlap ? json(a.overlap) : json(nullptr)},
            {"checkpoint", o.checkpoint},
            {"members", members},
            {"postprocessing", plan ? json("postprocessing.json") : json(nullptr)},
            {"cv", src.cv},
            {"selection", src.selection}};
  if (plan) {
    m["postprocessing_summary"] = postprocessing_json(*plan);
    m["postprocessing_summary"].erase("steps");
  }
  return m;
}

/// Copies the members' checkpoints, their configs and the plan into `tmp`, then writes
/// model.json with every file's sha256.
Status fill_package(const fs::path& tmp, json& manifest, const std::vector<Candidate>& cs,
                    const fs::path& postprocessing) {
  json files = json::object();
  std::error_code ec;
  for (std::size_t i = 0; i < cs.size(); ++i) {
    const json& m = manifest["members"][i];
    const fs::path ckpt = tmp / m["checkpoint"].get<std::string>();
    fs::create_directories(ckpt.parent_path(), ec);
    if (ec) return io_error(ckpt.parent_path().string() + ": cannot create the folder: " + ec.message());
    if (!fs::copy_file(cs[i].checkpoint, ckpt, ec) || ec)
      return io_error(cs[i].checkpoint.string() + ": cannot copy into the package: " + ec.message());
    SEGFLOW_RETURN_IF_ERROR(
        write_file_atomically(tmp / m["config"].get<std::string>(), cs[i].config.dump(2) + "\n"));
  }
  if (!postprocessing.empty() && (!fs::copy_file(postprocessing, tmp / "postprocessing.json", ec) || ec))
    return io_error(postprocessing.string() + ": cannot copy into the package: " + ec.message());
  for (const auto& e : fs::recursive_directory_iterator(tmp, ec)) {
    if (!e.is_regular_file()) continue;
    SEGFLOW_ASSIGN_OR_RETURN(std::string hex, sha256_file(e.path()));
    files[e.path().lexically_relative(tmp).string()] = hex;
  }
  if (ec) return io_error(tmp.string() + ": cannot list the folder: " + ec.message());
  manifest["files"] = files;
  return write_file_atomically(tmp / "model.json", manifest.dump(2) + "\n");
}

}  // namespace

Result<ModelPackage> write_model_package(const PackageOptions& o) {
  if (o.out.empty()) return invalid_argument("--out: required (the model folder to write)");
  if (o.checkpoint != "last" && o.checkpoint != "best")
    return invalid_argument("--checkpoint: expected last or best, got '" + o.checkpoint + "'");
  std::error_code ec;
  if (fs::exists(o.out, ec))
    return invalid_argument(o.out.string() +
                            ": --out: already exists (a package is never overwritten; "
                            "remove it or name another folder)");
  SEGFLOW_ASSIGN_OR_RETURN(Sources src, gather_sources(o));
  std::vector<Candidate> cs;
  for (const auto& run : src.runs) {
    if (o.note) o.note("checking " + (run / (o.checkpoint + ".pt")).string());
    SEGFLOW_ASSIGN_OR_RETURN(Candidate c, load_candidate(run, o.checkpoint));
    cs.push_back(std::move(c));
  }
  SEGFLOW_RETURN_IF_ERROR(check_members(cs));
  SEGFLOW_RETURN_IF_ERROR(add_computed_cv(o, src));
  std::optional<PostprocessPlan> plan;
  if (!o.postprocessing.empty()) {
    SEGFLOW_ASSIGN_OR_RETURN(plan, read_postprocessing(o.postprocessing));
    SEGFLOW_RETURN_IF_ERROR(check_postprocessing(*plan, o.postprocessing, cs.front().classes));
  }
  json manifest = manifest_of(cs, o, src, plan);
  SEGFLOW_RETURN_IF_ERROR(write_folder_atomically(
      o.out, [&](const fs::path& tmp) { return fill_package(tmp, manifest, cs, o.postprocessing); }));
  if (o.note) o.note("wrote " + o.out.string() + " (" + std::to_string(cs.size()) + " member(s))");
  return read_model_package(o.out, false);
}

}  // namespace segflow::models

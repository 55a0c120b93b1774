// Plan jobs (`segflow ctl plan`, `ctl train DATASET`, auto_train): the request checked and
// stored as JSON, recovery at start, and the worker that plans a dataset folder
// (models/planning) and, with a configuration to train, queues one training job per fold.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>

#include "daemon/detail/job.hpp"
#include "daemon/job_manager.hpp"
#include "messages/log.hpp"
#include "models/planning/plan.hpp"
#include "models/training/trainer.hpp"
#include "pipeline/fingerprint.hpp"

namespace segflow::daemon {

namespace fs = std::filesystem;
namespace planning = models::planning;
using detail::absolute_path;
using nlohmann::json;

namespace {

json plan_spec_to_json(const PlanJobSpec& s) {
  return {{"dataset", s.dataset},
          {"out", s.out},
          {"configurations", s.configurations},
          {"memory_gb", s.memory_gb},
          {"memory_model", s.memory_model},
          {"preset", s.preset},
          {"device", s.device},
          {"train", s.train},
          {"folds", s.folds},
          {"all_folds", s.all_folds},
          {"set", s.overrides},
          {"trigger", s.trigger},
          {"signature", s.signature}};
}

Result<PlanJobSpec> plan_spec_from_json(const json& j) {
  try {
    PlanJobSpec s;
    s.dataset = j.at("dataset").get<std::string>();
    s.out = j.at("out").get<std::string>();
    s.configurations = j.value("configurations", std::vector<std::string>());
    s.memory_gb = j.value("memory_gb", 0.0);
    s.memory_model = j.value("memory_model", std::string());
    s.preset = j.value("preset", std::string());
    s.device = j.value("device", std::string("auto"));
    s.train = j.value("train", std::string());
    s.folds = j.value("folds", std::vector<std::int64_t>());
    s.all_folds = j.value("all_folds", false);
    s.overrides = j.value("set", std::vector<std::string>());
    s.trigger = j.value("trigger", std::string());
    s.signature = j.value("signature", std::string());
    return s;
  } catch (const std::exception& e) {
    return corrupt_data(std::string("stored plan request: ") + e.what());
  }
}

/// The request's own fields: the dataset a folder (a bare name: a folder of data_root),
/// paths absolute, every name parsed. Errors name the field.
Status check_plan_request(PlanJobSpec& s, const fs::path& data_root) {
  if (s.dataset.empty())
    return invalid_argument("dataset: missing (a dataset folder, or a dataset of data_root)");
  std::error_code ec;
  const bool bare = s.dataset.find('/') == std::string::npos;
  s.dataset =
      (bare && fs::is_directory(data_root / s.dataset, ec) ? data_root / s.dataset : absolute_path(s.dataset))
          .lexically_normal()
          .string();
  if (!fs::is_directory(s.dataset, ec)) return not_found("dataset: " + s.dataset + ": no such folder");
  s.out = s.out.empty() ? (fs::path(s.dataset) / ".segflow-plans").string() : absolute_path(s.out).string();
  for (const auto& c : s.configurations) {
    auto k = planning::parse_configuration(c);
    if (!k.is_ok()) return invalid_argument("configurations: " + k.status().message());
  }
  if (!s.train.empty())
    if (auto k = planning::parse_configuration(s.train); !k.is_ok())
      return invalid_argument("configuration: " + k.status().message());
  if (!std::isfinite(s.memory_gb) || s.memory_gb < 0)
    return invalid_argument("memory_gb: expected a number > 0 (GB), got " + std::to_string(s.memory_gb));
  if (!s.memory_model.empty())
    if (auto m = planning::parse_memory_model(s.memory_model); !m.is_ok())
      return invalid_argument("memory_model: " + m.status().message());
  if (!s.preset.empty())
    if (const std::string e = planning::preset_error(s.preset); !e.empty())
      return invalid_argument("preset: " + e);
  if (s.device.empty()) s.device = "auto";
  if (s.device != "auto")
    if (auto d = models::resolve_device(s.device); !d.is_ok())
      return invalid_argument("device: " + d.status().message());
  for (std::int64_t k : s.folds)
    if (k < 0) return invalid_argument("folds: expected fold numbers >= 0 or all, got " + std::to_string(k));
  if (!s.train.empty() && s.folds.empty() && !s.all_folds) s.folds = {0};
  return Status::ok();
}

/// The planner's options of a request, its trials on `device`.
planning::PlanOptions plan_options(const PlanJobSpec& s, const std::string& device) {
  planning::PlanOptions o;
  o.device = device;
  if (!s.configurations.empty()) {
    o.configurations.clear();
    for (const auto& c : s.configurations) o.configurations.push_back(*planning::parse_configuration(c));
  }
  if (!s.preset.empty()) (void)planning::set_preset(o, s.preset, false);  // checked at submission
  if (s.memory_gb > 0) o.memory_gb = s.memory_gb;
  if (!s.memory_model.empty()) o.memory_model = *planning::parse_memory_model(s.memory_model);
  return o;
}

/// What a plan folder holds: {plan_dir, configurations, excluded: [{case, file, field, message}]}.
json describe_plan_folder(const fs::path& out) {
  json d = {{"plan_dir", out.string()}, {"configurations", json::array()}, {"excluded", json::array()}};
  std::ifstream f(out / "plans.json");
  const json plans = json::parse(f, nullptr, false);
  if (!plans.is_discarded() && plans.contains("configurations"))
    for (auto it = plans["configurations"].begin(); it != plans["configurations"].end(); ++it)
      d["configurations"].push_back(it.key());
  auto fp = pipeline::read_fingerprint(out / "fingerprint.json");
  if (fp.is_ok())
    for (const auto& e : fp->excluded)
      d["excluded"].push_back(
          {{"case", e.id}, {"file", e.file.string()}, {"field", e.field}, {"message", e.message}});
  return d;
}

/// Plans (or, with train, reuses a current plan of that configuration); the YAML to train
/// ("" without train). Exceptions become the status.
Result<fs::path> plan_request(const PlanJobSpec& s, const std::string& device, bool& reused) {
  try {
    const planning::PlanOptions o = plan_options(s, device);
    if (s.train.empty()) {
      SEGFLOW_RETURN_IF_ERROR(planning::plan_into_folder(s.dataset, s.out, o).status());
      return fs::path();
    }
    const auto kind = *planning::parse_configuration(s.train);
    SEGFLOW_ASSIGN_OR_RETURN(planning::EnsuredPlan e, planning::plan_or_reuse(s.dataset, s.out, kind, o));
    reused = e.reused;
    return e.yaml;
  } catch (const std::exception& e) {
    return internal_error(std::string("planning failed with an exception: ") + e.what());
  }
}

std::string read_text(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

/// "planned 3d_fullres, 2d into DIR[; N case(s) left out][; training jobs 4, 5]".
std::string planned_reason(const json& planned) {
  std::string configs;
  for (const auto& c : planned["configurations"])
    configs += (configs.empty() ? "" : ", ") + c.get<std::string>();
  std::string r = (planned.value("reused", false) ? "reused the plan (" : "planned (") + configs + ") in " +
                  planned["plan_dir"].get<std::string>();
  if (!planned["excluded"].empty())
    r += "; " + std::to_string(planned["excluded"].size()) + " case(s) left out, first " +
         planned["excluded"][0]["message"].get<std::string>();
  if (planned.contains("train_jobs")) {
    std::string ids;
    for (const auto& id : planned["train_jobs"])
      ids += (ids.empty() ? "" : ", ") + std::to_string(id.get<std::int64_t>());
    r += "; training jobs " + ids;
  }
  return r;
}

}  // namespace

namespace detail {

void add_plan_fields(const Job& j, json& body) {
  body["dataset_path"] = j.plan.dataset;
  body["plan_dir"] = j.plan.out;
  if (!j.plan.train.empty())
    body["train"] = {{"configuration", j.plan.train},
                     {"folds", j.plan.all_folds ? json("all") : json(j.plan.folds)},
                     {"set", j.plan.overrides}};
  if (!j.plan.trigger.empty()) body["trigger"] = j.plan.trigger;
  for (const char* k : {"configurations", "excluded", "reused", "train_jobs"})
    if (j.planned.contains(k)) body[k] = j.planned[k];
}

}  // namespace detail

Result<json> JobManager::submit_plan(PlanJobSpec spec) {
  SEGFLOW_RETURN_IF_ERROR(check_plan_request(spec, o_.data_root));
  JobRecord rec;
  rec.kind = JobKind::plan;
  rec.name = (spec.train.empty() ? "plan " : "plan+train ") + fs::path(spec.dataset).filename().string();
  rec.file = spec.dataset;
  rec.config_yaml = json{{"request", plan_spec_to_json(spec)}}.dump();
  rec.state = JobState::queued;
  rec.run_dir = spec.out;
  rec.dataset = detail::followed_dataset(spec.dataset, o_.data_root);
  rec.epochs = 1;
  rec.loss = std::nan("");
  rec.created = rec.updated = StateDb::now();

  std::lock_guard<std::mutex> lock(mu_);
  SEGFLOW_ASSIGN_OR_RETURN(Job * job, insert_locked(std::move(rec)));
  job->plan = std::move(spec);
  log::info("job " + std::to_string(job->rec.id) + " (" + job->rec.name + ") queued; plan folder " +
            job->plan.out);
  publish_state_locked(*job);
  schedule_locked();
  json reply = {{"job", job->rec.id},
                {"state", to_string(job->rec.state)},
                {"kind", to_string(job->rec.kind)},
                {"dataset", job->plan.dataset},
                {"plan_dir", job->plan.out}};
  if (!job->plan.trigger.empty()) reply["trigger"] = job->plan.trigger;
  return reply;
}

bool JobManager::plan_submitted(const std::string& dataset, const std::string& signature) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [id, j] : jobs_)
    if (j->is_plan() && j->plan.trigger == "auto_train" && j->plan.dataset == dataset &&
        j->plan.signature == signature)
      return true;
  return false;
}

void JobManager::restore_plan_locked(Job& j) {
  const json stored = json::parse(j.rec.config_yaml, nullptr, false);
  auto spec = stored.is_object() && stored.contains("request")
                  ? plan_spec_from_json(stored["request"])
                  : Result<PlanJobSpec>(corrupt_data("stored plan request: expected {\"request\": ...}"));
  const bool active = j.rec.state == JobState::running || j.rec.state == JobState::queued;
  if (spec.is_ok()) {
    j.plan = std::move(*spec);
    if (stored.contains("planned")) j.planned = stored["planned"];
  } else if (active || j.rec.state == JobState::paused) {
    j.rec.state = JobState::failed;
    j.rec.reason = spec.status().message();
    save_locked(j);
    return;
  }
  if (active) {
    if (j.rec.state == JobState::running) j.rec.reason = "planning again after a daemon restart";
    j.rec.state = JobState::queued;
    j.rec.epoch = 0;
    save_locked(j);
  }
}

Result<std::vector<std::int64_t>> JobManager::submit_planned_training(const PlanJobSpec& spec,
                                                                      const fs::path& yaml) {
  const std::string text = read_text(yaml);
  SEGFLOW_ASSIGN_OR_RETURN(models::JobConfig cfg,
                           models::parse_job_config(text, yaml.string(), spec.overrides));
  std::vector<std::int64_t> folds = spec.folds;
  if (spec.all_folds)
    for (std::int64_t k = 0; k < std::max<std::int64_t>(cfg.data.folds, 1); ++k) folds.push_back(k);
  for (std::int64_t k : folds)
    if (k >= std::max<std::int64_t>(cfg.data.folds, 1))
      return invalid_argument("folds: fold " + std::to_string(k) + " is out of range: the plan " +
                              yaml.string() + " has data.folds " + std::to_string(cfg.data.folds));
  std::vector<std::int64_t> ids;
  for (std::int64_t k : folds) {
    std::vector<std::string> overrides = spec.overrides;
    if (cfg.data.folds > 0) overrides.push_back("data.fold=" + std::to_string(k));
    auto r = submit(text, yaml.string(), overrides, yaml);
    if (!r.is_ok())
      return r.status().with_context("fold " + std::to_string(k) +
                                     (ids.empty() ? std::string() : " (folds queued before it stay)"));
    ids.push_back((*r)["job"].get<std::int64_t>());
  }
  return ids;
}

void JobManager::run_plan_job(Job* j) {
  PlanJobSpec spec;
  std::string device;
  {
    std::lock_guard<std::mutex> lock(mu_);
    spec = j->plan;
    device = j->rec.device;
    j->rec.epoch = 0;
    j->rec.epochs = 1;
  }
  bool reused = false;
  const Result<fs::path> yaml = plan_request(spec, device, reused);
  json planned = yaml.is_ok() ? describe_plan_folder(spec.out) : json::object();
  planned["reused"] = reused;
  Status st = yaml.status();
  if (st.is_ok() && !spec.train.empty()) {
    auto ids = submit_planned_training(spec, *yaml);  // takes mu_ itself
    if (ids.is_ok())
      planned["train_jobs"] = *ids;
    else
      st = ids.status();
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (!yaml.is_ok()) return end_job_locked(*j, JobState::failed, st.message());
  j->planned = planned;
  j->rec.config_yaml = json{{"request", plan_spec_to_json(spec)}, {"planned", planned}}.dump();
  publish_(j->metrics_topic(), {{"job", j->rec.id},
                                {"type", "planned"},
                                {"dataset_path", spec.dataset},
                                {"plan_dir", spec.out},
                                {"configurations", planned["configurations"]},
                                {"excluded", planned["excluded"]},
                                {"reused", reused}});
  j->rec.epoch = 1;
  if (!st.is_ok() && shutting_down_ && !planned.contains("train_jobs"))  // its trainings were refused
    return end_job_locked(*j, JobState::queued, "daemon shut down before training; plans again at start");
  if (!st.is_ok()) return end_job_locked(*j, JobState::failed, "planned, but not trained: " + st.message());
  end_job_locked(*j, JobState::completed, planned_reason(planned));
}

}  // namespace segflow::daemon

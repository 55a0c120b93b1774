// Training jobs: submission, recovery at start, the worker thread driving
// actors::run_training, and the observer that turns its progress into records and events.
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <utility>

#include "actors/jobs/job_runner.hpp"
#include "daemon/detail/job.hpp"
#include "daemon/job_manager.hpp"
#include "messages/event.hpp"
#include "messages/log.hpp"
#include "models/planning/plan.hpp"
#include "models/training/job_config.hpp"
#include "models/training/trainer.hpp"

namespace segflow::daemon {

namespace fs = std::filesystem;
using detail::absolute_path;
using detail::followed_dataset;
using detail::kNone;
using detail::kPause;
using detail::kReload;
using detail::kShutdown;
using detail::kStop;
using detail::number_or_null;
using nlohmann::json;

namespace {

/// True when the job's YAML (or an override) names output.runs_dir itself.
bool names_runs_dir(const std::string& yaml, const std::vector<std::string>& overrides) {
  for (const auto& o : overrides)
    if (o.rfind("output.runs_dir=", 0) == 0 || o.rfind("output=", 0) == 0) return true;
  try {
    YAML::Node root = YAML::Load(yaml);
    return root.IsMap() && root["output"] && root["output"].IsMap() && root["output"]["runs_dir"];
  } catch (...) {
    return false;
  }
}

std::string yaml_quoted(const std::string& s) { return json(s).dump(); }

/// A submitted config, checked, with the overrides that make its paths absolute.
struct CheckedConfig {
  models::JobConfig cfg;
  std::vector<std::string> stored;  ///< the overrides stored with the job
};

/// The whole config, typed and built (stages, model, loss, optimizer), before a job exists;
/// relative paths become absolute (as overrides), so the job means the same thing whatever
/// the daemon's folder.
Result<CheckedConfig> check_config(const std::string& yaml, const std::string& file,
                                   const std::vector<std::string>& overrides,
                                   const pipeline::StageRegistry& registry) {
  SEGFLOW_ASSIGN_OR_RETURN(models::JobConfig cfg, models::parse_job_config(yaml, file, overrides));
  SEGFLOW_RETURN_IF_ERROR(models::validate_job_config(cfg, registry));
  if (cfg.train.device != "auto") {
    auto d = models::resolve_device(cfg.train.device);
    if (!d.is_ok()) return invalid_config(file + ": train.device: " + d.status().message());
  }
  std::error_code ec;
  std::vector<std::string> stored = overrides;
  if (fs::path(cfg.data.root).is_relative()) {
    cfg.data.root = absolute_path(cfg.data.root).string();
    stored.push_back("data.root=" + yaml_quoted(cfg.data.root));
  }
  if (!cfg.train.disk_cache.empty() && fs::path(cfg.train.disk_cache).is_relative())
    stored.push_back("train.disk_cache=" + yaml_quoted(absolute_path(cfg.train.disk_cache).string()));
  if (!fs::exists(cfg.data.root, ec) && !cfg.data.synth)
    return not_found(file + ": data.root: " + cfg.data.root +
                     " does not exist (and no data.synth to make it)");
  // Re-parse with the stored overrides: what recovery will read must be what runs now.
  SEGFLOW_ASSIGN_OR_RETURN(cfg, models::parse_job_config(yaml, file, stored));
  return CheckedConfig{std::move(cfg), std::move(stored)};
}

/// The start of a job's reason when train.early_stopping ended it.
constexpr const char* kStoppedEarly = "stopped early";

/// How a training attempt ended: its state and reason from the result and the job's request.
/// Nothing when the followed dataset changed (kReload): the job goes on from its checkpoint.
std::optional<std::pair<JobState, std::string>> attempt_outcome(detail::Job& j, const Status& st) {
  const int req = j.request.load();
  const std::string at_epoch = " at epoch " + std::to_string(j.rec.epoch);
  if (!st.is_ok()) return std::pair{JobState::failed, st.message()};
  // train.early_stopping ended it (Observer::on_early_stop left the reason): completed at
  // the epoch it stopped after, with that reason.
  if (req == kNone && j.rec.reason.rfind(kStoppedEarly, 0) == 0)
    return std::pair{JobState::completed, j.rec.reason};
  if (j.rec.epoch >= j.rec.epochs || req == kNone) {
    j.rec.epoch = std::max(j.rec.epoch, j.rec.epochs);
    return std::pair{JobState::completed, std::string()};
  }
  if (req == kStop) return std::pair{JobState::stopped, "stopped" + at_epoch + " (checkpoint written)"};
  if (req == kPause) return std::pair{JobState::paused, "paused" + at_epoch + " (checkpoint written)"};
  if (req == kShutdown)
    return std::pair{JobState::queued,
                     "daemon shut down" + at_epoch + "; resumes when segflowd starts again"};
  return std::nullopt;
}

}  // namespace

/// The running job's sink on its run's event bus: progress into the record, the database and
/// the event socket (the data path's events too, as "data_event"); should_stop() answers
/// pause, stop, shutdown and dataset reloads.
class JobManager::Observer : public actors::RunSink {
 public:
  Observer(JobManager& m, Job& j) : m_(m), j_(j) {}

  void on_epoch_start(std::int64_t epoch, std::int64_t total) override {
    at_boundary_ = false;
    epoch_samples_ = 0;
    epoch_seconds_ = 0.0;
    std::lock_guard<std::mutex> lock(m_.mu_);
    j_.rec.epochs = total;
    m_.publish_(topic(), {{"job", j_.rec.id}, {"type", "epoch_start"}, {"epoch", epoch}, {"epochs", total}});
  }

  void on_step(const models::StepInfo& i) override {
    at_boundary_ = false;
    epoch_samples_ += i.samples;
    epoch_seconds_ += i.step_s;
    std::lock_guard<std::mutex> lock(m_.mu_);
    j_.rec.step = i.step;
    j_.rec.loss = i.loss;
    if (epoch_seconds_ > 0) j_.rec.samples_per_s = static_cast<double>(epoch_samples_) / epoch_seconds_;
    m_.publish_(topic(), {{"job", j_.rec.id},
                          {"type", "step"},
                          {"epoch", i.epoch},
                          {"step", i.step},
                          {"step_in_epoch", i.step_in_epoch},
                          {"loss", number_or_null(i.loss)},
                          {"lr", i.lr},
                          {"samples", i.samples},
                          {"step_ms", i.step_s * 1e3},
                          {"data_wait_ms", i.data_wait_s * 1e3},
                          {"skipped", i.skipped}});
    const auto now = std::chrono::steady_clock::now();
    if (now - j_.last_save > std::chrono::seconds(2)) m_.save_locked(j_);
  }

  void on_epoch_end(const models::EpochInfo& i) override {
    at_boundary_ = true;
    std::lock_guard<std::mutex> lock(m_.mu_);
    j_.rec.epoch = i.epoch + 1;
    j_.rec.samples_per_s = i.samples_per_s;
    m_.save_locked(j_);
    m_.publish_(topic(), {{"job", j_.rec.id},
                          {"type", "epoch"},
                          {"epoch", i.epoch},
                          {"steps", i.steps},
                          {"loss", number_or_null(i.loss)},
                          {"seconds", i.seconds},
                          {"samples_per_s", i.samples_per_s},
                          {"data_wait_s", i.data_wait_s},
                          {"lr", i.lr}});
    // New or removed cases in the followed dataset: restart from this epoch's checkpoint.
    if (!j_.rec.dataset.empty() && m_.version_ && m_.version_(j_.rec.dataset) != j_.started_version &&
        j_.rec.epoch < j_.rec.epochs)
      j_.raise(kReload);
  }

  void on_validation(const models::ValidationInfo& v) override {
    std::lock_guard<std::mutex> lock(m_.mu_);
    if (std::isfinite(v.mean_dice) && v.mean_dice > j_.rec.best_dice) j_.rec.best_dice = v.mean_dice;
    json per = json::array();
    for (double d : v.dice_per_class) per.push_back(number_or_null(d));
    m_.save_locked(j_);
    m_.publish_(topic(), {{"job", j_.rec.id},
                          {"type", "validation"},
                          {"epoch", v.epoch},
                          {"mean_dice", number_or_null(v.mean_dice)},
                          {"dice_per_class", per},
                          {"cases", v.cases},
                          {"seconds", v.seconds},
                          {"best", v.best}});
  }

  void on_checkpoint(const fs::path& p, const std::string& kind) override {
    std::lock_guard<std::mutex> lock(m_.mu_);
    if (kind == "last") {
      j_.rec.checkpoint_epoch = j_.rec.epoch;
      m_.save_locked(j_);
    }
    m_.publish_(topic(), {{"job", j_.rec.id},
                          {"type", "checkpoint"},
                          {"kind", kind},
                          {"path", p.string()},
                          {"epoch", j_.rec.epoch}});
  }

  void on_case_failure(const pipeline::CaseFailure& f) override {
    log::warn("job " + std::to_string(j_.rec.id) + ": skipped " + f.case_id + ": " + f.reason);
    std::lock_guard<std::mutex> lock(m_.mu_);
    m_.publish_(topic(),
                {{"job", j_.rec.id}, {"type", "case_failure"}, {"case", f.case_id}, {"reason", f.reason}});
  }

  void on_data_event(const Event& e) override {
    json body = event_to_json(e);
    body["job"] = j_.rec.id;
    body["type"] = "data_event";
    std::lock_guard<std::mutex> lock(m_.mu_);
    m_.publish_(topic(), body);
  }

  /// train.early_stopping ended the run: an "early_stop" event (models::early_stop_info_json,
  /// with "earlier" when a resumed run had already stopped) and the job's finished reason.
  void on_early_stop(const models::EarlyStopInfo& i) override {
    json body = models::early_stop_info_json(i);
    body["job"] = j_.rec.id;
    body["type"] = "early_stop";
    body["earlier"] = i.earlier;
    std::lock_guard<std::mutex> lock(m_.mu_);
    j_.rec.reason = std::string(kStoppedEarly) + " after epoch " + std::to_string(i.epoch + 1) + ": " +
                    models::early_stop_reason(i);
    m_.publish_(topic(), body);
  }

  /// Stop right away, or (pause, shutdown, reload) only where an epoch has just ended: the
  /// trainer counts an epoch it leaves early as done, so stopping mid-epoch would skip the
  /// rest of it; at the boundary the resumed run is exactly the uninterrupted one.
  bool should_stop() override {
    const int r = j_.request.load();
    if (r == kNone) return false;
    return r == kStop || j_.now.load() || at_boundary_;
  }

 private:
  std::string topic() const { return j_.metrics_topic(); }
  JobManager& m_;
  Job& j_;
  bool at_boundary_ = false;  // on_epoch_end seen, no step since (only the job thread touches it)
  std::int64_t epoch_samples_ = 0;
  double epoch_seconds_ = 0.0;
};

Result<json> JobManager::submit(const std::string& yaml, const std::string& file,
                                const std::vector<std::string>& overrides, const fs::path& plan_yaml) {
  SEGFLOW_ASSIGN_OR_RETURN(CheckedConfig checked, check_config(yaml, file, overrides, registry_));
  models::JobConfig& cfg = checked.cfg;
  const fs::path runs_root =
      names_runs_dir(yaml, overrides) ? absolute_path(cfg.runs_dir) : o_.state_dir / "runs";
  const std::string dataset = followed_dataset(cfg.data.root, o_.data_root);
  JobRecord rec;
  rec.name = cfg.name;
  rec.file = file;
  rec.config_yaml = yaml;
  rec.overrides = checked.stored;
  rec.state = JobState::queued;
  rec.dataset = dataset;
  rec.epochs = cfg.train.epochs;
  rec.loss = std::nan("");
  rec.created = rec.updated = StateDb::now();

  std::lock_guard<std::mutex> lock(mu_);
  SEGFLOW_ASSIGN_OR_RETURN(Job * job, insert_locked(std::move(rec)));
  job->rec.run_dir =
      (runs_root / ("job" + std::to_string(job->rec.id) + "-" + models::run_name(cfg))).string();
  job->cfg = std::move(cfg);
  if (!plan_yaml.empty())
    if (Status st = models::planning::copy_plan_into_run(plan_yaml, job->rec.run_dir); !st.is_ok())
      log::warn("job " + std::to_string(job->rec.id) + ": " + st.message());
  save_locked(*job);
  log::info("job " + std::to_string(job->rec.id) + " (" + job->rec.name + ") queued; run folder " +
            job->rec.run_dir + (dataset.empty() ? "" : "; follows dataset " + dataset));
  publish_state_locked(*job);
  schedule_locked();
  return json{{"job", job->rec.id},
              {"state", to_string(job->rec.state)},
              {"run_dir", job->rec.run_dir},
              {"dataset", dataset}};
}

bool JobManager::restore_train_locked(Job& j) {
  const bool active = j.rec.state == JobState::running || j.rec.state == JobState::queued;
  auto cfg = models::parse_job_config(j.rec.config_yaml, j.rec.file, j.rec.overrides);
  if (cfg.is_ok()) {
    j.cfg = std::move(*cfg);
  } else if (active || j.rec.state == JobState::paused) {
    j.rec.state = JobState::failed;
    j.rec.reason = "cannot read the stored job config again: " + cfg.status().message();
    save_locked(j);
  }
  bool resuming = false;
  // As before the split: an active job is queued again even when its config failed above
  // (its reason says why), unlike an inference job.
  if (active) {
    if (j.rec.state == JobState::running) {
      j.rec.reason =
          "resuming after a daemon restart (from epoch " + std::to_string(j.rec.checkpoint_epoch) + ")";
      resuming = true;
    }
    j.rec.state = JobState::queued;
    save_locked(j);
  }
  return resuming;
}

Result<fs::path> JobManager::train_once(Job& j) {
  models::JobConfig cfg;
  actors::RunOptions ro;
  {
    std::lock_guard<std::mutex> lock(mu_);
    cfg = j.cfg;
    cfg.train.device = j.rec.device;
    if (cfg.resolved.is_object() && cfg.resolved.contains("train"))
      cfg.resolved["train"]["device"] = j.rec.device;
    ro.run_dir = fs::path(j.rec.run_dir);
    ro.resume_last = true;
    std::error_code ec;
    if (fs::is_directory(o_.plugin_dir, ec)) ro.plugin_dir = o_.plugin_dir;
    j.started_version = j.rec.dataset.empty() || !version_ ? 0 : version_(j.rec.dataset);
  }
  // run_training (resume_last) drops what an interrupted attempt wrote past last.pt.
  Observer obs(*this, j);
  try {
    return actors::run_training(cfg, ro, obs);
  } catch (const std::exception& e) {
    return internal_error(std::string("training failed with an exception: ") + e.what());
  } catch (...) {
    return internal_error("training failed with an unknown exception");
  }
}

void JobManager::run_train_job(Job* j) {
  for (;;) {
    const Result<fs::path> r = train_once(*j);
    std::lock_guard<std::mutex> lock(mu_);
    if (auto outcome = attempt_outcome(*j, r.status())) {
      end_job_locked(*j, outcome->first, outcome->second);
      return;
    }
    // kReload: the followed dataset changed; go on from the checkpoint just written.
    j->request.store(kNone);
    log::info("job " + std::to_string(j->rec.id) + ": dataset " + j->rec.dataset +
              " changed; continuing from epoch " + std::to_string(j->rec.epoch) + " with its current cases");
    publish_(j->state_topic(), {{"job", j->rec.id},
                                {"state", to_string(j->rec.state)},
                                {"reason", "dataset " + j->rec.dataset + " changed; reloading"},
                                {"epoch", j->rec.epoch},
                                {"epochs", j->rec.epochs},
                                {"device", j->rec.device}});
  }
}

}  // namespace segflow::daemon

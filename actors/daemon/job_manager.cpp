#include "actors/daemon/job_manager.hpp"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <fstream>
#include <thread>

#include "actors/jobs/job_runner.hpp"
#include "messages/log.hpp"
#include "models/inference.hpp"
#include "models/job_config.hpp"
#include "models/trainer.hpp"
#include "pipeline/pipeline_spec.hpp"
#include "pipeline/stage_registry.hpp"

namespace segflow::actors::daemon {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

/// What a running job has been asked to do, by priority (a higher one wins).
enum Request : int { kNone = 0, kReload = 1, kShutdown = 2, kPause = 3, kStop = 4 };

const char* request_name(int r) {
  switch (r) {
    case kReload:
      return "reload";
    case kShutdown:
      return "shutdown";
    case kPause:
      return "pause";
    case kStop:
      return "stop";
    default:
      return "";
  }
}

json number_or_null(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }

/// "cuda" -> "cuda:0"; "auto" stays; everything else as resolved by LibTorch.
std::string device_key(const std::string& text) {
  if (text == "auto") return text;
  auto d = models::resolve_device(text);
  if (!d.is_ok()) return text;
  std::string s = d->str();
  if (s == "cuda") s = "cuda:0";
  return s;
}

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

fs::path absolute_path(const std::string& p) {
  std::error_code ec;
  return fs::absolute(p, ec).lexically_normal();
}

std::string yaml_quoted(const std::string& s) { return json(s).dump(); }

json spec_to_json(const InferJobSpec& s) {
  return {{"checkpoint", s.checkpoint}, {"input", s.input},     {"output", s.output},   {"tta", s.tta},
          {"device", s.device},         {"trigger", s.trigger}, {"dataset", s.dataset}, {"case", s.case_id}};
}

/// The trigger fields of an inference job's events and status (auto_infer only).
void add_trigger(json& body, const InferJobSpec& s) {
  if (s.trigger.empty()) return;
  body["trigger"] = s.trigger;
  body["dataset"] = s.dataset;
  body["case"] = s.case_id;
}

Result<InferJobSpec> spec_from_json(const std::string& text) {
  try {
    const json j = json::parse(text);
    InferJobSpec s;
    s.checkpoint = j.at("checkpoint").get<std::string>();
    s.input = j.at("input").get<std::string>();
    s.output = j.at("output").get<std::string>();
    s.tta = j.value("tta", std::string("none"));
    s.device = j.value("device", std::string("auto"));
    s.trigger = j.value("trigger", std::string());
    s.dataset = j.value("dataset", std::string());
    s.case_id = j.value("case", std::string());
    return s;
  } catch (const std::exception& e) {
    return corrupt_data(std::string("stored inference request: ") + e.what());
  }
}

json infer_output_json(const models::InferResult& r) {
  return {{"case", r.case_id},
          {"output", r.output.string()},
          {"size", {r.size[0], r.size[1], r.size[2]}},
          {"labels", r.labels},
          {"seconds", r.seconds}};
}

}  // namespace

struct JobManager::Job {
  JobRecord rec;
  models::JobConfig cfg;
  InferJobSpec infer;            ///< kind "infer"
  json outputs = json::array();  ///< kind "infer": what the last run wrote
  std::atomic<int> request{kNone};
  std::atomic<bool> now{false};  ///< stop at the next step instead of the next epoch boundary
  bool thread_running = false;   ///< a run_job thread is working on this job
  std::thread thread;
  std::uint64_t started_version = 0;
  std::chrono::steady_clock::time_point last_save{};

  /// Raises the request to at least `r`.
  void raise(int r) {
    int cur = request.load();
    while (cur < r && !request.compare_exchange_weak(cur, r)) {
    }
  }
};

/// The running job's sink on its run's event bus: progress into the record, the database and
/// the event socket (the data path's events too, as "data_event"); should_stop() answers
/// pause, stop, shutdown and dataset reloads.
class JobManager::Observer : public RunSink {
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

  /// Stop right away, or (pause, shutdown, reload) only where an epoch has just ended: the
  /// trainer counts an epoch it leaves early as done, so stopping mid-epoch would skip the
  /// rest of it; at the boundary the resumed run is exactly the uninterrupted one.
  bool should_stop() override {
    const int r = j_.request.load();
    if (r == kNone) return false;
    return r == kStop || j_.now.load() || at_boundary_;
  }

 private:
  std::string topic() const { return "metrics." + std::to_string(j_.rec.id); }
  JobManager& m_;
  Job& j_;
  bool at_boundary_ = false;  // on_epoch_end seen, no step since (only the job thread touches it)
  std::int64_t epoch_samples_ = 0;
  double epoch_seconds_ = 0.0;
};

JobManager::JobManager(JobManagerOptions options, StateDb& db, const pipeline::StageRegistry& registry,
                       PublishFn publish, VersionFn version)
    : o_(std::move(options)),
      db_(db),
      registry_(registry),
      publish_(std::move(publish)),
      version_(std::move(version)) {
  if (!publish_) publish_ = [](const std::string&, const json&) {};
  for (const auto& d : o_.devices) {
    auto r = models::resolve_device(d);
    if (!r.is_ok()) {
      log::warn("devices: " + d + ": " + r.status().message() + " (left out of the pool)");
      continue;
    }
    std::string k = r->str();
    if (k == "cuda") k = "cuda:0";
    if (std::find(pool_.begin(), pool_.end(), k) == pool_.end()) pool_.push_back(k);
  }
  if (pool_.empty()) pool_.push_back("cpu");
}

JobManager::~JobManager() { shutdown(true); }

void JobManager::save_locked(Job& j) {
  j.last_save = std::chrono::steady_clock::now();
  j.rec.updated = StateDb::now();
  Status st = db_.update_job(j.rec);
  if (!st.is_ok()) log::error("job " + std::to_string(j.rec.id) + ": " + st.message());
}

void JobManager::publish_state_locked(const Job& j) {
  json body = {{"job", j.rec.id},        {"kind", j.rec.kind},   {"state", j.rec.state},
               {"reason", j.rec.reason}, {"epoch", j.rec.epoch}, {"epochs", j.rec.epochs},
               {"device", j.rec.device}};
  if (j.rec.kind == "infer") {
    body["output"] = j.infer.output;
    if (!j.outputs.empty()) body["outputs"] = j.outputs;
    add_trigger(body, j.infer);
  }
  publish_("job." + std::to_string(j.rec.id), body);
}

json JobManager::describe_locked(const Job& j) const {
  const auto& r = j.rec;
  json devices = json::array();
  if (!r.device.empty()) devices.push_back(r.device);
  const int req = j.request.load();
  json d = {{"id", r.id},
            {"name", r.name},
            {"kind", r.kind},
            {"state", r.state},
            {"reason", r.reason},
            {"epoch", r.epoch},
            {"epochs", r.epochs},
            {"step", r.step},
            {"loss", number_or_null(r.loss)},
            {"best_dice", r.best_dice >= 0 ? number_or_null(r.best_dice) : json(nullptr)},
            {"samples_per_s", number_or_null(r.samples_per_s)},
            {"devices", devices},
            {"run_dir", r.run_dir},
            {"dataset", r.dataset},
            {"file", r.file},
            {"checkpoint_epoch", r.checkpoint_epoch},
            {"pending", r.state == "running" && req != kNone ? json(request_name(req)) : json(nullptr)},
            {"created", r.created},
            {"updated", r.updated}};
  if (r.kind == "infer") {
    d["checkpoint"] = j.infer.checkpoint;
    d["input"] = j.infer.input;
    d["output"] = j.infer.output;
    d["tta"] = j.infer.tta;
    d["outputs"] = j.outputs;
    add_trigger(d, j.infer);
  }
  return d;
}

Result<JobManager::Job*> JobManager::find_locked(std::int64_t id) const {
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return not_found("job " + std::to_string(id) + ": no such job");
  return it->second.get();
}

Status JobManager::recover() {
  SEGFLOW_ASSIGN_OR_RETURN(auto records, db_.jobs());
  std::lock_guard<std::mutex> lock(mu_);
  int resumed = 0;
  for (auto& rec : records) {
    auto j = std::make_unique<Job>();
    j->rec = std::move(rec);
    const bool active = j->rec.state == "running" || j->rec.state == "queued";
    if (j->rec.kind == "infer") {
      auto spec = spec_from_json(j->rec.config_yaml);
      if (spec.is_ok()) {
        j->infer = std::move(*spec);
      } else if (active || j->rec.state == "paused") {
        j->rec.state = "failed";
        j->rec.reason = spec.status().message();
        save_locked(*j);
      }
      if (j->rec.state == "running" || j->rec.state == "queued") {
        if (j->rec.state == "running") j->rec.reason = "restarting after a daemon restart";
        j->rec.state = "queued";
        j->rec.epoch = 0;
        save_locked(*j);
      }
      jobs_[j->rec.id] = std::move(j);
      continue;
    }
    auto cfg = models::parse_job_config(j->rec.config_yaml, j->rec.file, j->rec.overrides);
    if (cfg.is_ok()) {
      j->cfg = std::move(*cfg);
    } else if (active || j->rec.state == "paused") {
      j->rec.state = "failed";
      j->rec.reason = "cannot read the stored job config again: " + cfg.status().message();
      save_locked(*j);
    }
    if (active) {
      if (j->rec.state == "running") {
        j->rec.reason =
            "resuming after a daemon restart (from epoch " + std::to_string(j->rec.checkpoint_epoch) + ")";
        ++resumed;
      }
      j->rec.state = "queued";
      save_locked(*j);
    }
    jobs_[j->rec.id] = std::move(j);
  }
  if (!jobs_.empty())
    log::info("jobs: " + std::to_string(jobs_.size()) + " stored, " + std::to_string(resumed) +
              " resuming after a restart");
  schedule_locked();
  return Status::ok();
}

Result<json> JobManager::submit(const std::string& yaml, const std::string& file,
                                const std::vector<std::string>& overrides) {
  // The whole config, typed and built (stages, model, loss, optimizer), before a job exists.
  SEGFLOW_ASSIGN_OR_RETURN(models::JobConfig cfg, models::parse_job_config(yaml, file, overrides));
  SEGFLOW_RETURN_IF_ERROR(models::validate_job_config(cfg, registry_));
  if (cfg.train.device != "auto") {
    auto d = models::resolve_device(cfg.train.device);
    if (!d.is_ok()) return invalid_config(file + ": train.device: " + d.status().message());
  }
  std::error_code ec;
  std::vector<std::string> stored = overrides;
  // Paths become absolute, so the job means the same thing whatever the daemon's folder.
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

  const fs::path runs_root =
      names_runs_dir(yaml, overrides) ? absolute_path(cfg.runs_dir) : o_.state_dir / "runs";
  std::string dataset;
  {
    const fs::path root = fs::weakly_canonical(cfg.data.root, ec);
    const fs::path data = fs::weakly_canonical(o_.data_root, ec);
    if (!ec && root.parent_path() == data) dataset = root.filename().string();
  }
  JobRecord rec;
  rec.name = cfg.name;
  rec.file = file;
  rec.config_yaml = yaml;
  rec.overrides = stored;
  rec.state = "queued";
  rec.dataset = dataset;
  rec.epochs = cfg.train.epochs;
  rec.loss = std::nan("");
  rec.created = rec.updated = StateDb::now();

  std::lock_guard<std::mutex> lock(mu_);
  if (shutting_down_) return invalid_argument("the daemon is shutting down");
  SEGFLOW_ASSIGN_OR_RETURN(rec.id, db_.insert_job(rec));
  rec.run_dir = (runs_root / ("job" + std::to_string(rec.id) + "-" + models::run_name(cfg))).string();
  auto j = std::make_unique<Job>();
  j->rec = rec;
  j->cfg = std::move(cfg);
  Job& job = *j;
  jobs_[rec.id] = std::move(j);
  save_locked(job);
  log::info("job " + std::to_string(rec.id) + " (" + rec.name + ") queued; run folder " + rec.run_dir +
            (dataset.empty() ? "" : "; follows dataset " + dataset));
  publish_state_locked(job);
  schedule_locked();
  return json{{"job", rec.id}, {"state", job.rec.state}, {"run_dir", job.rec.run_dir}, {"dataset", dataset}};
}

Result<json> JobManager::submit_infer(InferJobSpec spec) {
  // Everything checked before a job exists; each error names its field.
  if (spec.checkpoint.empty()) return invalid_argument("checkpoint: missing (a best.pt or last.pt of a run)");
  if (spec.input.empty()) return invalid_argument("input: missing (a scan, a folder of scans or a dataset)");
  if (spec.output.empty()) return invalid_argument("output: missing (a label map file or a folder)");
  spec.checkpoint = absolute_path(spec.checkpoint).string();
  spec.input = absolute_path(spec.input).string();
  spec.output = absolute_path(spec.output).string();
  if (spec.tta.empty()) spec.tta = "none";
  if (spec.device.empty()) spec.device = "auto";
  auto tta = models::parse_tta(spec.tta);
  if (!tta.is_ok()) return invalid_argument("tta: " + tta.status().message());
  if (spec.device != "auto") {
    auto d = models::resolve_device(spec.device);
    if (!d.is_ok()) return invalid_argument("device: " + d.status().message());
  }
  std::error_code ec;
  if (!fs::is_regular_file(spec.checkpoint, ec))
    return not_found("checkpoint: " + spec.checkpoint + ": no such file");
  {
    auto model = models::load_for_inference(spec.checkpoint, "cpu");
    if (!model.is_ok())
      return invalid_argument("checkpoint: " + spec.checkpoint +
                              ": cannot be loaded: " + model.status().message());
  }
  if (!fs::exists(spec.input, ec)) return not_found("input: " + spec.input + ": no such file or folder");
  const bool single = models::is_single_scan(spec.input);
  if (!single) {
    auto cases = models::list_inference_cases(spec.input);
    if (!cases.is_ok()) return invalid_argument("input: " + cases.status().message());
    if (cases->empty()) return invalid_argument("input: " + spec.input + ": expected scans, found none");
  }
  // An existing folder takes the output; else the output's folder must exist (a batch creates its folder).
  const fs::path out_dir =
      fs::is_directory(spec.output, ec) ? fs::path(spec.output) : fs::path(spec.output).parent_path();
  if (!fs::is_directory(out_dir, ec))
    return not_found("output: " + spec.output + ": its folder " + out_dir.string() + " does not exist");
  if (!single && fs::exists(spec.output, ec) && !fs::is_directory(spec.output, ec))
    return invalid_argument("output: " + spec.output +
                            ": expected a folder for a folder or dataset input, got a file");

  JobRecord rec;
  rec.kind = "infer";
  rec.name = "infer " + fs::path(spec.input).filename().string();
  rec.file = spec.checkpoint;
  rec.config_yaml = spec_to_json(spec).dump();
  rec.state = "queued";
  rec.run_dir = spec.output;
  rec.loss = std::nan("");
  rec.created = rec.updated = StateDb::now();

  std::lock_guard<std::mutex> lock(mu_);
  if (shutting_down_) return invalid_argument("the daemon is shutting down");
  SEGFLOW_ASSIGN_OR_RETURN(rec.id, db_.insert_job(rec));
  auto j = std::make_unique<Job>();
  j->rec = rec;
  j->infer = std::move(spec);
  Job& job = *j;
  jobs_[rec.id] = std::move(j);
  log::info("job " + std::to_string(rec.id) + " (" + rec.name + ") queued; output " + job.infer.output);
  publish_state_locked(job);
  schedule_locked();
  json reply = {{"job", rec.id}, {"state", job.rec.state}, {"kind", "infer"}, {"output", job.infer.output}};
  add_trigger(reply, job.infer);
  return reply;
}

bool JobManager::infer_submitted(const std::string& output, double since) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [id, j] : jobs_) {
    if (j->rec.kind != "infer" || j->infer.output != output) continue;
    const std::string& st = j->rec.state;
    if (st == "queued" || st == "running" || st == "paused" || j->rec.created >= since) return true;
  }
  return false;
}

std::string JobManager::wanted_device_locked(const Job& j) const {
  return device_key(j.rec.kind == "infer" ? j.infer.device : j.cfg.train.device);
}

void JobManager::run_infer_job(Job* j) {
  models::InferOptions io;
  bool single = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    io.checkpoint = j->infer.checkpoint;
    io.input = j->infer.input;
    io.output = j->infer.output;
    io.device = j->rec.device;
    auto tta = models::parse_tta(j->infer.tta);
    if (tta.is_ok()) io.tta = *tta;
    single = models::is_single_scan(io.input);
    j->outputs = json::array();
    j->rec.epoch = 0;
    j->rec.epochs = single ? 1 : 0;
  }
  const std::string topic = "metrics." + std::to_string(j->rec.id);
  json outputs = json::array(), failed = json::array();
  Status st = Status::ok();
  try {
    if (single) {
      auto r = models::run_inference(io);
      if (r.is_ok())
        outputs.push_back(infer_output_json(*r));
      else
        st = r.status();
    } else {
      auto progress = [&](const models::InferProgress& p) {
        std::lock_guard<std::mutex> lock(mu_);
        j->rec.epochs = static_cast<std::int64_t>(p.total);
        json body = {{"job", j->rec.id}, {"type", "case"},   {"case", p.case_id},
                     {"index", p.index}, {"total", p.total}, {"done", p.done}};
        if (p.done) {
          j->rec.epoch = static_cast<std::int64_t>(p.index + 1);
          body["seconds"] = p.seconds;
          if (!p.error.empty()) body["error"] = p.error;
          if (!p.output.empty()) body["output"] = p.output.string();
          save_locked(*j);
        }
        publish_(topic, body);
      };
      auto r = models::run_inference_batch(io, progress);
      if (r.is_ok()) {
        for (const auto& o : r->outputs) outputs.push_back(infer_output_json(o));
        for (const auto& [id, why] : r->failed) failed.push_back({{"case", id}, {"error", why}});
        if (outputs.empty() && !failed.empty())
          st = internal_error("every case failed; first: " + r->failed.front().first + ": " +
                              r->failed.front().second);
      } else {
        st = r.status();
      }
    }
  } catch (const std::exception& e) {
    st = internal_error(std::string("inference failed with an exception: ") + e.what());
  } catch (...) {
    st = internal_error("inference failed with an unknown exception");
  }
  std::lock_guard<std::mutex> lock(mu_);
  j->outputs = outputs;
  if (!st.is_ok()) {
    end_job_locked(*j, "failed", st.message());
    return;
  }
  j->rec.epoch = j->rec.epochs = static_cast<std::int64_t>(outputs.size() + failed.size());
  std::string reason = std::to_string(outputs.size()) + " label map(s) written to " + j->infer.output;
  if (!failed.empty())
    reason += "; " + std::to_string(failed.size()) + " case(s) failed, first " +
              failed[0]["case"].get<std::string>() + ": " + failed[0]["error"].get<std::string>();
  end_job_locked(*j, "completed", reason);
}

void JobManager::end_job_locked(Job& j, const std::string& state, const std::string& reason) {
  j.rec.state = state;
  j.rec.reason = reason;
  j.request.store(kNone);
  j.now.store(false);
  j.thread_running = false;
  busy_.erase(j.rec.device);
  done_.notify_all();
  save_locked(j);
  publish_state_locked(j);
  if (state == "failed")
    log::error("job " + std::to_string(j.rec.id) + " failed: " + reason);
  else
    log::info("job " + std::to_string(j.rec.id) + " " + state + (reason.empty() ? "" : ": " + reason));
  schedule_locked();
}

void JobManager::schedule_locked() {
  if (shutting_down_) return;
  for (auto& [id, j] : jobs_) {
    if (j->rec.state != "queued") continue;
    std::string want = wanted_device_locked(*j), device;
    if (want == "auto") {
      // Prefer the device the job ran on before (its checkpoint was written there).
      if (!j->rec.device.empty() && std::find(pool_.begin(), pool_.end(), j->rec.device) != pool_.end() &&
          !busy_.count(j->rec.device))
        device = j->rec.device;
      for (const auto& d : pool_)
        if (device.empty() && !busy_.count(d)) device = d;
    } else if (!busy_.count(want)) {
      device = want;
    }
    if (!device.empty()) start_locked(*j, device);
  }
}

void JobManager::start_locked(Job& j, const std::string& device) {
  if (j.thread.joinable()) j.thread.join();  // the previous run's thread has already finished
  busy_[device] = j.rec.id;
  j.rec.device = device;
  j.rec.state = "running";
  if (j.rec.reason.rfind("resuming", 0) != 0) j.rec.reason.clear();
  j.request.store(kNone);
  j.now.store(false);
  j.thread_running = true;
  save_locked(j);
  publish_state_locked(j);
  log::info("job " + std::to_string(j.rec.id) + " (" + j.rec.name + ") running on " + device);
  j.thread = std::thread(&JobManager::run_job, this, &j);
}

void JobManager::run_job(Job* j) {
  if (j->rec.kind == "infer") {
    run_infer_job(j);
    return;
  }
  for (;;) {
    models::JobConfig cfg;
    RunOptions ro;
    {
      std::lock_guard<std::mutex> lock(mu_);
      cfg = j->cfg;
      cfg.train.device = j->rec.device;
      if (cfg.resolved.is_object() && cfg.resolved.contains("train"))
        cfg.resolved["train"]["device"] = j->rec.device;
      ro.run_dir = fs::path(j->rec.run_dir);
      ro.resume_last = true;
      std::error_code ec;
      if (fs::is_directory(o_.plugin_dir, ec)) ro.plugin_dir = o_.plugin_dir;
      j->started_version = j->rec.dataset.empty() || !version_ ? 0 : version_(j->rec.dataset);
    }
    // run_training (resume_last) drops what an interrupted attempt wrote past last.pt.
    Result<fs::path> r = internal_error("not run");
    {
      Observer obs(*this, *j);
      try {
        r = run_training(cfg, ro, obs);
      } catch (const std::exception& e) {
        r = internal_error(std::string("training failed with an exception: ") + e.what());
      } catch (...) {
        r = internal_error("training failed with an unknown exception");
      }
    }
    std::lock_guard<std::mutex> lock(mu_);
    const int req = j->request.load();
    std::string state, reason;
    if (!r.is_ok()) {
      state = "failed";
      reason = r.status().message();
    } else if (j->rec.epoch >= j->rec.epochs || req == kNone) {
      state = "completed";
      j->rec.epoch = std::max(j->rec.epoch, j->rec.epochs);
    } else if (req == kStop) {
      state = "stopped";
      reason = "stopped at epoch " + std::to_string(j->rec.epoch) + " (checkpoint written)";
    } else if (req == kPause) {
      state = "paused";
      reason = "paused at epoch " + std::to_string(j->rec.epoch) + " (checkpoint written)";
    } else if (req == kShutdown) {
      state = "queued";
      reason = "daemon shut down at epoch " + std::to_string(j->rec.epoch) +
               "; resumes when segflowd starts again";
    } else {  // kReload: the followed dataset changed; go on from the checkpoint just written
      j->request.store(kNone);
      log::info("job " + std::to_string(j->rec.id) + ": dataset " + j->rec.dataset +
                " changed; continuing from epoch " + std::to_string(j->rec.epoch) +
                " with its current cases");
      publish_("job." + std::to_string(j->rec.id),
               {{"job", j->rec.id},
                {"state", j->rec.state},
                {"reason", "dataset " + j->rec.dataset + " changed; reloading"},
                {"epoch", j->rec.epoch},
                {"epochs", j->rec.epochs},
                {"device", j->rec.device}});
      continue;
    }
    end_job_locked(*j, state, reason);
    return;
  }
}

Result<json> JobManager::stop(std::int64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  SEGFLOW_ASSIGN_OR_RETURN(Job * j, find_locked(id));
  const std::string& s = j->rec.state;
  if (s == "running" && j->rec.kind == "infer")
    return invalid_argument("job " + std::to_string(id) + " is a running inference job; it runs to its end");
  if (s == "running") {
    j->raise(kStop);
    return json{{"job", id}, {"state", s}, {"pending", "stop"}};
  }
  if (s == "queued" || s == "paused") {
    j->rec.state = "stopped";
    j->rec.reason = "stopped while " + s;
    save_locked(*j);
    publish_state_locked(*j);
    return json{{"job", id}, {"state", j->rec.state}};
  }
  return invalid_argument("job " + std::to_string(id) + " is " + s +
                          "; stop needs a queued, running or paused job");
}

Result<json> JobManager::pause(std::int64_t id, bool now) {
  std::lock_guard<std::mutex> lock(mu_);
  SEGFLOW_ASSIGN_OR_RETURN(Job * j, find_locked(id));
  const std::string& s = j->rec.state;
  if (s == "running" && j->rec.kind == "infer")
    return invalid_argument("job " + std::to_string(id) + " is a running inference job; it runs to its end");
  if (s == "running") {
    j->raise(kPause);
    if (now) j->now.store(true);
    return json{{"job", id}, {"state", s}, {"pending", request_name(j->request.load())}};
  }
  if (s == "queued") {
    j->rec.state = "paused";
    j->rec.reason = "paused while queued";
    save_locked(*j);
    publish_state_locked(*j);
    return json{{"job", id}, {"state", j->rec.state}};
  }
  return invalid_argument("job " + std::to_string(id) + " is " + s + "; pause needs a queued or running job");
}

Result<json> JobManager::resume(std::int64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  SEGFLOW_ASSIGN_OR_RETURN(Job * j, find_locked(id));
  const std::string& s = j->rec.state;
  if (s == "running" && j->request.load() == kPause && !j->now.load()) {
    int expected = kPause;
    j->request.compare_exchange_strong(expected, kNone);  // the pause has not happened yet: cancel it
    return json{{"job", id}, {"state", s}};
  }
  if (s != "paused")
    return invalid_argument("job " + std::to_string(id) + " is " + s + "; resume needs a paused job");
  if (shutting_down_) return invalid_argument("the daemon is shutting down");
  j->rec.state = "queued";
  j->rec.reason = "resumed; waiting for a device";
  save_locked(*j);
  publish_state_locked(*j);
  schedule_locked();
  return json{{"job", id}, {"state", j->rec.state}};
}

Result<json> JobManager::status(std::int64_t id) const {
  std::lock_guard<std::mutex> lock(mu_);
  SEGFLOW_ASSIGN_OR_RETURN(Job * j, find_locked(id));
  return describe_locked(*j);
}

json JobManager::status_all() const {
  std::lock_guard<std::mutex> lock(mu_);
  json out = json::array();
  for (const auto& [id, j] : jobs_) out.push_back(describe_locked(*j));
  return out;
}

void JobManager::shutdown(bool now, const std::function<bool()>& hurry) {
  std::vector<std::thread> threads;
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (!shutting_down_) {
      shutting_down_ = true;
      for (auto& [id, j] : jobs_)
        if (j->rec.state == "running") j->raise(kShutdown);
    }
    auto running = [&] {
      std::size_t n = 0;
      for (auto& [id, j] : jobs_) n += j->thread_running ? 1 : 0;
      return n;
    };
    if (running() > 0)
      log::info("jobs: " + std::to_string(running()) + " running job(s) stop at the end of their epoch" +
                (now ? " (now: at the next step)" : ""));
    bool hurried = false;
    while (running() > 0) {
      if (!hurried && (now || (hurry && hurry()))) {
        hurried = true;
        for (auto& [id, j] : jobs_)
          if (j->thread_running) j->now.store(true);
      }
      done_.wait_for(lock, std::chrono::milliseconds(200));
    }
    for (auto& [id, j] : jobs_)
      if (j->thread.joinable()) threads.push_back(std::move(j->thread));
  }
  for (auto& t : threads) t.join();
}

}  // namespace segflow::actors::daemon

#include "daemon/job_manager.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <thread>

#include "daemon/detail/job.hpp"
#include "messages/log.hpp"
#include "models/training/trainer.hpp"

namespace segflow::daemon {

using detail::kNone;
using detail::kPause;
using detail::kShutdown;
using detail::kStop;
using detail::number_or_null;
using detail::request_name;
using nlohmann::json;

namespace {

/// "cuda" -> "cuda:0"; "auto" stays; everything else as resolved by LibTorch.
std::string device_key(const std::string& text) {
  if (text == "auto") return text;
  auto d = models::resolve_device(text);
  if (!d.is_ok()) return text;
  std::string s = d->str();
  if (s == "cuda") s = "cuda:0";
  return s;
}

std::string job_text(std::int64_t id) { return "job " + std::to_string(id); }

Status runs_to_end_error(std::int64_t id, JobKind kind) {
  return invalid_argument(job_text(id) + " is a running " +
                          (kind == JobKind::infer ? std::string("inference") : to_string(kind)) +
                          " job; it runs to its end");
}

}  // namespace

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
  if (!st.is_ok()) log::error(job_text(j.rec.id) + ": " + st.message());
}

void JobManager::publish_state_locked(const Job& j) {
  json body = {{"job", j.rec.id},        {"kind", to_string(j.rec.kind)}, {"state", to_string(j.rec.state)},
               {"reason", j.rec.reason}, {"epoch", j.rec.epoch},          {"epochs", j.rec.epochs},
               {"device", j.rec.device}};
  if (j.is_infer()) detail::add_infer_event_fields(j, body);
  if (j.is_plan()) detail::add_plan_fields(j, body);
  publish_(j.state_topic(), body);
}

json JobManager::describe_locked(const Job& j) const {
  const auto& r = j.rec;
  json devices = json::array();
  if (!r.device.empty()) devices.push_back(r.device);
  const int req = j.request.load();
  json d = {
      {"id", r.id},
      {"name", r.name},
      {"kind", to_string(r.kind)},
      {"state", to_string(r.state)},
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
      {"pending", r.state == JobState::running && req != kNone ? json(request_name(req)) : json(nullptr)},
      {"created", r.created},
      {"updated", r.updated}};
  if (j.is_infer()) detail::add_infer_status_fields(j, d);
  if (j.is_plan()) detail::add_plan_fields(j, d);
  return d;
}

Result<JobManager::Job*> JobManager::find_locked(std::int64_t id) const {
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return not_found(job_text(id) + ": no such job");
  return it->second.get();
}

Result<JobManager::Job*> JobManager::insert_locked(JobRecord rec) {
  if (shutting_down_) return invalid_argument("the daemon is shutting down");
  SEGFLOW_ASSIGN_OR_RETURN(rec.id, db_.insert_job(rec));
  auto j = std::make_unique<Job>();
  j->rec = std::move(rec);
  Job* job = j.get();
  jobs_[job->rec.id] = std::move(j);
  return job;
}

Status JobManager::recover() {
  SEGFLOW_ASSIGN_OR_RETURN(auto records, db_.jobs());
  std::lock_guard<std::mutex> lock(mu_);
  int resumed = 0;
  for (auto& rec : records) {
    auto j = std::make_unique<Job>();
    j->rec = std::move(rec);
    if (j->is_infer())
      restore_infer_locked(*j);
    else if (j->is_plan())
      restore_plan_locked(*j);
    else if (restore_train_locked(*j))
      ++resumed;
    jobs_[j->rec.id] = std::move(j);
  }
  if (!jobs_.empty())
    log::info("jobs: " + std::to_string(jobs_.size()) + " stored, " + std::to_string(resumed) +
              " resuming after a restart");
  schedule_locked();
  return Status::ok();
}

bool JobManager::infer_submitted(const std::string& output, double since) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [id, j] : jobs_) {
    if (!j->is_infer() || j->infer.request.options.output.string() != output) continue;
    if (!is_final(j->rec.state) || j->rec.created >= since) return true;
  }
  return false;
}

std::int64_t JobManager::infer_job_since(const std::string& output, double since) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::int64_t newest = 0;
  for (const auto& [id, j] : jobs_)
    if (j->is_infer() && j->infer.request.options.output.string() == output && j->rec.created >= since)
      newest = std::max(newest, id);
  return newest;
}

std::string JobManager::wanted_device_locked(const Job& j) const {
  return device_key(j.is_infer()  ? j.infer.request.options.device
                    : j.is_plan() ? j.plan.device
                                  : j.cfg.train.device);
}

void JobManager::end_job_locked(Job& j, JobState state, const std::string& reason, ErrorCode error) {
  j.rec.state = state;
  j.rec.reason = reason;
  j.rec.error = state == JobState::failed ? error : ErrorCode::ok;
  j.request.store(kNone);
  j.now.store(false);
  j.thread_running = false;
  busy_.erase(j.rec.device);
  done_.notify_all();
  save_locked(j);
  publish_state_locked(j);
  if (state == JobState::failed)
    log::error(job_text(j.rec.id) + " failed: " + reason);
  else
    log::info(job_text(j.rec.id) + " " + to_string(state) + (reason.empty() ? "" : ": " + reason));
  schedule_locked();
}

void JobManager::schedule_locked() {
  if (shutting_down_) return;
  for (auto& [id, j] : jobs_) {
    if (j->rec.state != JobState::queued) continue;
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
  j.rec.state = JobState::running;
  if (j.rec.reason.rfind("resuming", 0) != 0) j.rec.reason.clear();
  j.request.store(kNone);
  j.now.store(false);
  j.thread_running = true;
  save_locked(j);
  publish_state_locked(j);
  log::info(job_text(j.rec.id) + " (" + j.rec.name + ") running on " + device);
  j.thread = std::thread(&JobManager::run_job, this, &j);
}

void JobManager::run_job(Job* j) {
  if (j->is_infer())
    run_infer_job(j);
  else if (j->is_plan())
    run_plan_job(j);
  else
    run_train_job(j);
}

Result<json> JobManager::stop(std::int64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  SEGFLOW_ASSIGN_OR_RETURN(Job * j, find_locked(id));
  const JobState s = j->rec.state;
  if (s == JobState::running && j->runs_to_end()) return runs_to_end_error(id, j->rec.kind);
  if (s == JobState::running) {
    j->raise(kStop);
    return json{{"job", id}, {"state", to_string(s)}, {"pending", "stop"}};
  }
  if (s == JobState::queued || s == JobState::paused) {
    j->rec.state = JobState::stopped;
    j->rec.reason = std::string("stopped while ") + to_string(s);
    save_locked(*j);
    publish_state_locked(*j);
    return json{{"job", id}, {"state", to_string(j->rec.state)}};
  }
  return invalid_argument(job_text(id) + " is " + to_string(s) +
                          "; stop needs a queued, running or paused job");
}

Result<json> JobManager::pause(std::int64_t id, bool now) {
  std::lock_guard<std::mutex> lock(mu_);
  SEGFLOW_ASSIGN_OR_RETURN(Job * j, find_locked(id));
  const JobState s = j->rec.state;
  if (s == JobState::running && j->runs_to_end()) return runs_to_end_error(id, j->rec.kind);
  if (s == JobState::running) {
    j->raise(kPause);
    if (now) j->now.store(true);
    return json{{"job", id}, {"state", to_string(s)}, {"pending", request_name(j->request.load())}};
  }
  if (s == JobState::queued) {
    j->rec.state = JobState::paused;
    j->rec.reason = "paused while queued";
    save_locked(*j);
    publish_state_locked(*j);
    return json{{"job", id}, {"state", to_string(j->rec.state)}};
  }
  return invalid_argument(job_text(id) + " is " + to_string(s) + "; pause needs a queued or running job");
}

Result<json> JobManager::resume(std::int64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  SEGFLOW_ASSIGN_OR_RETURN(Job * j, find_locked(id));
  const JobState s = j->rec.state;
  if (s == JobState::running && j->request.load() == kPause && !j->now.load()) {
    int expected = kPause;
    j->request.compare_exchange_strong(expected, kNone);  // the pause has not happened yet: cancel it
    return json{{"job", id}, {"state", to_string(s)}};
  }
  if (s != JobState::paused)
    return invalid_argument(job_text(id) + " is " + to_string(s) + "; resume needs a paused job");
  if (shutting_down_) return invalid_argument("the daemon is shutting down");
  j->rec.state = JobState::queued;
  j->rec.reason = "resumed; waiting for a device";
  save_locked(*j);
  publish_state_locked(*j);
  schedule_locked();
  return json{{"job", id}, {"state", to_string(j->rec.state)}};
}

Result<json> JobManager::status(std::int64_t id) const {
  std::lock_guard<std::mutex> lock(mu_);
  SEGFLOW_ASSIGN_OR_RETURN(Job * j, find_locked(id));
  return describe_locked(*j);
}

Result<JobRecord> JobManager::record(std::int64_t id) const {
  std::lock_guard<std::mutex> lock(mu_);
  SEGFLOW_ASSIGN_OR_RETURN(Job * j, find_locked(id));
  return j->rec;
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
        if (j->rec.state == JobState::running) j->raise(kShutdown);
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

}  // namespace segflow::daemon

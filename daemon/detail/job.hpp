#pragma once
// The job manager's private parts, shared by its three source files: job_manager.cpp (the
// queue and the state machine), training_job.cpp and inference_job.cpp. Every member of a
// Job but the atomics is guarded by JobManager::mu_.

#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <string>
#include <thread>

#include "daemon/job_manager.hpp"
#include "daemon/state_db.hpp"
#include "models/training/job_config.hpp"

namespace segflow::daemon::detail {

/// What a running job has been asked to do, by priority (a higher one wins).
enum Request : int { kNone = 0, kReload = 1, kShutdown = 2, kPause = 3, kStop = 4 };

/// "reload", "shutdown", "pause", "stop" (the `pending` of a status); "" for kNone.
inline const char* request_name(int r) {
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

/// One job: its record, its typed config (train) or request (infer), and its worker.
struct Job {
  JobRecord rec;
  models::JobConfig cfg;                             ///< kind train
  InferJobSpec infer;                                ///< kind infer
  nlohmann::json outputs = nlohmann::json::array();  ///< kind infer: what the last run wrote
  PlanJobSpec plan;                                  ///< kind plan
  nlohmann::json planned =
      nlohmann::json::object();  ///< kind plan: plan_dir, configurations, ... once planned
  std::atomic<int> request{kNone};
  std::atomic<bool> now{false};  ///< stop at the next step instead of the next epoch boundary
  bool thread_running = false;   ///< a worker thread is working on this job
  std::thread thread;
  std::uint64_t started_version = 0;
  std::chrono::steady_clock::time_point last_save{};

  bool is_infer() const { return rec.kind == JobKind::infer; }
  bool is_plan() const { return rec.kind == JobKind::plan; }
  /// Inference and plan jobs run to their end once started (stop and pause act while queued).
  bool runs_to_end() const { return rec.kind != JobKind::train; }
  /// "job.<id>" (state events) and "metrics.<id>" (progress).
  std::string state_topic() const { return "job." + std::to_string(rec.id); }
  std::string metrics_topic() const { return "metrics." + std::to_string(rec.id); }

  /// Raises the request to at least `r`.
  void raise(int r) {
    int cur = request.load();
    while (cur < r && !request.compare_exchange_weak(cur, r)) {
    }
  }
};

/// `v`, or null when it is NaN or infinite (JSON has neither).
inline nlohmann::json number_or_null(double v) {
  return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr);
}

/// `p` made absolute against the daemon's working folder, normalized.
inline std::filesystem::path absolute_path(const std::string& p) {
  std::error_code ec;
  return std::filesystem::absolute(p, ec).lexically_normal();
}

/// The dataset a job follows: `job_root`'s name when it is a folder of `data_root`, else "".
inline std::string followed_dataset(const std::string& job_root, const std::filesystem::path& data_root) {
  std::error_code ec;
  const std::filesystem::path root = std::filesystem::weakly_canonical(job_root, ec);
  const std::filesystem::path data = std::filesystem::weakly_canonical(data_root, ec);
  if (!ec && root.parent_path() == data) return root.filename().string();
  return "";
}

/// The plan fields of a state event and a status: dataset_path, plan_dir, train, trigger and,
/// once planned, configurations, excluded, reused, train_jobs (plan_job.cpp).
void add_plan_fields(const Job& j, nlohmann::json& body);

/// The inference fields of a state event: output, outputs once written, trigger (inference_job.cpp).
void add_infer_event_fields(const Job& j, nlohmann::json& body);
/// The inference fields of a status: checkpoint, input, output, tta, outputs, trigger.
void add_infer_status_fields(const Job& j, nlohmann::json& body);

}  // namespace segflow::daemon::detail

#pragma once
// The daemon's jobs: submission (validated before anything changes), a queue per device
// (one running job per device), a dedicated thread per running job driving
// actors::run_training, and the state machine (JobState, job_state.hpp)
//
// clang-format off
//   queued ──> running ──> completed | failed (with the reason)
//     │  ▲        │ pause          (stop from queued, running or paused ──> stopped)
//     │  └resume─ paused <─┘
//     └─ pause ──> paused
// clang-format on
//
// Every change is written to the state database first and then published on the event
// socket (topic "job.<id>"); progress (steps, epochs, validations, checkpoints, skipped
// cases) is published as "metrics.<id>". Pause, stop and shutdown make the job's observer
// answer should_stop(), so the trainer writes last.pt before the thread ends. Stop acts at
// the next step; pause and shutdown at the end of the current epoch (or the next step when
// asked "now"), because the trainer counts an epoch it leaves early as done.
//
// Recovery: jobs found running or queued in the database (a crash, kill -9 or shutdown)
// are queued again and resume from their run folder's last.pt (RunOptions.resume_last with
// the stored run_dir); metrics.jsonl records of epochs the checkpoint does not hold are
// dropped first, so a resumed run repeats no finished epoch in its history.
//
// Datasets: a job whose data.root is a folder of data_root follows that dataset. When its
// usable cases change, the job stops at the end of the current epoch (checkpoint written)
// and restarts from it at once, so new cases join from the next epoch (run_training reads
// the folder again at each start).
//
// Sources: job_manager.cpp (queue, states, requests), training_job.cpp (submit, the
// training worker and its observer), inference_job.cpp (submit_infer, the inference worker),
// plan_job.cpp (submit_plan, the planning worker and the training jobs it queues).
//
// Threading: every public method is thread-safe (one mutex; the database and the publish
// function are called with it held, never the other way round).

#include <nlohmann/json.hpp>

#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "daemon/job_state.hpp"
#include "daemon/state_db.hpp"
#include "messages/status.hpp"
#include "models/inference/infer_request.hpp"

namespace segflow::pipeline {
class StageRegistry;
}

namespace segflow::daemon {

namespace detail {
struct Job;
}

/// Publishes one event: topic ("job.3", "metrics.3") and a JSON body. Must be thread-safe.
using PublishFn = std::function<void(const std::string& topic, const nlohmann::json& body)>;
/// The change counter of a dataset (DatasetWatcher::version).
using VersionFn = std::function<std::uint64_t(const std::string& dataset)>;

/// An inference job (`segflow ctl infer`, auto_infer): the request (models/inference/infer_request.hpp:
/// every option of `segflow infer`), run by models::run_inference on one scan, run_inference_batch on a
/// folder or dataset, or run_box_inference with box prompts. Paths are absolute once submitted.
struct InferJobSpec {
  models::InferRequest request;
  std::string trigger;  ///< "" (ctl infer) or "auto_infer" (a new case of a watched dataset)
  std::string dataset;  ///< auto_infer: the dataset of the case
  std::string case_id;  ///< auto_infer: the case
};

/// A plan job (`segflow ctl plan`, `ctl train DATASET`, auto_train): models::planning on a
/// dataset folder into a plan folder; with `train` set, then one training job per fold of
/// that configuration's YAML (its run folder gets a copy of the plan in plan/). Paths are
/// absolute once submitted.
struct PlanJobSpec {
  std::string dataset;                      ///< the dataset folder (a name: a folder of data_root)
  std::string out;                          ///< the plan folder; "" = <dataset>/.segflow-plans
  std::vector<std::string> configurations;  ///< planned (without train): 2d, 3d_fullres, 3d_lowres; [] = all
  double memory_gb = 0;                     ///< the plan's memory target, GB; 0 = the planner's (8)
  std::string memory_model;                 ///< nnunet | measured; "" = the planner's (measured)
  std::string preset;                       ///< default | resenc-m | resenc-l | resenc-xl; "" = default
  std::string device = "auto";              ///< where the plan's trials run: a device of the pool or auto
  std::string train;                        ///< configuration to train after planning; "" = plan only
  std::vector<std::int64_t> folds;          ///< with train: folds to train ([] with all_folds: every fold)
  bool all_folds = false;                   ///< with train: every fold of the plan (data.folds)
  std::vector<std::string> overrides;       ///< with train: --set key=value of the training jobs
  std::string trigger;                      ///< "" (ctl) or "auto_train"
  std::string signature;                    ///< auto_train: pipeline::dataset_signature at submission
};

/// Where jobs live and run.
struct JobManagerOptions {
  std::filesystem::path state_dir;   ///< run folders go to state_dir/runs by default
  std::filesystem::path data_root;   ///< datasets that jobs may follow
  std::filesystem::path plugin_dir;  ///< passed to run_training when it exists
  std::vector<std::string> devices;  ///< pool for jobs with device auto
};

class JobManager {
 public:
  JobManager(JobManagerOptions options, StateDb& db, const pipeline::StageRegistry& registry,
             PublishFn publish, VersionFn version);
  ~JobManager();
  JobManager(const JobManager&) = delete;
  JobManager& operator=(const JobManager&) = delete;

  /// Loads the stored jobs; those that were running or queued are queued to resume.
  Status recover();

  /// Validates and queues a job: the config is parsed (with overrides), its pipeline built,
  /// its device and data checked. On error nothing is stored. Returns {job, state, run_dir,
  /// dataset}.
  /// With `plan_yaml` (a plan folder's YAML, what `yaml` was read from), its YAML, plans.json
  /// and fingerprint.json are copied into RUN/plan/.
  Result<nlohmann::json> submit(const std::string& yaml, const std::string& file,
                                const std::vector<std::string>& overrides,
                                const std::filesystem::path& plan_yaml = {});
  /// Validates and queues an inference job beside the training jobs (same ids, queue,
  /// devices, states and events; kind "infer"): the checkpoint must load, the input hold at
  /// least one scan, the output's folder exist, tta and device parse. Errors name the field;
  /// on error nothing is stored. Returns {job, state, kind, output}. A running inference job
  /// runs to its end (stop and pause act on it only while it is queued).
  Result<nlohmann::json> submit_infer(InferJobSpec spec);
  /// Validates and queues a plan job (kind "plan", beside the others: same ids, queue, devices,
  /// states and events): the dataset must be a folder, configurations, memory model, device
  /// and folds parse. Errors name the field; on error nothing is stored. Returns {job, state,
  /// kind, dataset, plan_dir}. A running plan job runs to its end (plan_job.cpp).
  Result<nlohmann::json> submit_plan(PlanJobSpec spec);
  /// True when an auto_train plan job of `dataset` (absolute) for data `signature` exists,
  /// whatever became of it (the jobs are in the state database: this holds across restarts).
  bool plan_submitted(const std::string& dataset, const std::string& signature) const;
  /// True when an inference job writing `output` (absolute) is queued, paused or running,
  /// or was submitted at or after `since` (unix seconds), whatever became of it.
  bool infer_submitted(const std::string& output, double since) const;
  /// The newest inference job writing `output` (absolute) that was submitted at or after
  /// `since` (unix seconds), whatever became of it; 0 when there is none. auto_infer finds
  /// the jobs it submitted before a crash by it.
  std::int64_t infer_job_since(const std::string& output, double since) const;
  /// Stops a job for good (a running one writes a checkpoint first).
  Result<nlohmann::json> stop(std::int64_t id);
  /// Pauses a queued or running job. A running one goes on to the end of its epoch (or,
  /// with `now`, of its step), writes a checkpoint and ends; resume continues from there.
  Result<nlohmann::json> pause(std::int64_t id, bool now = false);
  /// Queues a paused job again (it resumes from its checkpoint); cancels a pending pause.
  Result<nlohmann::json> resume(std::int64_t id);
  /// One job: {id, name, state, reason, epoch, epochs, step, loss, best_dice, samples_per_s,
  /// devices, run_dir, dataset, file, pending, created, updated}.
  Result<nlohmann::json> status(std::int64_t id) const;
  /// Every job, by id.
  nlohmann::json status_all() const;
  /// One job's record as stored, typed (its JobState, and for a failed job the ErrorCode of
  /// the failure): what in-process callers (auto_infer) read instead of status()'s JSON.
  /// not_found for an unknown id.
  Result<JobRecord> record(std::int64_t id) const;

  /// Stops every running job with a checkpoint at the end of its epoch (at the next step
  /// with `now`, or as soon as `hurry()` turns true) and waits for them; they resume when
  /// the daemon starts again. No job starts afterwards. Idempotent.
  void shutdown(bool now = false, const std::function<bool()>& hurry = {});

  /// The device pool after resolving "auto".
  const std::vector<std::string>& devices() const { return pool_; }

 private:
  using Job = detail::Job;
  class Observer;  // a training job's sink (training_job.cpp)

  // The queue and the state machine (job_manager.cpp).
  void schedule_locked();
  void start_locked(Job& job, const std::string& device);
  std::string wanted_device_locked(const Job& job) const;
  void save_locked(Job& job);
  void publish_state_locked(const Job& job);
  /// A new job: stored (its id assigned), added to the jobs and returned; an error while
  /// the daemon shuts down.
  Result<Job*> insert_locked(JobRecord rec);
  /// A worker thread's body: run_train_job or run_infer_job.
  void run_job(Job* job);
  /// A job's worker has ended with `state` and `reason` (and, failed, the kind of error):
  /// clears its requests, frees its device, stores and publishes the state, logs it and
  /// schedules what waits.
  void end_job_locked(Job& job, JobState state, const std::string& reason, ErrorCode error = ErrorCode::ok);
  nlohmann::json describe_locked(const Job& job) const;
  Result<Job*> find_locked(std::int64_t id) const;

  // Training jobs (training_job.cpp).
  /// A stored training job read again at start: its config parsed (failed when it no longer
  /// parses), queued again when it was active. True when it was running (it resumes).
  bool restore_train_locked(Job& job);
  void run_train_job(Job* job);
  /// One run_training call, from the job's checkpoint; the observer reports as it goes.
  Result<std::filesystem::path> train_once(Job& job);

  // Inference jobs (inference_job.cpp).
  /// A stored inference job read again at start: its request parsed (failed when it does
  /// not), queued again from its first case when it was active.
  void restore_infer_locked(Job& job);
  void run_infer_job(Job* job);

  // Plan jobs (plan_job.cpp).
  /// A stored plan job read again at start: failed when its request does not parse, queued
  /// again (planned again; a current plan is reused) when it was active.
  void restore_plan_locked(Job& job);
  void run_plan_job(Job* job);
  /// The training jobs of a plan job with `train`: one per fold, queued; their ids.
  Result<std::vector<std::int64_t>> submit_planned_training(const PlanJobSpec& spec,
                                                            const std::filesystem::path& yaml);

  JobManagerOptions o_;
  StateDb& db_;
  const pipeline::StageRegistry& registry_;
  PublishFn publish_;
  VersionFn version_;
  std::vector<std::string> pool_;
  mutable std::mutex mu_;
  std::map<std::int64_t, std::unique_ptr<Job>> jobs_;
  std::map<std::string, std::int64_t> busy_;  ///< device -> running job
  std::condition_variable done_;              ///< a job thread finished
  bool shutting_down_ = false;
};

}  // namespace segflow::daemon

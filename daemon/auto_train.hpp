#pragma once
// auto_train: segflowd plans and trains a dataset that appears in data_root (daemon config
// `auto_train`, daemon/config.hpp). No CAF code.
//
// What runs: when a dataset folder of data_root that an entry names (or "*": any dataset
// without an entry of its own) holds a dataset.json and at least one case, and none of its
// cases is pending (the watcher has seen every file complete: the folder is stable), one plan
// job (JobManager::submit_plan, kind "plan", trigger "auto_train") plans the entry's
// configuration into DATASET/.segflow-plans (a current plan there is reused) and then queues
// one training job per fold with the entry's `set` overrides. This happens once per dataset
// signature (pipeline::dataset_signature: dataset.json and every image and label file's path,
// size and mtime): the plan jobs are in the state database with the signature, so a restart
// does not plan or train the same data again, failed or not; a dataset whose files change
// is planned (and trained) again. A dataset the planner refuses (no labels, every case with
// NaN voxels or labels outside dataset.json, a lying numTraining) fails its plan job, whose
// reason names the file and field, in `status` and on the PUB socket (job.<id>); a refused
// submission is logged and published as an `auto_train` event {dataset, path, error}. Either
// way the daemon goes on.
//
// Threading: mark_dirty() is safe from any thread (the watcher's change callback); poll()
// runs on one thread (the daemon's control loop).

#include <filesystem>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "daemon/config.hpp"
#include "daemon/job_manager.hpp"
#include "daemon/state_db.hpp"

namespace segflow::daemon {

class AutoTrain {
 public:
  /// `rules` as finalize_daemon_config left them (dataset names, not paths).
  AutoTrain(std::vector<AutoTrainRule> rules, StateDb& db, JobManager& jobs, PublishFn publish);

  /// Asks the next poll() to look at `dataset` again (the watcher's change callback).
  void mark_dirty(const std::string& dataset);
  /// Submits the plan jobs of the datasets that became ready since the last call; the first
  /// call and every tenth look at every dataset (one whose cases are all bad changes no ok
  /// case, so the watcher does not call). Never throws.
  void poll();

 private:
  /// The entry for `dataset`: its own, else "*", else null.
  const AutoTrainRule* rule_for(const std::string& dataset) const;
  void poll_dataset(const DatasetRecord& d, const AutoTrainRule& rule);

  std::vector<AutoTrainRule> rules_;
  StateDb& db_;
  JobManager& jobs_;
  PublishFn publish_;
  std::mutex mu_;                            ///< guards dirty_ and all_dirty_
  std::set<std::string> dirty_;              ///< datasets marked by the watcher
  bool all_dirty_ = true;                    ///< look at every dataset (the first poll)
  int polls_ = 0;                            ///< poll() calls (the control thread's only)
  std::map<std::string, std::string> seen_;  ///< dataset -> signature of its case records
};

}  // namespace segflow::daemon

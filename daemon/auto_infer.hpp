#pragma once
// auto_infer: a dataset of data_root names a model that segflowd runs on each case that
// arrives in it (daemon config `auto_infer`, daemon/config.hpp). No actor-framework code.
//
// What runs: for each case of the dataset that the watcher has indexed (status ok, or bad
// such as an image without a label: any state but pending, so its files are complete) and
// whose label map OUTPUT/<case>.nii.gz does not exist yet, one inference job
// (JobManager::submit_infer, kind "infer", trigger "auto_infer", dataset and case in its
// job.<id> events and status) on the case's image, never its label. Cases with more than one
// image channel are skipped with a warning. A case is not submitted again while a job for
// its output is queued or running, nor when a job for its output was submitted after its
// newest file's mtime (jobs are in the state database, so this holds across restarts): a
// case whose job failed runs again only when one of its files changes. At start, the cases
// already there that have no output are inferred too. A refused submission (the checkpoint
// gone since start) is logged and published as an `auto_infer` event {dataset, case, input,
// error}.
//
// Threading: mark_dirty() is safe from any thread (the watcher's change callback); poll()
// runs on one thread (the daemon's control loop) and reads the state database only when a
// dataset's case records changed.

#include <cstdint>
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

class AutoInfer {
 public:
  /// `rules` as finalize_daemon_config left them (absolute paths, output filled in).
  AutoInfer(std::vector<AutoInferRule> rules, std::filesystem::path data_root, StateDb& db, JobManager& jobs,
            PublishFn publish);

  /// Creates the output folders. An error names the rule's output.
  Status prepare();
  /// Asks the next poll() to look at `dataset` again (the watcher's change callback).
  void mark_dirty(const std::string& dataset);
  /// Submits the jobs of the cases that arrived since the last call. Never throws.
  void poll();
  /// True when some rule names `dataset`.
  bool watches(const std::string& dataset) const;

 private:
  void poll_rule(const AutoInferRule& rule, bool dirty);

  std::vector<AutoInferRule> rules_;
  std::filesystem::path data_root_;
  StateDb& db_;
  JobManager& jobs_;
  PublishFn publish_;
  std::mutex mu_;                              ///< guards dirty_
  std::set<std::string> dirty_;                ///< datasets marked by the watcher
  std::map<std::string, std::string> seen_;    ///< dataset -> signature of its case records
  std::map<std::string, std::int64_t> tried_;  ///< "dataset/case" -> mtime_ns submitted (or skipped)
};

}  // namespace segflow::daemon

#pragma once
// auto_infer: a dataset of data_root names a model that segflowd runs on each case that
// arrives in it (daemon config `auto_infer`, daemon/config.hpp), and, for a DICOM series,
// sends the DICOM SEG back to a DICOM destination by itself. No actor-framework code.
//
// What runs: for each case of the dataset that the watcher has indexed (any state but
// pending: ok, unlabelled or bad, so its files are complete), one inference job per output
// (JobManager::submit_infer, kind "infer", trigger "auto_infer", dataset and case in its
// job.<id> events and status) on the case's image, never its label: OUTPUT/<case>.nii.gz
// (nifti), OUTPUT/<case>.dcm (seg: a DICOM SEG on the source series' grid with the model's
// named segments, models::run_inference's SEG writer) or both. output_format "" means seg
// for a DICOM series and nifti otherwise. Cases with more than one image channel are skipped
// with a warning.
//
// NIfTI cases run once per file version: not again while a job for the output is queued or
// running, nor when one was submitted after the case's newest file (jobs are in the state
// database), nor when the output exists.
//
// DICOM series: a series is complete when no instance arrived for quiet_seconds (its newest
// file's mtime; the node files instances when their association ends). Its signature (the
// SOP instance file names, sizes and mtimes) is kept in the state database under
// "auto_infer:<dataset>/<case>" with the jobs and the send: the same series received again
// (the node keeps a byte-identical instance as it was) makes no second SEG; changed or added
// instances do. With send_to, each SEG written is queued for its destination (the
// persistent, retried queue of `segflow ctl dicom send`). Progress survives a restart, a
// SIGKILL included: the record is stored (state submitting) before its jobs are submitted and
// a restarted daemon takes the jobs submitted since then as its own instead of submitting
// again; the sender queues a SEG once however often it is handed over; recorded jobs are
// followed again and recorded sends reported (also one that ended before auto_infer was
// listening).
//
// Box-prompted (sam) checkpoints (rule.prompts): each case's job takes its prompts from the
// box file <case id>.json or .csv in rule.boxes_dir (found as `segflow infer --boxes DIR`
// finds it, models::prompt_file_for) or from the case's label file (prompts: label_map), with
// rule.propagate and rule.box_margin; the job is models::run_box_inference (the SEG names its
// segments by the checkpoint's classes). A case's version is its newest file or its prompt
// file, whichever is newer: a box file that arrives after its case, or is replaced, runs the
// case (again). A case without prompts is a failed event (stage prompts, the error naming the
// missing file) and no job; the other cases go on.
//
// Events (topic "auto_infer"): {event: received | inferred | retrying | sent | failed,
// dataset, case, ...}: received when a case is complete and its jobs are queued (jobs,
// instances), inferred when its jobs completed (outputs, seconds_since_last_instance; NIfTI
// cases too, but their jobs are not followed across a restart: the job events say it),
// retrying after each failed send attempt with attempts left (send, attempts, error,
// retry_in_s), sent when the destination stored the SEG (send, destination,
// sop_instance_uid, attempts, seconds_since_last_instance), failed with stage prompts | submit |
// inference | send and the error (a send: after dicom.send_to.max_attempts).
//
// An empty prediction (the model found no foreground in the series) is no failure: a DICOM
// SEG cannot hold zero segments, so nothing is written or sent and `inferred` carries
// empty: true and the reason; the case's state is "empty" (the same series again makes no
// second attempt). Any NIfTI output of the case is written as usual.
//
// Threading: mark_dirty() and on_send_done() are safe from any thread; poll() runs on one
// thread (the daemon's control loop).

#include <nlohmann/json.hpp>

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
#include "pipeline/io/dataset.hpp"

namespace segflow::daemon {

namespace dicom {
class DicomService;
}

class AutoInfer {
 public:
  /// `rules` as finalize_daemon_config left them (absolute paths, output filled in);
  /// `dicom` (may be null without send_to rules) takes the SEGs to send.
  AutoInfer(std::vector<AutoInferRule> rules, std::filesystem::path data_root, StateDb& db, JobManager& jobs,
            PublishFn publish, dicom::DicomService* dicom = nullptr);

  /// Creates the output folders. An error names the rule's output.
  Status prepare();
  /// Asks the next poll() to look at `dataset` again (the watcher's change callback).
  void mark_dirty(const std::string& dataset);
  /// Submits the jobs of the cases that arrived since the last call and follows the jobs
  /// submitted (SEGs queued when they complete). Never throws.
  void poll();
  /// True when some rule names `dataset`.
  bool watches(const std::string& dataset) const;
  /// The sender's report of an attempt (sent, failed for good, or queued for a retry):
  /// published when it is a SEG of auto_infer.
  void on_send_done(const DicomSendRecord& send);

 private:
  /// A case in progress: its jobs, then (DICOM) its SEG's send.
  struct Tracked {
    std::size_t rule = 0;
    std::string dataset, case_id;
    nlohmann::json record;     ///< what is stored under meta_key: signature, jobs, seg, send, state
    double last_instance = 0;  ///< unix seconds of the newest file
    bool stored = true;        ///< a DICOM series: the record is kept in the state database
  };

  void poll_rule(std::size_t index, bool dirty);
  void consider_case(std::size_t index, const pipeline::CaseEntry& c, const CaseRecord& rec);
  void submit_nifti_case(std::size_t index, const pipeline::CaseEntry& c, std::int64_t version_ns,
                         const std::filesystem::path& prompt);
  void submit_series(std::size_t index, const pipeline::CaseEntry& c, const CaseRecord& rec,
                     const std::filesystem::path& prompt);
  void follow_jobs();
  bool follow(Tracked& t);
  /// Submits the job of a series' record, one for every output format (or finds the one
  /// submitted for it before a restart).
  void submit_jobs(Tracked& t, const pipeline::CaseEntry& c, const std::filesystem::path& prompt);
  void queue_seg(Tracked& t, const std::string& seg);
  /// Follows the send of a record in state queued (ended already: published at once).
  void follow_send(const Tracked& t);
  /// A send of `t` ended (sent or failed for good): the record stored, the event published.
  void send_ended_locked(Tracked t, const DicomSendRecord& send);
  /// One job writing `out` and `also` from one prediction; `prompt` is the case's box file or
  /// label map (box rules).
  Result<std::int64_t> submit(const AutoInferRule& rule, const pipeline::CaseEntry& c,
                              const std::filesystem::path& out,
                              const std::vector<std::filesystem::path>& also,
                              const std::filesystem::path& prompt);
  void publish(const std::string& event, const std::string& dataset, const std::string& case_id,
               nlohmann::json body);
  void store(const Tracked& t);

  std::vector<AutoInferRule> rules_;
  std::filesystem::path data_root_;
  StateDb& db_;
  JobManager& jobs_;
  PublishFn publish_;
  dicom::DicomService* dicom_;
  std::mutex mu_;                              ///< guards dirty_ and sends_
  std::set<std::string> dirty_;                ///< datasets marked by the watcher
  std::map<std::int64_t, Tracked> sends_;      ///< send id -> its case (queued SEGs)
  std::map<std::string, std::string> seen_;    ///< dataset -> signature of its case records
  std::set<std::string> quiet_;                ///< datasets with a series still in its quiet period
  std::map<std::string, std::int64_t> tried_;  ///< "dataset/case" -> mtime_ns submitted (or skipped)
  std::map<std::string, Tracked> active_;      ///< "dataset/case" -> a case whose jobs run
};

/// The signature of a DICOM series: a hash of its files' names (SOP instance UIDs), sizes and
/// mtimes, the label file left out.
std::string series_signature(const CaseRecord& rec, const std::string& label_path);

}  // namespace segflow::daemon

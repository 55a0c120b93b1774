#pragma once
// The daemon's durable state: one SQLite database (state_dir/state.db, WAL mode) with the
// jobs (spec, state, progress, run folder), the indexed datasets and cases, the queue
// of DICOM results to send (dicom/sender.hpp) and of studies to fetch (dicom/fetcher.hpp). Everything the
// daemon needs after a crash is here; the run folders hold the checkpoints.
//
// Threading: one connection guarded by a mutex; every method is thread-safe and each write
// is its own transaction (replace_dataset is one transaction for the whole dataset).

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "daemon/job_state.hpp"
#include "messages/status.hpp"

struct sqlite3;

namespace segflow::daemon {

/// One job as stored.
struct JobRecord {
  std::int64_t id = 0;                 ///< assigned by insert_job
  std::string name;                    ///< the config's name
  JobKind kind = JobKind::train;       ///< infer: config_yaml holds the request JSON
  std::string file;                    ///< where the config came from ("<inline>" when sent inline)
  std::string config_yaml;             ///< the config text as submitted
  std::vector<std::string> overrides;  ///< --set overrides, applied in order
  JobState state = JobState::queued;   ///< stored by name (job_state.hpp)
  std::string reason;                  ///< why it is in that state (failures, shutdowns)
  ErrorCode error = ErrorCode::ok;     ///< a failed job's kind of error (no_foreground, ...); stored by name
  std::string device;                  ///< device it last ran on ("" = not yet)
  std::string run_dir;                 ///< absolute run folder
  std::string dataset;                 ///< followed dataset under data_root ("" = none)
  std::int64_t epoch = 0;              ///< epochs finished
  std::int64_t epochs = 0;             ///< epochs in the config
  std::int64_t step = 0;               ///< optimizer steps done
  std::int64_t checkpoint_epoch = 0;   ///< epochs finished in the run folder's last.pt
  double loss = 0.0;                   ///< last step loss (NaN: none yet)
  double best_dice = -1.0;             ///< best validation mean Dice (-1: none yet)
  double samples_per_s = 0.0;          ///< last epoch's throughput
  double created = 0.0;                ///< unix seconds
  double updated = 0.0;                ///< unix seconds
};

/// One indexed case (or a bad file that belongs to no case).
struct CaseRecord {
  std::string dataset;
  std::string case_id;        ///< case id, or the file's path in the dataset for a bad file
  nlohmann::json files;       ///< [{path, size, mtime_ns}] (absolute paths)
  std::int64_t size = 0;      ///< total bytes
  std::int64_t mtime_ns = 0;  ///< newest file mtime
  std::string status;         ///< ok | bad | pending
  std::string reason;         ///< why bad or pending
};

/// One dataset folder.
struct DatasetRecord {
  std::string name;    ///< folder name under data_root
  std::string path;    ///< absolute path
  std::string layout;  ///< msd | dicom | medsam-npy ("" when unknown)
  std::string error;   ///< why the folder is not a usable dataset ("" = fine)
  double updated = 0.0;
};

/// One queued C-STORE of a result file (dicom.send_to), kept until it is sent or gives up.
struct DicomSendRecord {
  std::int64_t id = 0;           ///< assigned by insert_dicom_send
  std::string file;              ///< the daemon's copy (state_dir/dicom-outbox/...), removed once sent
  std::string source;            ///< the path it was queued from
  std::string sop_class_uid;     ///< of the file
  std::string sop_instance_uid;  ///< of the file
  std::string state = "queued";  ///< queued | sent | failed
  std::int64_t attempts = 0;     ///< attempts made
  double next_attempt = 0.0;     ///< unix seconds; not tried before
  std::string last_error;        ///< why the last attempt failed ("" = none)
  std::string destination;       ///< AE@host:port of the last attempt
  std::string target;            ///< the dicom.destinations name it goes to; "" = dicom.send_to
  double created = 0.0;          ///< unix seconds
  double updated = 0.0;          ///< unix seconds
};

/// One `segflow ctl dicom fetch`: a study (or one series of it) pulled from a DICOMweb
/// destination into the DICOM node's dataset, kept until it is done or gives up.
struct DicomFetchRecord {
  std::int64_t id = 0;            ///< assigned by insert_dicom_fetch
  std::string source;             ///< the dicom.destinations name it is pulled from
  std::string study;              ///< StudyInstanceUID
  std::string series;             ///< SeriesInstanceUID; "" = every series of the study
  std::string state = "queued";   ///< queued | running | done | failed
  std::int64_t attempts = 0;      ///< attempts made
  double next_attempt = 0.0;      ///< unix seconds; not tried before
  std::int64_t series_total = 0;  ///< series listed by QIDO-RS
  nlohmann::json series_done = nlohmann::json::array();  ///< SeriesInstanceUIDs stored so far
  std::int64_t instances = 0;                            ///< instances stored (all attempts)
  std::int64_t skipped = 0;  ///< instances of SOP classes the dataset does not take
  std::int64_t bytes = 0;    ///< bytes stored
  std::string last_error;    ///< why the last attempt failed ("" = none)
  double created = 0.0;      ///< unix seconds
  double updated = 0.0;      ///< unix seconds
};

class StateDb {
 public:
  /// Opens (creating) the database in WAL mode and makes the tables.
  static Result<std::unique_ptr<StateDb>> open(const std::filesystem::path& file);
  ~StateDb();
  StateDb(const StateDb&) = delete;
  StateDb& operator=(const StateDb&) = delete;

  /// Inserts a job; returns its id.
  Result<std::int64_t> insert_job(JobRecord job);
  /// Writes every field of a job (by id).
  Status update_job(const JobRecord& job);
  /// Every job, by id.
  Result<std::vector<JobRecord>> jobs();

  /// Replaces a dataset and all its cases in one transaction.
  Status replace_dataset(const DatasetRecord& dataset, const std::vector<CaseRecord>& cases);
  /// Removes a dataset and its cases.
  Status remove_dataset(const std::string& name);
  /// Every dataset, by name.
  Result<std::vector<DatasetRecord>> datasets();
  /// The cases of one dataset ("" = every dataset), by dataset and id.
  Result<std::vector<CaseRecord>> cases(const std::string& dataset = "");

  /// Queues a DICOM send; returns its id.
  Result<std::int64_t> insert_dicom_send(const DicomSendRecord& send);
  /// Writes state, attempts, next_attempt, last_error and destination of a send (by id).
  Status update_dicom_send(const DicomSendRecord& send);
  /// Queued sends whose next attempt is due at `at` (unix seconds), oldest first.
  Result<std::vector<DicomSendRecord>> due_dicom_sends(double at, std::int64_t limit);
  /// Send `id` (id 0 when there is none).
  Result<DicomSendRecord> dicom_send(std::int64_t id);
  /// The newest `limit` sends, newest first.
  Result<std::vector<DicomSendRecord>> dicom_sends(std::int64_t limit);
  /// (state, count) of every send state present.
  Result<std::vector<std::pair<std::string, std::int64_t>>> dicom_send_counts();

  /// The newest send of instance `sop_instance_uid` to `target` that is queued or sent (id 0
  /// when there is none): queueing the same SEG twice finds it.
  Result<DicomSendRecord> find_dicom_send(const std::string& sop_instance_uid, const std::string& target);

  /// Queues a fetch; returns its id.
  Result<std::int64_t> insert_dicom_fetch(const DicomFetchRecord& fetch);
  /// Writes the progress fields of a fetch (by id): state, attempts, next_attempt, counts, error.
  Status update_dicom_fetch(const DicomFetchRecord& fetch);
  /// Queued fetches due at `at` (unix seconds), oldest first.
  Result<std::vector<DicomFetchRecord>> due_dicom_fetches(double at, std::int64_t limit);
  /// The newest `limit` fetches, newest first.
  Result<std::vector<DicomFetchRecord>> dicom_fetches(std::int64_t limit);
  /// (state, count) of every fetch state present.
  Result<std::vector<std::pair<std::string, std::int64_t>>> dicom_fetch_counts();
  /// Fetches left running by a daemon that stopped (or was killed) are queued again.
  Status requeue_running_fetches();

  /// A value of the key-value table (auto_infer's series signatures); "" when absent.
  Result<std::string> meta(const std::string& key);
  /// Sets (inserts or replaces) a value of the key-value table.
  Status set_meta(const std::string& key, const std::string& value);

  /// Current time in unix seconds.
  static double now();

 private:
  explicit StateDb(sqlite3* db, std::filesystem::path file) : db_(db), file_(std::move(file)) {}
  Status exec(const std::string& sql);
  /// (state, count) of the rows of `table` (a table with a state column); `what` names it in errors.
  Result<std::vector<std::pair<std::string, std::int64_t>>> state_counts(const std::string& table,
                                                                         const std::string& what);
  Status fail(const std::string& what) const;
  sqlite3* db_ = nullptr;
  std::filesystem::path file_;
  std::mutex mu_;
};

}  // namespace segflow::daemon

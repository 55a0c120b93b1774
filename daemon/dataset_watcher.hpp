#pragma once
// The watched data folder: every top-level folder of data_root is a dataset. A watcher
// thread follows it with inotify (IN_CLOSE_WRITE, IN_MOVED_TO, IN_MOVED_FROM, IN_DELETE,
// IN_CREATE; dataset folders watched recursively) plus a periodic stat-only rescan that
// catches whatever the events missed (overflow, watch limits, network file systems).
//
// Indexing a dataset: the layout's scan (pipeline::scan_dataset) groups files into cases;
// a case is validated (pipeline::load_case) once all its files are complete (an
// IN_CLOSE_WRITE / IN_MOVED_TO was seen for the file's current size and mtime, or its size
// and mtime did not change between two looks settle_s apart) and then indexed as ok (a
// labelled case: training and inference) or bad with the reason; an image without a label
// is indexed as unlabelled (usable for inference: auto_infer, ctl infer; not for training)
// without being read. Until then it is pending. A case is validated again only when one of its
// files changes (size or mtime), so a bad file is retried on its next change and a restart
// does not re-read a large dataset. Nothing a file contains can stop the thread: every
// failure becomes a bad record.
//
// Threading: one thread owns the inotify descriptor and the in-memory file table; the
// state database is the only thing shared (thread-safe). version() and the change callback
// are safe from any thread; the callback runs on the watcher thread.

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "daemon/state_db.hpp"
#include "messages/status.hpp"

namespace segflow::daemon {

/// Watcher settings.
struct WatchOptions {
  std::filesystem::path data_root;  ///< absolute; created when missing
  double rescan_interval_s = 10.0;  ///< full stat-only rescan period
  double settle_s = 1.0;            ///< delay between two looks at a pending file
};

class DatasetWatcher {
 public:
  /// Called with a dataset's name when its set of usable (ok) cases changed.
  using ChangeFn = std::function<void(const std::string& dataset)>;

  DatasetWatcher(WatchOptions options, StateDb& db, ChangeFn on_change);
  ~DatasetWatcher();
  DatasetWatcher(const DatasetWatcher&) = delete;
  DatasetWatcher& operator=(const DatasetWatcher&) = delete;

  /// Creates data_root when missing and starts the thread (the first index runs there).
  Status start();
  /// Stops and joins the thread. Idempotent.
  void stop();

  /// Counter bumped each time a dataset's ok cases change (0 until the first change).
  std::uint64_t version(const std::string& dataset) const;
  /// True once every dataset present at start has been indexed once.
  bool ready() const { return ready_.load(); }

  /// The datasets as the `datasets` command reports them: [{name, path, layout, error,
  /// cases (labelled + unlabelled: usable for something), labelled (ok: training and
  /// inference), unlabelled (inference only), uses: {training, inference}, unlabelled_cases,
  /// bytes, bad, pending, bad_files: [{case, files, reason}], pending_files: [...]}].
  static Result<nlohmann::json> describe(StateDb& db, const std::string& only = "");

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::thread thread_;
  std::atomic<bool> ready_{false};
};

}  // namespace segflow::daemon

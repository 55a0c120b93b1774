#pragma once
// Files that are never seen half-written, and locks that let several processes (ranks of
// one job, two jobs, a daemon and a CLI) share a folder: the one place for the
// temp-file-and-rename rule and for inter-process locking.

#include <nlohmann/json_fwd.hpp>

#include <chrono>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>

#include "messages/status.hpp"

namespace segflow {

/// A temporary path next to `target`, unique to this process and call
/// ("<target>.tmp.<pid>.<n>"), on the same file system, so a rename onto `target` is atomic.
std::filesystem::path temp_path_for(const std::filesystem::path& target);

/// Writes `bytes` to a temporary file next to `file`, flushes it and renames it onto
/// `file`: readers see the old content or the new, never a part. Thread- and
/// process-safe (each writer has its own temporary). io_error naming the file on failure.
Status write_file_atomically(const std::filesystem::path& file, std::string_view bytes);

/// The same for writers that need a path (a library that saves to a file name): `write`
/// fills the temporary it is given; on success it is renamed onto `file`, on failure (or an
/// exception) it is removed and the error returned.
Status replace_file_atomically(const std::filesystem::path& file,
                               const std::function<Status(const std::filesystem::path& tmp)>& write);

/// The same for a folder: `fill` writes into a fresh temporary folder next to `folder`
/// (temp_path_for); on success it is renamed onto `folder` (which must not exist, or be an
/// empty folder), on failure (or an exception) it is removed with everything in it and the
/// error returned. Readers never see a half-written folder, and nothing is left behind.
Status write_folder_atomically(const std::filesystem::path& folder,
                               const std::function<Status(const std::filesystem::path& tmp)>& fill);

/// The JSON object in `file`, for the readers of segflow's own JSON files (summaries, plans,
/// manifests): not_found "<file>: <missing>" when it cannot be opened; corrupt_data "<file>:
/// not a JSON object" when it does not parse or holds another kind of value.
Result<nlohmann::json> read_json_object(const std::filesystem::path& file, const std::string& missing);

/// An exclusive advisory lock (flock) on a lock file, held until destruction. For making
/// something once when several processes may try at the same time (a synthesised dataset,
/// a cache entry, a run folder): take the lock, check whether it exists, make it if not.
class FileLock {
 public:
  /// Blocks until the lock on `lock_file` (created if missing) is held, or `timeout`
  /// passes (io_error naming the file and the wait).
  static Result<FileLock> acquire(const std::filesystem::path& lock_file,
                                  std::chrono::seconds timeout = std::chrono::hours(1));
  FileLock(FileLock&& other) noexcept;
  FileLock& operator=(FileLock&& other) noexcept;
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;
  ~FileLock();

 private:
  explicit FileLock(int fd) : fd_(fd) {}
  int fd_ = -1;
};

}  // namespace segflow

#include "messages/file_util.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <thread>

namespace segflow {

namespace fs = std::filesystem;

Result<nlohmann::json> read_json_object(const fs::path& file, const std::string& missing) {
  std::ifstream in(file);
  if (!in) return not_found(file.string() + ": " + missing);
  nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return corrupt_data(file.string() + ": not a JSON object");
  return j;
}

fs::path temp_path_for(const fs::path& target) {
  static std::atomic<unsigned long> counter{0};
  return fs::path(target.string() + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(++counter));
}

Status replace_file_atomically(const fs::path& file,
                               const std::function<Status(const fs::path& tmp)>& write) {
  const fs::path tmp = temp_path_for(file);
  std::error_code ec;
  Status st;
  try {
    st = write(tmp);
  } catch (const std::exception& e) {
    st = io_error(file.string() + ": writing failed: " + e.what());
  }
  if (!st.is_ok()) {
    fs::remove(tmp, ec);
    return st;
  }
  fs::rename(tmp, file, ec);
  if (ec) {
    std::error_code ignored;
    fs::remove(tmp, ignored);
    return io_error(file.string() + ": cannot move the written temporary into place: " + ec.message());
  }
  return Status::ok();
}

Status write_folder_atomically(const fs::path& folder,
                               const std::function<Status(const fs::path& tmp)>& fill) {
  std::error_code ec;
  if (folder.has_parent_path()) fs::create_directories(folder.parent_path(), ec);
  const fs::path tmp = temp_path_for(folder);
  fs::remove_all(tmp, ec);
  if (!fs::create_directories(tmp, ec))
    return io_error(tmp.string() + ": cannot create the folder: " + (ec ? ec.message() : "it exists"));
  Status st;
  try {
    st = fill(tmp);
  } catch (const std::exception& e) {
    st = io_error(folder.string() + ": writing failed: " + e.what());
  }
  if (st.is_ok()) {
    fs::rename(tmp, folder, ec);
    if (ec)
      st = io_error(folder.string() + ": cannot rename " + tmp.string() + " into place: " + ec.message());
  }
  if (!st.is_ok()) {
    std::error_code ignored;
    fs::remove_all(tmp, ignored);
  }
  return st;
}

Status write_file_atomically(const fs::path& file, std::string_view bytes) {
  return replace_file_atomically(file, [&](const fs::path& tmp) -> Status {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out)
      return io_error(file.string() + ": cannot create " + tmp.string() + ": " + std::strerror(errno));
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.flush();
    if (!out) return io_error(file.string() + ": cannot write: " + std::strerror(errno));
    return Status::ok();
  });
}

Result<FileLock> FileLock::acquire(const fs::path& lock_file, std::chrono::seconds timeout) {
  std::error_code ec;
  if (lock_file.has_parent_path()) fs::create_directories(lock_file.parent_path(), ec);
  const int fd = ::open(lock_file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return io_error(lock_file.string() + ": cannot open the lock file: " + std::strerror(errno));
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto wait = std::chrono::milliseconds(5);
  while (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    if (errno != EWOULDBLOCK && errno != EINTR) {
      const int err = errno;
      ::close(fd);
      return io_error(lock_file.string() + ": cannot lock: " + std::strerror(err));
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      ::close(fd);
      return io_error(lock_file.string() + ": still locked by another process after " +
                      std::to_string(timeout.count()) + " s");
    }
    std::this_thread::sleep_for(wait);
    wait = std::min(wait * 2, std::chrono::milliseconds(200));
  }
  return FileLock(fd);
}

FileLock::FileLock(FileLock&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }

FileLock& FileLock::operator=(FileLock&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.fd_;
    other.fd_ = -1;
  }
  return *this;
}

FileLock::~FileLock() {
  if (fd_ >= 0) ::close(fd_);  // closing the descriptor releases the flock
}

}  // namespace segflow

// File helpers of every layer (messages/file_util.hpp): files replaced whole or not at all,
// and the inter-process lock that guards making something once.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>

#include "messages/file_util.hpp"
#include "test_util.hpp"

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using segflow::ErrorCode;
using segflow::FileLock;
using segflow::Status;
using segflow::testing::contains;
using segflow::testing::has_temporaries;
using segflow::testing::read_file;
using segflow::testing::TempDir;
using segflow::testing::write_file;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

// ---- write_file_atomically / replace_file_atomically ---------------------------------------

TEST_CASE("write_file_atomically replaces a file's content whole and leaves no temporary") {
  TempDir dir("atomic_write");
  const fs::path f = dir / "config.json";
  REQUIRE_OK(segflow::write_file_atomically(f, "{\"epochs\": 100, \"comment\": \"a long first version\"}"));
  CHECK(read_file(f) == "{\"epochs\": 100, \"comment\": \"a long first version\"}");
  REQUIRE_OK(segflow::write_file_atomically(f, "{}"));  // shorter: nothing of the old content stays
  CHECK(read_file(f) == "{}");
  REQUIRE_OK(segflow::write_file_atomically(f, std::string("a\0b", 3)));  // bytes, not a C string
  CHECK(read_file(f) == std::string("a\0b", 3));
  CHECK_FALSE(has_temporaries(dir.path()));
}

TEST_CASE("a reader of a file being replaced sees the old content or the new, never a part") {
  TempDir dir("atomic_readers");
  const fs::path f = dir / "state.bin";
  const std::string a(1 << 20, 'a'), b(1 << 19, 'b');
  REQUIRE_OK(segflow::write_file_atomically(f, a));
  std::atomic<bool> done{false};
  std::atomic<int> write_errors{0};
  std::thread writer([&] {
    for (int i = 0; i < 60; ++i)
      if (!segflow::write_file_atomically(f, i % 2 ? a : b).is_ok()) ++write_errors;
    done = true;
  });
  int reads = 0, torn = 0;
  std::set<std::size_t> sizes;
  while (!done || reads == 0) {
    const std::string got = read_file(f);
    ++reads;
    sizes.insert(got.size());
    if (got != a && got != b) ++torn;
  }
  writer.join();
  CHECK(write_errors == 0);
  CHECK(torn == 0);
  CHECK(reads > 0);
  CHECK_FALSE(has_temporaries(dir.path()));
  MESSAGE(reads << " reads, sizes seen: " << sizes.size());
}

TEST_CASE("a failed replace leaves the old file untouched, removes its temporary and returns the error") {
  TempDir dir("atomic_fail");
  const fs::path f = dir / "weights.pt";
  write_file(f, "old");

  // The writer reports an error after writing half of its temporary.
  fs::path seen_tmp;
  const Status st = segflow::replace_file_atomically(f, [&](const fs::path& tmp) {
    seen_tmp = tmp;
    write_file(tmp, "half");
    return segflow::io_error(f.string() + ": disk full");
  });
  CHECK(st.code() == ErrorCode::io_error);
  CHECK(st.message() == f.string() + ": disk full");
  CHECK(seen_tmp.parent_path() == f.parent_path());  // beside the target: the rename is atomic
  CHECK(contains(seen_tmp.filename().string(), "weights.pt.tmp."));
  CHECK_FALSE(fs::exists(seen_tmp));
  CHECK(read_file(f) == "old");

  // The writer throws: an io_error naming the file and what was thrown.
  const Status thrown = segflow::replace_file_atomically(f, [&](const fs::path& tmp) -> Status {
    write_file(tmp, "half");
    throw std::runtime_error("serializer exploded");
  });
  CHECK(thrown.code() == ErrorCode::io_error);
  CHECK(thrown.message() == f.string() + ": writing failed: serializer exploded");
  CHECK(read_file(f) == "old");
  CHECK_FALSE(has_temporaries(dir.path()));
}

TEST_CASE("write_folder_atomically renames a filled folder into place, and removes a failed one whole") {
  TempDir dir("atomic_folder");
  const fs::path out = dir / "nested" / "model";  // missing parents are made
  fs::path seen;
  REQUIRE_OK(segflow::write_folder_atomically(out, [&](const fs::path& tmp) -> Status {
    seen = tmp;
    CHECK(fs::is_directory(tmp));
    CHECK(fs::is_empty(tmp));
    CHECK(tmp.parent_path() == out.parent_path());  // beside the target: the rename is atomic
    CHECK_FALSE(fs::exists(out));                   // nothing visible while it is filled
    fs::create_directories(tmp / "fold_0");
    write_file(tmp / "fold_0" / "checkpoint.pth", "weights");
    write_file(tmp / "plans.json", "{}");
    return Status::ok();
  }));
  CHECK(read_file(out / "fold_0" / "checkpoint.pth") == "weights");
  CHECK(read_file(out / "plans.json") == "{}");
  CHECK_FALSE(fs::exists(seen));
  CHECK_FALSE(has_temporaries(out.parent_path()));

  // A filler that fails half way, or throws: nothing of it is left, the error comes back.
  const fs::path other = dir / "other";
  const Status st = segflow::write_folder_atomically(other, [&](const fs::path& tmp) {
    fs::create_directories(tmp / "a" / "b");
    write_file(tmp / "a" / "b" / "half", "x");
    return segflow::invalid_argument("plans.json: missing");
  });
  CHECK(st.code() == ErrorCode::invalid_argument);
  CHECK(st.message() == "plans.json: missing");
  const Status thrown = segflow::write_folder_atomically(other, [&](const fs::path& tmp) -> Status {
    write_file(tmp / "half", "x");
    throw std::runtime_error("serializer exploded");
  });
  CHECK(thrown.code() == ErrorCode::io_error);
  CHECK(thrown.message() == other.string() + ": writing failed: serializer exploded");
  CHECK_FALSE(fs::exists(other));
  CHECK_FALSE(has_temporaries(dir.path()));

  // A target that exists and holds something is not replaced: the new folder is removed.
  const Status taken = segflow::write_folder_atomically(out, [&](const fs::path& tmp) {
    write_file(tmp / "plans.json", "new");
    return Status::ok();
  });
  CHECK(taken.code() == ErrorCode::io_error);
  CHECK(contains(taken.message(), "cannot rename"));
  CHECK(read_file(out / "plans.json") == "{}");
  CHECK_FALSE(has_temporaries(out.parent_path()));
}

TEST_CASE("writing a file into a missing folder is an io_error naming the file") {
  TempDir dir("atomic_missing");
  const fs::path f = dir / "no_such_folder" / "metrics.json";
  const Status st = segflow::write_file_atomically(f, "{}");
  CHECK(st.code() == ErrorCode::io_error);
  CHECK(contains(st.message(), f.string() + ": cannot create "));
  CHECK_FALSE(fs::exists(f.parent_path()));

  // A temporary written but not movable into place (the target is a folder) names it too.
  fs::create_directories(dir / "taken");
  const Status moved = segflow::write_file_atomically(dir / "taken", "{}");
  CHECK(moved.code() == ErrorCode::io_error);
  CHECK(
      contains(moved.message(), (dir / "taken").string() + ": cannot move the written temporary into place"));
  CHECK_FALSE(has_temporaries(dir.path()));
}

TEST_CASE("every call gets its own temporary name beside the target") {
  const fs::path target = "/data/runs/job/last.pt";
  const fs::path t1 = segflow::temp_path_for(target), t2 = segflow::temp_path_for(target);
  CHECK(t1 != t2);
  CHECK(t1.parent_path() == target.parent_path());
  CHECK(t1.filename().string().rfind("last.pt.tmp." + std::to_string(::getpid()) + ".", 0) == 0);
}

// ---- FileLock --------------------------------------------------------------------------------

TEST_CASE("a second holder of a FileLock waits until the first releases it") {
  TempDir dir("lock_wait");
  const fs::path lock_file = dir / "dataset.lock";
  REQUIRE_OK_AND_ASSIGN(auto first, FileLock::acquire(lock_file));
  std::atomic<bool> released{false};
  std::atomic<bool> acquired{false};
  bool held_after_release = false;
  Status second_status;
  double waited = 0;
  std::thread second([&] {
    const auto t0 = std::chrono::steady_clock::now();
    auto lock = FileLock::acquire(lock_file, 30s);
    waited = seconds_since(t0);
    second_status = lock.status();
    held_after_release = released.load();
    acquired = true;
  });
  std::this_thread::sleep_for(300ms);
  CHECK_FALSE(acquired.load());  // still waiting while the first holds it
  released = true;
  { FileLock gone = std::move(first); }  // destroyed here: released
  second.join();
  CHECK_OK(second_status);
  CHECK(held_after_release);
  CHECK(waited >= 0.25);
  CHECK(waited < 10.0);
}

TEST_CASE("a FileLock held elsewhere times out with an io_error naming the file and the wait") {
  TempDir dir("lock_timeout");
  const fs::path lock_file = dir / "cache.lock";
  REQUIRE_OK_AND_ASSIGN(auto held, FileLock::acquire(lock_file));
  const auto t0 = std::chrono::steady_clock::now();
  auto again = FileLock::acquire(lock_file, 1s);
  CHECK(seconds_since(t0) >= 0.9);
  REQUIRE_FALSE(again.is_ok());
  CHECK(again.status().code() == ErrorCode::io_error);
  CHECK(again.status().message() == lock_file.string() + ": still locked by another process after 1 s");
}

TEST_CASE("a FileLock is released when its holder is destroyed, and a moved lock stays held") {
  TempDir dir("lock_release");
  const fs::path lock_file = dir / "run.lock";
  {
    REQUIRE_OK_AND_ASSIGN(auto a, FileLock::acquire(lock_file));
    FileLock b = std::move(a);                                        // the lock moves with the descriptor
    { FileLock moved_from = std::move(b); }                           // ...and is released with it
    REQUIRE_OK_AND_ASSIGN(auto c, FileLock::acquire(lock_file, 0s));  // free at once
    FileLock d = std::move(c);
    CHECK_FALSE(FileLock::acquire(lock_file, 0s).is_ok());  // held by d
  }
  CHECK_OK(FileLock::acquire(lock_file, 0s));  // d is gone
}

TEST_CASE("a FileLock and another process's flock(1) on the same file exclude each other") {
  TempDir dir("lock_process");
  const fs::path lock_file = dir / "synth.lock";
  const fs::path ready = dir / "ready";
  // One process holds the lock on its descriptor 9 (flock(1) locks the shell's open file),
  // says so, and becomes `sleep`, keeping the descriptor: killing it releases the lock.
  segflow::testing::ChildProcess holder({"sh", "-c",
                                         "exec 9>\"$0\" && flock 9 && touch \"$1\" && exec sleep 60",
                                         lock_file.string(), ready.string()});
  const auto t0 = std::chrono::steady_clock::now();
  while (!fs::exists(ready) && seconds_since(t0) < 30) std::this_thread::sleep_for(20ms);
  REQUIRE(fs::exists(ready));
  auto blocked = FileLock::acquire(lock_file, 1s);
  CHECK_FALSE(blocked.is_ok());
  holder.kill();  // the process dies: the kernel releases its lock
  CHECK_OK(FileLock::acquire(lock_file, 5s));
}

TEST_CASE(
    "a lock file's missing folder is made, and a folder that cannot be made is an io_error naming the file") {
  TempDir dir("lock_folder");
  const fs::path nested = dir / "state" / "locks" / "db.lock";
  REQUIRE_OK_AND_ASSIGN(auto lock, FileLock::acquire(nested, 0s));
  CHECK(fs::exists(nested));

  write_file(dir / "plain_file", "not a folder");
  const fs::path impossible = dir / "plain_file" / "db.lock";
  auto r = FileLock::acquire(impossible, 0s);
  REQUIRE_FALSE(r.is_ok());
  CHECK(r.status().code() == ErrorCode::io_error);
  CHECK(contains(r.status().message(), impossible.string() + ": cannot open the lock file: "));
}

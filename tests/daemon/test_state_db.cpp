// The daemon's state database (daemon/state_db.hpp): a job's typed record survives a restart,
// the kind of its failure included, and a database written before that column existed gains it.
#include <doctest/doctest.h>

#include <filesystem>

#include "daemon/state_db.hpp"
#include "test_util.hpp"

namespace fs = std::filesystem;
namespace sd = segflow::daemon;
using segflow::ErrorCode;
using segflow::testing::run_command;
using segflow::testing::shell_quote;
using segflow::testing::TempDir;

namespace {

sd::JobRecord failed_job(ErrorCode error) {
  sd::JobRecord j;
  j.name = "auto-infer";
  j.kind = sd::JobKind::infer;
  j.file = "<inline>";
  j.config_yaml = "{}";
  j.state = sd::JobState::failed;
  j.reason = "seg.dcm: labels: expected at least one label value > 0, got none";
  j.error = error;
  return j;
}

}  // namespace

TEST_CASE("a failed job's state and the kind of its failure survive reopening the state database") {
  TempDir dir("state_db_error");
  const fs::path file = dir / "state.db";
  std::int64_t empty_id = 0, other_id = 0;
  {
    REQUIRE_OK_AND_ASSIGN(auto db, sd::StateDb::open(file));
    REQUIRE_OK_AND_ASSIGN(empty_id, db->insert_job(failed_job(ErrorCode::no_foreground)));
    REQUIRE_OK_AND_ASSIGN(other_id, db->insert_job(failed_job(ErrorCode::ok)));
    auto other = failed_job(ErrorCode::io_error);
    other.id = other_id;
    REQUIRE_OK(db->update_job(other));
  }
  REQUIRE_OK_AND_ASSIGN(auto db, sd::StateDb::open(file));
  REQUIRE_OK_AND_ASSIGN(auto jobs, db->jobs());
  REQUIRE(jobs.size() == 2);
  CHECK(jobs[0].id == empty_id);
  CHECK(jobs[0].state == sd::JobState::failed);
  CHECK(jobs[0].error == ErrorCode::no_foreground);
  CHECK(jobs[1].error == ErrorCode::io_error);
  // Stored by name, as the states are (sqlite3, the command-line tool, reads it).
  auto r = run_command("sqlite3 " + shell_quote(file) + " 'SELECT error FROM jobs ORDER BY id' 2>&1");
  REQUIRE(r.exit_code == 0);
  CHECK(r.out == "no_foreground\nio_error\n");
}

TEST_CASE("a state database from before typed failures gains the error column and reads as no error") {
  TempDir dir("state_db_migrate");
  const fs::path file = dir / "state.db";
  {
    REQUIRE_OK_AND_ASSIGN(auto db, sd::StateDb::open(file));
    REQUIRE_OK(db->insert_job(failed_job(ErrorCode::no_foreground)).status());
  }
  auto drop = run_command("sqlite3 " + shell_quote(file) + " 'ALTER TABLE jobs DROP COLUMN error' 2>&1");
  REQUIRE_MESSAGE(drop.exit_code == 0, drop.out);
  REQUIRE_OK_AND_ASSIGN(auto db, sd::StateDb::open(file));
  REQUIRE_OK_AND_ASSIGN(auto jobs, db->jobs());
  REQUIRE(jobs.size() == 1);
  CHECK(jobs[0].state == sd::JobState::failed);
  CHECK(jobs[0].error == ErrorCode::ok);
}

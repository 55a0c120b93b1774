#include "daemon/state_db.hpp"

#include <sqlite3.h>

#include <chrono>
#include <cmath>
#include <limits>

namespace segflow::daemon {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
INSERT OR IGNORE INTO meta (key, value) VALUES ('schema', '1');
CREATE TABLE IF NOT EXISTS jobs (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  name TEXT NOT NULL,
  file TEXT NOT NULL,
  config_yaml TEXT NOT NULL,
  overrides TEXT NOT NULL,
  state TEXT NOT NULL,
  reason TEXT NOT NULL,
  device TEXT NOT NULL,
  run_dir TEXT NOT NULL,
  dataset TEXT NOT NULL,
  epoch INTEGER NOT NULL,
  epochs INTEGER NOT NULL,
  step INTEGER NOT NULL,
  checkpoint_epoch INTEGER NOT NULL,
  loss REAL,
  best_dice REAL,
  samples_per_s REAL,
  created REAL NOT NULL,
  updated REAL NOT NULL,
  kind TEXT NOT NULL DEFAULT 'train',
  error TEXT NOT NULL DEFAULT '');
CREATE TABLE IF NOT EXISTS datasets (
  name TEXT PRIMARY KEY,
  path TEXT NOT NULL,
  layout TEXT NOT NULL,
  error TEXT NOT NULL,
  updated REAL NOT NULL);
CREATE TABLE IF NOT EXISTS cases (
  dataset TEXT NOT NULL,
  case_id TEXT NOT NULL,
  files TEXT NOT NULL,
  size INTEGER NOT NULL,
  mtime_ns INTEGER NOT NULL,
  status TEXT NOT NULL,
  reason TEXT NOT NULL,
  PRIMARY KEY (dataset, case_id));
CREATE TABLE IF NOT EXISTS dicom_sends (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  file TEXT NOT NULL,
  source TEXT NOT NULL,
  sop_class_uid TEXT NOT NULL,
  sop_instance_uid TEXT NOT NULL,
  state TEXT NOT NULL,
  attempts INTEGER NOT NULL,
  next_attempt REAL NOT NULL,
  last_error TEXT NOT NULL,
  destination TEXT NOT NULL,
  created REAL NOT NULL,
  updated REAL NOT NULL,
  target TEXT NOT NULL DEFAULT '');
CREATE INDEX IF NOT EXISTS dicom_sends_due ON dicom_sends (state, next_attempt);
CREATE INDEX IF NOT EXISTS dicom_sends_instance ON dicom_sends (sop_instance_uid);
CREATE TABLE IF NOT EXISTS dicom_fetches (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  source TEXT NOT NULL,
  study TEXT NOT NULL,
  series TEXT NOT NULL,
  state TEXT NOT NULL,
  attempts INTEGER NOT NULL,
  next_attempt REAL NOT NULL,
  series_total INTEGER NOT NULL,
  series_done TEXT NOT NULL,
  instances INTEGER NOT NULL,
  skipped INTEGER NOT NULL,
  bytes INTEGER NOT NULL,
  last_error TEXT NOT NULL,
  created REAL NOT NULL,
  updated REAL NOT NULL);
)sql";

/// A prepared statement, finalized on destruction.
class Stmt {
 public:
  Stmt(sqlite3* db, const char* sql) { rc_ = sqlite3_prepare_v2(db, sql, -1, &s_, nullptr); }
  ~Stmt() { sqlite3_finalize(s_); }
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;
  bool ok() const { return rc_ == SQLITE_OK && s_ != nullptr; }
  Stmt& bind(int i, const std::string& v) {
    sqlite3_bind_text(s_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
    return *this;
  }
  Stmt& bind(int i, std::int64_t v) {
    sqlite3_bind_int64(s_, i, v);
    return *this;
  }
  Stmt& bind(int i, double v) {
    if (std::isfinite(v))
      sqlite3_bind_double(s_, i, v);
    else
      sqlite3_bind_null(s_, i);
    return *this;
  }
  /// Makes the statement ready to run again with new bindings.
  void reset() {
    sqlite3_reset(s_);
    sqlite3_clear_bindings(s_);
  }
  /// SQLITE_ROW, SQLITE_DONE or an error code.
  int step() { return sqlite3_step(s_); }
  std::string text(int c) const {
    const auto* p = sqlite3_column_text(s_, c);
    return p ? std::string(reinterpret_cast<const char*>(p),
                           static_cast<std::size_t>(sqlite3_column_bytes(s_, c)))
             : std::string();
  }
  std::int64_t integer(int c) const { return sqlite3_column_int64(s_, c); }
  double real(int c) const {
    return sqlite3_column_type(s_, c) == SQLITE_NULL ? std::numeric_limits<double>::quiet_NaN()
                                                     : sqlite3_column_double(s_, c);
  }

 private:
  sqlite3_stmt* s_ = nullptr;
  int rc_ = SQLITE_ERROR;
};

json to_json_array(const std::vector<std::string>& v) {
  json a = json::array();
  for (const auto& s : v) a.push_back(s);
  return a;
}

std::vector<std::string> from_json_array(const std::string& text) {
  std::vector<std::string> out;
  try {
    for (const auto& s : json::parse(text))
      if (s.is_string()) out.push_back(s.get<std::string>());
  } catch (...) {
  }
  return out;
}

/// A stored state name; one this daemon does not know (a newer daemon's, an edited database)
/// makes the job failed with the reason, so it is shown and never run.
void read_state(JobRecord& j, const std::string& text) {
  auto state = parse_job_state(text);
  if (state.is_ok()) {
    j.state = *state;
    return;
  }
  j.state = JobState::failed;
  j.reason = "stored " + state.status().message();
}

/// An error code as stored: "" for ok, else its name ("no_foreground").
std::string error_name(ErrorCode code) { return code == ErrorCode::ok ? "" : to_string(code); }

}  // namespace

double StateDb::now() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

Status StateDb::fail(const std::string& what) const {
  return io_error(file_.string() + ": " + what + ": " + sqlite3_errmsg(db_));
}

Status StateDb::exec(const std::string& sql) {
  char* err = nullptr;
  if (sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &err) != SQLITE_OK) {
    std::string m = err ? err : "unknown error";
    sqlite3_free(err);
    return io_error(file_.string() + ": " + m);
  }
  return Status::ok();
}

Result<std::unique_ptr<StateDb>> StateDb::open(const fs::path& file) {
  sqlite3* db = nullptr;
  const int rc = sqlite3_open_v2(file.c_str(), &db,
                                 SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX, nullptr);
  if (rc != SQLITE_OK) {
    std::string m = db ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    return io_error(file.string() + ": cannot open the state database: " + m);
  }
  std::unique_ptr<StateDb> s(new StateDb(db, file));
  sqlite3_busy_timeout(db, 5000);
  SEGFLOW_RETURN_IF_ERROR(
      s->exec("PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA foreign_keys=ON;"));
  SEGFLOW_RETURN_IF_ERROR(s->exec(kSchema));
  // Databases written before inference jobs existed have no kind column: add it (train).
  {
    Stmt probe(db, "SELECT kind FROM jobs LIMIT 0");
    if (!probe.ok())
      SEGFLOW_RETURN_IF_ERROR(s->exec("ALTER TABLE jobs ADD COLUMN kind TEXT NOT NULL DEFAULT 'train'"));
  }
  // ... nor, before typed failures, an error column: add it ("" = ok).
  {
    Stmt probe(db, "SELECT error FROM jobs LIMIT 0");
    if (!probe.ok())
      SEGFLOW_RETURN_IF_ERROR(s->exec("ALTER TABLE jobs ADD COLUMN error TEXT NOT NULL DEFAULT ''"));
  }
  // ... nor did sends have a named destination: add it ("" = dicom.send_to).
  {
    Stmt probe(db, "SELECT target FROM dicom_sends LIMIT 0");
    if (!probe.ok())
      SEGFLOW_RETURN_IF_ERROR(s->exec("ALTER TABLE dicom_sends ADD COLUMN target TEXT NOT NULL DEFAULT ''"));
  }
  return s;
}

StateDb::~StateDb() { sqlite3_close(db_); }

Result<std::int64_t> StateDb::insert_job(JobRecord j) {
  std::lock_guard<std::mutex> lock(mu_);
  Stmt s(
      db_,
      "INSERT INTO jobs (name, file, config_yaml, overrides, state, reason, device, run_dir, dataset, epoch, "
      "epochs, step, checkpoint_epoch, loss, best_dice, samples_per_s, created, updated, kind, error) "
      "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)");
  if (!s.ok()) return fail("insert job");
  s.bind(1, j.name).bind(2, j.file).bind(3, j.config_yaml).bind(4, to_json_array(j.overrides).dump());
  s.bind(5, std::string(to_string(j.state)))
      .bind(6, j.reason)
      .bind(7, j.device)
      .bind(8, j.run_dir)
      .bind(9, j.dataset);
  s.bind(10, j.epoch).bind(11, j.epochs).bind(12, j.step).bind(13, j.checkpoint_epoch);
  s.bind(14, j.loss).bind(15, j.best_dice).bind(16, j.samples_per_s).bind(17, j.created).bind(18, j.updated);
  s.bind(19, std::string(to_string(j.kind))).bind(20, error_name(j.error));
  if (s.step() != SQLITE_DONE) return fail("insert job");
  return static_cast<std::int64_t>(sqlite3_last_insert_rowid(db_));
}

Status StateDb::update_job(const JobRecord& j) {
  std::lock_guard<std::mutex> lock(mu_);
  Stmt s(
      db_,
      "UPDATE jobs SET name=?, file=?, config_yaml=?, overrides=?, state=?, reason=?, device=?, run_dir=?, "
      "dataset=?, epoch=?, epochs=?, step=?, checkpoint_epoch=?, loss=?, best_dice=?, samples_per_s=?, "
      "updated=?, kind=?, error=? WHERE id=?");
  if (!s.ok()) return fail("update job");
  s.bind(1, j.name).bind(2, j.file).bind(3, j.config_yaml).bind(4, to_json_array(j.overrides).dump());
  s.bind(5, std::string(to_string(j.state)))
      .bind(6, j.reason)
      .bind(7, j.device)
      .bind(8, j.run_dir)
      .bind(9, j.dataset);
  s.bind(10, j.epoch).bind(11, j.epochs).bind(12, j.step).bind(13, j.checkpoint_epoch);
  s.bind(14, j.loss)
      .bind(15, j.best_dice)
      .bind(16, j.samples_per_s)
      .bind(17, now())
      .bind(18, std::string(to_string(j.kind)))
      .bind(19, error_name(j.error))
      .bind(20, j.id);
  if (s.step() != SQLITE_DONE) return fail("update job " + std::to_string(j.id));
  return Status::ok();
}

Result<std::vector<JobRecord>> StateDb::jobs() {
  std::lock_guard<std::mutex> lock(mu_);
  Stmt s(db_,
         "SELECT id, name, file, config_yaml, overrides, state, reason, device, run_dir, dataset, epoch, "
         "epochs, "
         "step, checkpoint_epoch, loss, best_dice, samples_per_s, created, updated, kind, error FROM jobs "
         "ORDER BY id");
  if (!s.ok()) return fail("read jobs");
  std::vector<JobRecord> out;
  int rc;
  while ((rc = s.step()) == SQLITE_ROW) {
    JobRecord j;
    j.id = s.integer(0);
    j.name = s.text(1);
    j.file = s.text(2);
    j.config_yaml = s.text(3);
    j.overrides = from_json_array(s.text(4));
    j.reason = s.text(6);
    read_state(j, s.text(5));
    j.device = s.text(7);
    j.run_dir = s.text(8);
    j.dataset = s.text(9);
    j.epoch = s.integer(10);
    j.epochs = s.integer(11);
    j.step = s.integer(12);
    j.checkpoint_epoch = s.integer(13);
    j.loss = s.real(14);
    j.best_dice = s.real(15);
    j.samples_per_s = s.real(16);
    j.created = s.real(17);
    j.updated = s.real(18);
    auto kind = parse_job_kind(s.text(19));
    j.kind = kind.is_ok() ? *kind : JobKind::train;  // every kind but infer runs as training
    auto error = parse_error_code(s.text(20).empty() ? "ok" : s.text(20));
    j.error = error.is_ok() ? *error : ErrorCode::internal;  // a newer daemon's kind of error
    out.push_back(std::move(j));
  }
  if (rc != SQLITE_DONE) return fail("read jobs");
  return out;
}

Status StateDb::replace_dataset(const DatasetRecord& d, const std::vector<CaseRecord>& cases) {
  std::lock_guard<std::mutex> lock(mu_);
  SEGFLOW_RETURN_IF_ERROR(exec("BEGIN IMMEDIATE"));
  auto rollback = [&](Status st) {
    (void)exec("ROLLBACK");
    return st;
  };
  {
    Stmt s(db_, "INSERT OR REPLACE INTO datasets (name, path, layout, error, updated) VALUES (?,?,?,?,?)");
    if (!s.ok()) return rollback(fail("write dataset"));
    s.bind(1, d.name).bind(2, d.path).bind(3, d.layout).bind(4, d.error).bind(5, now());
    if (s.step() != SQLITE_DONE) return rollback(fail("write dataset " + d.name));
  }
  {
    Stmt s(db_, "DELETE FROM cases WHERE dataset=?");
    if (!s.ok()) return rollback(fail("write cases"));
    s.bind(1, d.name);
    if (s.step() != SQLITE_DONE) return rollback(fail("write cases of " + d.name));
  }
  {
    Stmt s(db_,
           "INSERT OR REPLACE INTO cases (dataset, case_id, files, size, mtime_ns, status, reason) "
           "VALUES (?,?,?,?,?,?,?)");
    if (!s.ok()) return rollback(fail("write cases"));
    for (const auto& c : cases) {
      s.reset();
      s.bind(1, d.name).bind(2, c.case_id).bind(3, c.files.dump()).bind(4, c.size).bind(5, c.mtime_ns);
      s.bind(6, c.status).bind(7, c.reason);
      if (s.step() != SQLITE_DONE) return rollback(fail("write case " + c.case_id));
    }
  }
  Status committed = exec("COMMIT");
  if (!committed.is_ok()) return rollback(committed);
  return Status::ok();
}

Status StateDb::remove_dataset(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const char* sql : {"DELETE FROM cases WHERE dataset=?", "DELETE FROM datasets WHERE name=?"}) {
    Stmt s(db_, sql);
    if (!s.ok()) return fail("remove dataset");
    s.bind(1, name);
    if (s.step() != SQLITE_DONE) return fail("remove dataset " + name);
  }
  return Status::ok();
}

Result<std::vector<DatasetRecord>> StateDb::datasets() {
  std::lock_guard<std::mutex> lock(mu_);
  Stmt s(db_, "SELECT name, path, layout, error, updated FROM datasets ORDER BY name");
  if (!s.ok()) return fail("read datasets");
  std::vector<DatasetRecord> out;
  int rc;
  while ((rc = s.step()) == SQLITE_ROW)
    out.push_back({s.text(0), s.text(1), s.text(2), s.text(3), s.real(4)});
  if (rc != SQLITE_DONE) return fail("read datasets");
  return out;
}

Result<std::vector<CaseRecord>> StateDb::cases(const std::string& dataset) {
  std::lock_guard<std::mutex> lock(mu_);
  Stmt s(db_,
         dataset.empty()
             ? "SELECT dataset, case_id, files, size, mtime_ns, status, reason FROM cases ORDER BY dataset, "
               "case_id"
             : "SELECT dataset, case_id, files, size, mtime_ns, status, reason FROM cases WHERE dataset=? "
               "ORDER BY case_id");
  if (!s.ok()) return fail("read cases");
  if (!dataset.empty()) s.bind(1, dataset);
  std::vector<CaseRecord> out;
  int rc;
  while ((rc = s.step()) == SQLITE_ROW) {
    CaseRecord c;
    c.dataset = s.text(0);
    c.case_id = s.text(1);
    try {
      c.files = json::parse(s.text(2));
    } catch (...) {
      c.files = json::array();
    }
    c.size = s.integer(3);
    c.mtime_ns = s.integer(4);
    c.status = s.text(5);
    c.reason = s.text(6);
    out.push_back(std::move(c));
  }
  if (rc != SQLITE_DONE) return fail("read cases");
  return out;
}

namespace {

constexpr const char* kSendColumns =
    "id, file, source, sop_class_uid, sop_instance_uid, state, attempts, next_attempt, last_error, "
    "destination, created, updated, target";

DicomSendRecord read_send(const Stmt& s) {
  DicomSendRecord r;
  r.id = s.integer(0);
  r.file = s.text(1);
  r.source = s.text(2);
  r.sop_class_uid = s.text(3);
  r.sop_instance_uid = s.text(4);
  r.state = s.text(5);
  r.attempts = s.integer(6);
  r.next_attempt = s.real(7);
  r.last_error = s.text(8);
  r.destination = s.text(9);
  r.created = s.real(10);
  r.updated = s.real(11);
  r.target = s.text(12);
  return r;
}

/// Every row of `s`, each read by `read`, appended to `out`; false when a step fails.
template <class T, class Read>
bool read_rows(Stmt& s, std::vector<T>& out, Read read) {
  int rc;
  while ((rc = s.step()) == SQLITE_ROW) out.push_back(read(s));
  return rc == SQLITE_DONE;
}

}  // namespace

Result<std::int64_t> StateDb::insert_dicom_send(const DicomSendRecord& r) {
  std::lock_guard<std::mutex> lock(mu_);
  Stmt s(db_,
         "INSERT INTO dicom_sends (file, source, sop_class_uid, sop_instance_uid, state, attempts, "
         "next_attempt, last_error, destination, created, updated, target) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)");
  if (!s.ok()) return fail("queue a DICOM send");
  const double t = now();
  s.bind(1, r.file).bind(2, r.source).bind(3, r.sop_class_uid).bind(4, r.sop_instance_uid).bind(5, r.state);
  s.bind(6, r.attempts).bind(7, r.next_attempt).bind(8, r.last_error).bind(9, r.destination);
  s.bind(10, t).bind(11, t).bind(12, r.target);
  if (s.step() != SQLITE_DONE) return fail("queue a DICOM send");
  return static_cast<std::int64_t>(sqlite3_last_insert_rowid(db_));
}

Status StateDb::update_dicom_send(const DicomSendRecord& r) {
  std::lock_guard<std::mutex> lock(mu_);
  Stmt s(db_,
         "UPDATE dicom_sends SET state=?, attempts=?, next_attempt=?, last_error=?, destination=?, updated=? "
         "WHERE id=?");
  if (!s.ok()) return fail("update DICOM send");
  s.bind(1, r.state).bind(2, r.attempts).bind(3, r.next_attempt).bind(4, r.last_error).bind(5, r.destination);
  s.bind(6, now()).bind(7, r.id);
  if (s.step() != SQLITE_DONE) return fail("update DICOM send " + std::to_string(r.id));
  return Status::ok();
}

Result<std::vector<DicomSendRecord>> StateDb::due_dicom_sends(double at, std::int64_t limit) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string sql = std::string("SELECT ") + kSendColumns +
                          " FROM dicom_sends WHERE state='queued' AND next_attempt<=? ORDER BY id LIMIT ?";
  Stmt s(db_, sql.c_str());
  if (!s.ok()) return fail("read DICOM sends");
  s.bind(1, at).bind(2, limit);
  std::vector<DicomSendRecord> out;
  if (!read_rows(s, out, read_send)) return fail("read DICOM sends");
  return out;
}

Result<DicomSendRecord> StateDb::dicom_send(std::int64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string sql = std::string("SELECT ") + kSendColumns + " FROM dicom_sends WHERE id=?";
  Stmt s(db_, sql.c_str());
  if (!s.ok()) return fail("read DICOM send");
  s.bind(1, id);
  const int rc = s.step();
  if (rc == SQLITE_ROW) return read_send(s);
  if (rc != SQLITE_DONE) return fail("read DICOM send " + std::to_string(id));
  return DicomSendRecord{};
}

Result<std::vector<DicomSendRecord>> StateDb::dicom_sends(std::int64_t limit) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string sql =
      std::string("SELECT ") + kSendColumns + " FROM dicom_sends ORDER BY id DESC LIMIT ?";
  Stmt s(db_, sql.c_str());
  if (!s.ok()) return fail("read DICOM sends");
  s.bind(1, limit);
  std::vector<DicomSendRecord> out;
  if (!read_rows(s, out, read_send)) return fail("read DICOM sends");
  return out;
}

Result<std::vector<std::pair<std::string, std::int64_t>>> StateDb::state_counts(const std::string& table,
                                                                                const std::string& what) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string sql = "SELECT state, COUNT(*) FROM " + table + " GROUP BY state ORDER BY state";
  Stmt s(db_, sql.c_str());
  if (!s.ok()) return fail("count " + what);
  std::vector<std::pair<std::string, std::int64_t>> out;
  if (!read_rows(s, out, [](const Stmt& r) { return std::make_pair(r.text(0), r.integer(1)); }))
    return fail("count " + what);
  return out;
}

Result<std::vector<std::pair<std::string, std::int64_t>>> StateDb::dicom_send_counts() {
  return state_counts("dicom_sends", "DICOM sends");
}

Result<DicomSendRecord> StateDb::find_dicom_send(const std::string& sop_instance_uid,
                                                 const std::string& target) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string sql =
      std::string("SELECT ") + kSendColumns +
      " FROM dicom_sends WHERE sop_instance_uid=? AND target=? AND state IN ('queued', 'sent') "
      "ORDER BY id DESC LIMIT 1";
  Stmt s(db_, sql.c_str());
  if (!s.ok()) return fail("read DICOM sends");
  s.bind(1, sop_instance_uid).bind(2, target);
  const int rc = s.step();
  if (rc == SQLITE_ROW) return read_send(s);
  if (rc != SQLITE_DONE) return fail("read DICOM sends");
  return DicomSendRecord{};
}

namespace {

constexpr const char* kFetchColumns =
    "id, source, study, series, state, attempts, next_attempt, series_total, series_done, instances, "
    "skipped, "
    "bytes, last_error, created, updated";

DicomFetchRecord read_fetch(const Stmt& s) {
  DicomFetchRecord r;
  r.id = s.integer(0);
  r.source = s.text(1);
  r.study = s.text(2);
  r.series = s.text(3);
  r.state = s.text(4);
  r.attempts = s.integer(5);
  r.next_attempt = s.real(6);
  r.series_total = s.integer(7);
  r.series_done = json::parse(s.text(8), nullptr, false);
  if (!r.series_done.is_array()) r.series_done = json::array();
  r.instances = s.integer(9);
  r.skipped = s.integer(10);
  r.bytes = s.integer(11);
  r.last_error = s.text(12);
  r.created = s.real(13);
  r.updated = s.real(14);
  return r;
}

}  // namespace

Result<std::int64_t> StateDb::insert_dicom_fetch(const DicomFetchRecord& r) {
  std::lock_guard<std::mutex> lock(mu_);
  Stmt s(db_,
         "INSERT INTO dicom_fetches (source, study, series, state, attempts, next_attempt, series_total, "
         "series_done, instances, skipped, bytes, last_error, created, updated) VALUES "
         "(?,?,?,?,?,?,?,?,?,?,?,?,?,?)");
  if (!s.ok()) return fail("queue a DICOM fetch");
  const double t = now();
  s.bind(1, r.source).bind(2, r.study).bind(3, r.series).bind(4, r.state).bind(5, r.attempts);
  s.bind(6, r.next_attempt).bind(7, r.series_total).bind(8, r.series_done.dump()).bind(9, r.instances);
  s.bind(10, r.skipped).bind(11, r.bytes).bind(12, r.last_error).bind(13, t).bind(14, t);
  if (s.step() != SQLITE_DONE) return fail("queue a DICOM fetch");
  return static_cast<std::int64_t>(sqlite3_last_insert_rowid(db_));
}

Status StateDb::update_dicom_fetch(const DicomFetchRecord& r) {
  std::lock_guard<std::mutex> lock(mu_);
  Stmt s(db_,
         "UPDATE dicom_fetches SET state=?, attempts=?, next_attempt=?, series_total=?, series_done=?, "
         "instances=?, skipped=?, bytes=?, last_error=?, updated=? WHERE id=?");
  if (!s.ok()) return fail("update DICOM fetch");
  s.bind(1, r.state).bind(2, r.attempts).bind(3, r.next_attempt).bind(4, r.series_total);
  s.bind(5, r.series_done.dump()).bind(6, r.instances).bind(7, r.skipped).bind(8, r.bytes);
  s.bind(9, r.last_error).bind(10, now()).bind(11, r.id);
  if (s.step() != SQLITE_DONE) return fail("update DICOM fetch " + std::to_string(r.id));
  return Status::ok();
}

Result<std::vector<DicomFetchRecord>> StateDb::due_dicom_fetches(double at, std::int64_t limit) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string sql = std::string("SELECT ") + kFetchColumns +
                          " FROM dicom_fetches WHERE state='queued' AND next_attempt<=? ORDER BY id LIMIT ?";
  Stmt s(db_, sql.c_str());
  if (!s.ok()) return fail("read DICOM fetches");
  s.bind(1, at).bind(2, limit);
  std::vector<DicomFetchRecord> out;
  if (!read_rows(s, out, read_fetch)) return fail("read DICOM fetches");
  return out;
}

Result<std::vector<DicomFetchRecord>> StateDb::dicom_fetches(std::int64_t limit) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string sql =
      std::string("SELECT ") + kFetchColumns + " FROM dicom_fetches ORDER BY id DESC LIMIT ?";
  Stmt s(db_, sql.c_str());
  if (!s.ok()) return fail("read DICOM fetches");
  s.bind(1, limit);
  std::vector<DicomFetchRecord> out;
  if (!read_rows(s, out, read_fetch)) return fail("read DICOM fetches");
  return out;
}

Result<std::vector<std::pair<std::string, std::int64_t>>> StateDb::dicom_fetch_counts() {
  return state_counts("dicom_fetches", "DICOM fetches");
}

Status StateDb::requeue_running_fetches() {
  std::lock_guard<std::mutex> lock(mu_);
  Stmt s(db_, "UPDATE dicom_fetches SET state='queued' WHERE state='running'");
  if (!s.ok() || s.step() != SQLITE_DONE) return fail("requeue DICOM fetches");
  return Status::ok();
}

Result<std::string> StateDb::meta(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  Stmt s(db_, "SELECT value FROM meta WHERE key=?");
  if (!s.ok()) return fail("read meta " + key);
  s.bind(1, key);
  const int rc = s.step();
  if (rc == SQLITE_ROW) return s.text(0);
  if (rc != SQLITE_DONE) return fail("read meta " + key);
  return std::string();
}

Status StateDb::set_meta(const std::string& key, const std::string& value) {
  std::lock_guard<std::mutex> lock(mu_);
  Stmt s(db_, "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)");
  if (!s.ok()) return fail("write meta " + key);
  s.bind(1, key).bind(2, value);
  if (s.step() != SQLITE_DONE) return fail("write meta " + key);
  return Status::ok();
}

}  // namespace segflow::daemon

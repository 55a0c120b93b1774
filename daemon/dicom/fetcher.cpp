#include "daemon/dicom/fetcher.hpp"

#include <unistd.h>

#include <dcmtk/config/osconfig.h>
#include <dcmtk/dcmdata/dcdeftag.h>
#include <dcmtk/dcmdata/dcfilefo.h>
#include <dcmtk/dcmdata/dcmetinf.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <fstream>
#include <mutex>
#include <thread>

#include "daemon/dicom/dicomweb.hpp"
#include "daemon/dicom/sender.hpp"
#include "daemon/dicom/store.hpp"
#include "daemon/dicom/tags.hpp"
#include "messages/log.hpp"

namespace segflow::daemon::dicom {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

/// SOP class and instance UIDs of a received file: the data set's, else the meta header's.
std::pair<std::string, std::string> sop_uids(const fs::path& file) {
  DcmFileFormat ff;
  if (ff.loadFile(OFFilename(file.c_str()), EXS_Unknown, EGL_noChange, 256).bad()) return {};
  std::string cls = tag_text(*ff.getDataset(), DCM_SOPClassUID);
  std::string inst = tag_text(*ff.getDataset(), DCM_SOPInstanceUID);
  if (cls.empty()) cls = tag_text(*ff.getMetaInfo(), DCM_MediaStorageSOPClassUID);
  if (inst.empty()) inst = tag_text(*ff.getMetaInfo(), DCM_MediaStorageSOPInstanceUID);
  return {cls, inst};
}

json fetch_json(const DicomFetchRecord& r) {
  return {{"id", r.id},
          {"source", r.source},
          {"study", r.study},
          {"series", r.series},
          {"state", r.state},
          {"attempts", r.attempts},
          {"next_attempt", r.next_attempt},
          {"series_total", r.series_total},
          {"series_done", r.series_done.size()},
          {"instances", r.instances},
          {"skipped", r.skipped},
          {"bytes", r.bytes},
          {"last_error", r.last_error},
          {"created", r.created},
          {"updated", r.updated}};
}

}  // namespace

struct DicomFetcher::Impl {
  DicomSettings s;
  DicomStore& store;
  StateDb& db;
  std::thread thread;
  std::atomic<bool> stopping{false};
  std::mutex mu;
  std::condition_variable wake;

  Impl(DicomSettings settings, DicomStore& st, StateDb& d) : s(std::move(settings)), store(st), db(d) {}

  void save(const DicomFetchRecord& r) {
    if (Status st = db.update_dicom_fetch(r); !st.is_ok()) log::error("dicom: " + st.message());
  }

  std::string name(const DicomFetchRecord& r) const {
    return "fetch " + std::to_string(r.id) + " of study " + r.study +
           (r.series.empty() ? std::string() : " series " + r.series) + " from " + r.source;
  }

  /// One failed attempt: retried with back-off when the error may pass (io_error), else
  /// failed at once.
  void attempt_failed(DicomFetchRecord& r, const Status& why, const DicomDestination* d) {
    r.last_error = why.message();
    const bool retry = d && why.code() == ErrorCode::io_error && r.attempts < d->max_attempts;
    if (retry) {
      const double delay = retry_delay_s(*d, r.attempts);
      r.state = "queued";
      r.next_attempt = StateDb::now() + delay;
      log::warn("dicom: " + name(r) + ": attempt " + std::to_string(r.attempts) + " failed: " + r.last_error +
                "; next attempt in " + std::to_string(delay) + " s");
    } else {
      r.state = "failed";
      log::error("dicom: " + name(r) + " failed after " + std::to_string(r.attempts) + " attempt" +
                 (r.attempts == 1 ? "" : "s") + ": " + r.last_error);
    }
    save(r);
  }

  /// Retrieves one series by WADO-RS and files it into the dataset (all of it or nothing).
  Status fetch_series(WebClient& client, DicomFetchRecord& r, const WebSeries& series, std::size_t index) {
    SEGFLOW_ASSIGN_OR_RETURN(auto batch, store.begin("f" + std::to_string(::getpid()) + "-" +
                                                     std::to_string(r.id) + "-" + std::to_string(index)));
    const fs::path body = store.staging_dir() / ("fetch-" + std::to_string(r.id) + ".body");
    std::int64_t instances = 0, skipped = 0, bytes = 0;
    auto parts = wado_series(client, r.study, series.uid, body, [&](std::string_view part) -> Status {
      if (stopping.load()) return io_error("segflowd is stopping");
      const fs::path tmp = batch->incoming_path();
      {
        std::ofstream out(tmp, std::ios::binary);
        out.write(part.data(), static_cast<std::streamsize>(part.size()));
        if (!out) return io_error(tmp.string() + ": cannot write a retrieved instance");
      }
      const auto [cls, inst] = sop_uids(tmp);
      const auto& classes = stored_sop_classes();
      if (std::find(classes.begin(), classes.end(), cls) == classes.end()) {
        std::error_code ec;
        fs::remove(tmp, ec);
        ++skipped;  // a report, a presentation state, ...: not a dataset's
        return Status::ok();
      }
      const StoredInstance si = batch->add(tmp, cls, inst);
      if (si.status != 0) {
        ++skipped;
        log::warn("dicom: " + name(r) + ": instance " + inst + " not stored: " + si.error);
        return Status::ok();
      }
      ++instances;
      bytes += si.bytes;
      return Status::ok();
    });
    std::error_code ec;
    fs::remove(body, ec);
    if (!parts.is_ok()) return parts.status();
    SEGFLOW_ASSIGN_OR_RETURN(std::int64_t cases, batch->commit());
    r.instances += instances;
    r.skipped += skipped;
    r.bytes += bytes;
    r.series_done.push_back(series.uid);
    log::info("dicom: " + name(r) + ": series " + series.uid + ": " + std::to_string(instances) +
              " instances stored (" + std::to_string(cases) + " case(s) written" +
              (skipped ? ", " + std::to_string(skipped) + " skipped" : std::string()) +
              (series.instances >= 0 && series.instances != *parts
                   ? "; QIDO-RS listed " + std::to_string(series.instances) + ", WADO-RS returned " +
                         std::to_string(*parts)
                   : std::string()) +
              ")");
    save(r);
    return Status::ok();
  }

  void fetch(DicomFetchRecord& r) {
    auto source = s.web_source(r.source);
    r.attempts += 1;
    if (!source.is_ok()) return attempt_failed(r, invalid_argument(source.status().message()), nullptr);
    const DicomDestination& d = **source;
    r.state = "running";
    save(r);
    WebClient client(d);
    auto list = qido_series(client, r.study, r.series);
    if (!list.is_ok()) return attempt_failed(r, list.status(), &d);
    if (list->empty())
      return attempt_failed(r,
                            not_found("QIDO-RS: " + d.url + " has no " +
                                      (r.series.empty() ? "series of study " + r.study
                                                        : "series " + r.series + " in study " + r.study)),
                            &d);
    r.series_total = static_cast<std::int64_t>(list->size());
    for (std::size_t i = 0; i < list->size(); ++i) {
      const WebSeries& series = (*list)[i];
      const auto& done = r.series_done;
      if (std::find(done.begin(), done.end(), json(series.uid)) != done.end()) continue;
      Status st = fetch_series(client, r, series, i);
      if (stopping.load()) {  // resumed at the next start, from this series
        r.state = "queued";
        r.attempts -= 1;
        save(r);
        return;
      }
      if (!st.is_ok()) return attempt_failed(r, st, &d);
    }
    r.state = "done";
    r.last_error.clear();
    save(r);
    log::info("dicom: " + name(r) + " done: " + std::to_string(r.series_done.size()) + " series, " +
              std::to_string(r.instances) + " instances stored");
  }

  void run() {
    while (!stopping.load()) {
      try {
        auto due = db.due_dicom_fetches(StateDb::now(), 1);
        if (!due.is_ok()) {
          log::error("dicom: " + due.status().message());
        } else if (!due->empty()) {
          fetch(due->front());
          continue;
        }
      } catch (const std::exception& e) {
        log::error(std::string("dicom: fetcher: ") + e.what());
      }
      std::unique_lock<std::mutex> lock(mu);
      wake.wait_for(lock, std::chrono::milliseconds(250), [&] { return stopping.load(); });
    }
  }
};

DicomFetcher::DicomFetcher(DicomSettings settings, DicomStore& store, StateDb& db)
    : impl_(std::make_unique<Impl>(std::move(settings), store, db)) {}

DicomFetcher::~DicomFetcher() { stop(); }

Status DicomFetcher::start() {
  Impl& m = *impl_;
  SEGFLOW_RETURN_IF_ERROR(m.db.requeue_running_fetches());
  m.stopping.store(false);
  m.thread = std::thread([&m] { m.run(); });
  return Status::ok();
}

void DicomFetcher::stop() {
  Impl& m = *impl_;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    m.stopping.store(true);
  }
  m.wake.notify_all();
  if (m.thread.joinable()) m.thread.join();
}

Result<DicomFetchRecord> DicomFetcher::enqueue(const std::string& source, const std::string& study,
                                               const std::string& series) {
  Impl& m = *impl_;
  auto d = m.s.web_source(source);
  if (!d.is_ok()) return invalid_argument("from: " + d.status().message());
  if (!is_valid_uid(study))
    return invalid_argument("study: expected a StudyInstanceUID (digits and dots, at most 64), got \"" +
                            study + "\"");
  if (!series.empty() && !is_valid_uid(series))
    return invalid_argument("series: expected a SeriesInstanceUID (digits and dots, at most 64), got \"" +
                            series + "\"");
  DicomFetchRecord r;
  r.source = source;
  r.study = study;
  r.series = series;
  r.next_attempt = StateDb::now();
  SEGFLOW_ASSIGN_OR_RETURN(r.id, m.db.insert_dicom_fetch(r));
  m.wake.notify_all();
  log::info("dicom: queued " + m.name(r) + " (" + (*d)->url + ")");
  return r;
}

Result<json> DicomFetcher::stats() const {
  const Impl& m = *impl_;
  json out = {{"queued", 0}, {"running", 0}, {"done", 0}, {"failed", 0}};
  SEGFLOW_ASSIGN_OR_RETURN(auto counts, m.db.dicom_fetch_counts());
  for (const auto& [state, n] : counts) out[state] = n;
  SEGFLOW_ASSIGN_OR_RETURN(auto fetches, m.db.dicom_fetches(20));
  json list = json::array();
  for (const auto& r : fetches) list.push_back(fetch_json(r));
  out["fetches"] = list;
  return out;
}

}  // namespace segflow::daemon::dicom

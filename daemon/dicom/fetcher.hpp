#pragma once
// Studies pulled, not pushed: `segflow ctl dicom fetch --from NAME --study UID [--series
// UID]` queues a fetch from the DICOMweb destination NAME; a fetcher thread lists the
// study's series by QIDO-RS, retrieves each by WADO-RS (as stored: transfer-syntax=*) and
// files it into the DICOM node's dataset through DicomStore, one series at a time, exactly
// as an association's instances are filed: the whole series appears at once, a series
// already there is merged (byte-identical instances kept as they were), and auto_infer takes
// it as it takes a pushed one. Instances of SOP classes the dataset does not take (reports,
// presentation states) are skipped and counted.
//
// Fetches are kept in the state database: one left running by a stopped (or killed) daemon
// starts again at the next start, from its first series not yet stored. An attempt that gets
// no answer, a 5xx, 401/403, 408 or 429 is retried with the destination's back-off
// (retry_initial_s doubling up to retry_max_s, max_attempts); a study or series the server
// does not have (404, or an empty QIDO-RS answer), another refusal or a malformed answer
// fails the fetch at once.
//
// Threads (no actors): one fetcher thread; enqueue() and stats() are safe from any thread.

#include <nlohmann/json.hpp>

#include <filesystem>
#include <memory>
#include <string>

#include "daemon/dicom/config.hpp"
#include "daemon/state_db.hpp"
#include "messages/status.hpp"

namespace segflow::daemon::dicom {

class DicomStore;

class DicomFetcher {
 public:
  /// `store` (prepared) and `db` outlive the fetcher.
  DicomFetcher(DicomSettings settings, DicomStore& store, StateDb& db);
  ~DicomFetcher();
  DicomFetcher(const DicomFetcher&) = delete;
  DicomFetcher& operator=(const DicomFetcher&) = delete;

  /// Queues the fetches a previous daemon left running and starts the thread.
  Status start();
  /// Stops and joins the thread; a fetch in progress stops after its current series (which
  /// is discarded unless stored) and stays queued. Idempotent.
  void stop();

  /// Checks and queues a fetch of `study` (every series, or only `series`) from the DICOMweb
  /// destination `source`. Errors name the field: from (not a DICOMweb destination, listing
  /// those there are), study, series (not a UID).
  Result<DicomFetchRecord> enqueue(const std::string& source, const std::string& study,
                                   const std::string& series);

  /// {queued, running, done, failed, fetches: [{id, source, study, series, state, attempts,
  /// next_attempt, series_total, series_done, instances, skipped, bytes, last_error, created,
  /// updated}]} (newest first, at most 20).
  Result<nlohmann::json> stats() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace segflow::daemon::dicom

#pragma once
// Results back to the hospital: a persistent queue of sends to dicom.send_to or a named
// destination of dicom.destinations, kept in the state database so that a restart loses
// nothing. A DICOM destination gets C-STOREs (DCMTK's DcmSCU; over DICOM TLS when it has a
// `tls` section), a DICOMweb one STOW-RS requests (dicomweb.hpp: one instance per request, the
// HTTP status and the FailedSOPSequence read). Each send records its target (the
// destination's name; "" = dicom.send_to); due sends go out one association (or one kept-alive
// HTTP connection) per destination.
//
// enqueue() copies the file into state_dir/dicom-outbox/ (the caller may delete its own)
// and records it as queued. The sender thread sends what is due, several files per
// association, and retries failures with exponential back-off: retry_initial_s after the
// first failed attempt, doubling up to retry_max_s; after max_attempts the send is marked
// failed. A send is done when the peer answers success (0x0000) or a warning (0xBxxx), or
// the STOW-RS answer does not list the instance as failed; the outbox copy is then removed.
// A refusal no retry can change (no presentation context for the SOP class, a permanent
// C-STORE status, an instance in the STOW-RS FailedSOPSequence, a 4xx other than
// 401/403/404/408/429) fails the send at its first attempt. Sends go to the destination configured now under
// their target, so fixing a wrong address and restarting delivers what is still queued; a target no longer
// configured keeps its sends queued (looked at again each minute).
//
// Threads (no actors): one sender thread; enqueue() and stats() are safe from any thread.

#include <nlohmann/json.hpp>

#include <filesystem>
#include <functional>
#include <memory>

#include "daemon/dicom/config.hpp"
#include "daemon/state_db.hpp"
#include "messages/status.hpp"

namespace segflow::daemon::dicom {

class DicomSender {
 public:
  /// `state_dir` absolute; `db` outlives the sender.
  DicomSender(DicomSettings settings, std::filesystem::path state_dir, StateDb& db);
  ~DicomSender();
  DicomSender(const DicomSender&) = delete;
  DicomSender& operator=(const DicomSender&) = delete;

  /// Called on the sender thread after each attempt that ends a send (state sent, or failed
  /// for good) or fails with a retry ahead (state queued, attempts and next_attempt updated).
  using DoneFn = std::function<void(const DicomSendRecord&)>;
  /// Sets the callback of ended sends (before start()).
  void set_on_done(DoneFn fn);

  /// Creates the outbox and starts the sender thread (nothing runs without dicom.send_to).
  Status start();
  /// Stops and joins the thread; an association in progress ends first (bounded by
  /// dicom.idle_timeout_s). What is queued stays queued. Idempotent.
  void stop();

  /// Whether enqueue(file, target) would accept the file (the destination is configured:
  /// dicom.send_to for target "", else dicom.destinations[target]; the file is a DICOM Part
  /// 10 file with SOP class and instance UIDs); the error names the file.
  Status check(const std::filesystem::path& file, const std::string& target = "") const;
  /// Queues a DICOM file (a SEG written by `segflow infer`, or any stored instance with a
  /// SOP class and instance UID) for `target`. Errors name the file and what is wrong with it.
  /// With `once`, an instance already queued or sent to `target` (the same SOP instance UID)
  /// is not queued again: its existing send is returned.
  Result<DicomSendRecord> enqueue(const std::filesystem::path& file, const std::string& target = "",
                                  bool once = false);

  /// {destination (dicom.send_to), destinations: {NAME: AE@host:port}, queued, sent, failed,
  /// sends: [{id, source, sop_class_uid, sop_instance_uid, state, attempts, next_attempt,
  /// last_error, destination, target, created, updated}]} (newest first, at most 50).
  Result<nlohmann::json> stats() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

/// The delay before attempt `attempts + 1` after `attempts` failed ones: retry_initial_s *
/// 2^(attempts - 1), at most retry_max_s.
double retry_delay_s(const DicomDestination& d, std::int64_t attempts);

}  // namespace segflow::daemon::dicom

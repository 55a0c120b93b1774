#pragma once
// The daemon's DICOM side in one object: the store received series go through (store.hpp),
// the storage node (node.hpp) when dicom.port or dicom.tls.port is set, the result sender
// (sender.hpp) when dicom.send_to or dicom.destinations is, the fetcher (fetcher.hpp) when a
// destination is of kind dicomweb, plus the `dicom` control command:
//
//   dicom   send ([FILE, ...], optional: queue these files) to (NAME, optional: for
//           dicom.destinations.NAME instead of dicom.send_to) | fetch (NAME: a DICOMweb
//           destination) study (UID) series (UID, optional)
//           -> node: {listening, address, tls_address, ..., recent: [...]} (node.hpp),
//              sender: {destination, destinations, queued, sent, failed, sends: [...]},
//              fetcher: {queued, running, done, failed, fetches: [...]} (fetcher.hpp),
//              queued: [send ids of the files just queued], fetch: the fetch id just queued
//
// Threading: start() and stop() from the daemon's main thread; command() from the control
// thread (the node, the sender and the fetcher have their own threads).

#include <nlohmann/json.hpp>

#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "daemon/dicom/config.hpp"
#include "daemon/state_db.hpp"
#include "messages/status.hpp"

namespace segflow::daemon::dicom {

class DicomFetcher;
class DicomNode;
class DicomSender;
class DicomStore;

/// The fields of a `dicom` control request.
struct DicomRequest {
  std::vector<std::string> send;  ///< files to queue
  std::string to;                 ///< with send: the dicom.destinations name; "" = dicom.send_to
  std::string fetch;              ///< a DICOMweb destination to fetch from; "" = no fetch
  std::string study, series;      ///< with fetch: the study, and optionally one of its series
};

class DicomService {
 public:
  /// Paths absolute (finalize_daemon_config); `db` outlives the service.
  DicomService(const DicomSettings& settings, std::filesystem::path data_root,
               std::filesystem::path state_dir, StateDb& db);
  ~DicomService();
  DicomService(const DicomService&) = delete;
  DicomService& operator=(const DicomService&) = delete;

  /// Clears the staging folder and starts the node, the sender and the fetcher (those
  /// configured); errors name the key.
  Status start();
  /// Stops them (received series and fetched series in flight are discarded; queued sends
  /// and fetches stay queued).
  void stop();

  /// The `dicom` control command: queues every file of `send` (all or none: each is checked
  /// first) or the fetch, and reports the node, the send queue and the fetches.
  Result<nlohmann::json> command(const DicomRequest& request);

  /// Queues one file for dicom.send_to (target "") or dicom.destinations[target]
  /// (auto_infer's SEGs: an instance queued or sent there before is not queued again);
  /// errors name the file.
  Result<DicomSendRecord> enqueue(const std::filesystem::path& file, const std::string& target = "");
  /// Called on the sender thread after an attempt: the send ended (sent or failed for good) or
  /// waits for a retry (state queued); set before start().
  void set_on_send_done(std::function<void(const DicomSendRecord&)> fn);

 private:
  DicomSettings settings_;
  std::unique_ptr<DicomStore> store_;
  std::unique_ptr<DicomNode> node_;
  std::unique_ptr<DicomSender> sender_;
  std::unique_ptr<DicomFetcher> fetcher_;
};

}  // namespace segflow::daemon::dicom

#pragma once
// The daemon's DICOM side in one object: the storage node (node.hpp) when dicom.port is set
// and the result sender (sender.hpp) when dicom.send_to or dicom.destinations is, plus the
// `dicom` control command:
//
//   dicom   send ([FILE, ...], optional: queue these files) to (NAME, optional: for
//           dicom.destinations.NAME instead of dicom.send_to)
//           -> node: {listening, address, ..., recent: [...]} (node.hpp),
//              sender: {destination, destinations, queued, sent, failed, sends: [...]},
//              queued: [send ids of the files just queued]
//
// Threading: start() and stop() from the daemon's main thread; command() from the control
// thread (the node and the sender have their own threads).

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

class DicomNode;
class DicomSender;

/// The fields of a `dicom` control request.
struct DicomRequest {
  std::vector<std::string> send;  ///< files to queue
  std::string to;                 ///< with send: the dicom.destinations name; "" = dicom.send_to
};

class DicomService {
 public:
  /// Paths absolute (finalize_daemon_config); `db` outlives the service.
  DicomService(const DicomSettings& settings, std::filesystem::path data_root,
               std::filesystem::path state_dir, StateDb& db);
  ~DicomService();
  DicomService(const DicomService&) = delete;
  DicomService& operator=(const DicomService&) = delete;

  /// Starts the node (dicom.port > 0) and the sender (dicom.send_to); errors name the key.
  Status start();
  /// Stops both (received series in flight are discarded; queued sends stay queued).
  void stop();

  /// The `dicom` control command: queues every file of `send` (all or none: each is
  /// checked first) and reports the node and the send queue.
  Result<nlohmann::json> command(const DicomRequest& request);

  /// Queues one file for dicom.send_to (target "") or dicom.destinations[target]
  /// (auto_infer's SEGs); errors name the file.
  Result<DicomSendRecord> enqueue(const std::filesystem::path& file, const std::string& target = "");
  /// Called on the sender thread after an attempt: the send ended (sent or failed for good) or
  /// waits for a retry (state queued); set before start().
  void set_on_send_done(std::function<void(const DicomSendRecord&)> fn);

 private:
  DicomSettings settings_;
  std::unique_ptr<DicomNode> node_;
  std::unique_ptr<DicomSender> sender_;
};

}  // namespace segflow::daemon::dicom

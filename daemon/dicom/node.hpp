#pragma once
// segflowd as a DICOM storage node: a C-ECHO / C-STORE SCP on DCMTK's dcmnet that writes
// what it receives into data_root/<dicom.dataset>/ through DicomStore (whole series only;
// the dataset watcher indexes them like any other case folder). It listens on dicom.port,
// on dicom.tls.port (DICOM TLS, dcmtls: BCP 195 profile, the node's certificate, client
// certificates checked against trusted_cas and required with require_client_certificate),
// or on both; the same rules and limits hold on either port. A refused TLS handshake (a plain
// client, an untrusted or missing certificate) is logged with the peer's address and counted;
// nothing of it is read or stored.
//
// Accepted: Verification, and CT, Enhanced CT, MR, Enhanced MR and Segmentation Storage in
// every transfer syntax segflow's DICOM reader decodes (uncompressed, deflated, RLE, JPEG,
// JPEG-LS, JPEG 2000: whatever the registered codecs can turn into Explicit VR Little
// Endian); compressed instances are stored as received. Anything else is not negotiated.
// Refused: a called AE title other than dicom.ae_title, a calling AE title not in
// dicom.allowed_calling_aes (when given), associations beyond dicom.max_associations.
// An association's instances reach the dataset only when it is released; an abort by the
// peer, a peer silent for dicom.idle_timeout_s (ACSE and DIMSE timeouts), more data set
// bytes than dicom.max_association_bytes (the connection is cut at once) or a protocol
// error discards them. Garbage on the port costs one failed connection, nothing more.
//
// Threads (no actors): one listener thread per port accepts connections, runs the TLS
// handshake and reads association requests (a peer that connects and stays silent holds it
// for at most idle_timeout_s); each admitted association runs on a thread of its own, at
// most max_associations at once over both ports.
// stats() is safe from any thread.

#include <nlohmann/json.hpp>

#include <filesystem>
#include <memory>

#include "daemon/dicom/config.hpp"
#include "messages/status.hpp"

namespace segflow::daemon::dicom {

class DicomStore;

class DicomNode {
 public:
  /// `store` (prepared by the caller) outlives the node. Nothing runs before start().
  DicomNode(DicomSettings settings, DicomStore& store);
  ~DicomNode();
  DicomNode(const DicomNode&) = delete;
  DicomNode& operator=(const DicomNode&) = delete;

  /// Listens on dicom.bind:dicom.port and dicom.bind:dicom.tls.port (those > 0) and starts
  /// their listener threads. Errors name the key ("dicom.port: cannot listen on
  /// 127.0.0.1:104: ...", "dicom.tls.certificate: ...").
  Status start();
  /// Stops listening, cuts the running associations (their instances are discarded) and
  /// joins every thread. Idempotent.
  void stop();

  /// The plain port listened on (0 before start() or without one).
  int port() const;
  /// The TLS port listened on (0 before start() or without one).
  int tls_port() const;

  /// {listening, address, tls_address (null when off), tls_handshakes_refused, ae_title,
  /// dataset, active, associations_received,
  /// associations_refused, associations_completed, associations_aborted, associations_failed,
  /// bad_connections, echoes, instances_stored, instances_refused, bytes_stored,
  /// cases_written, last_error, recent: [{id, calling_ae, called_ae, peer, tls, outcome, reason,
  /// instances, bytes, cases, started, ended}]} (times in unix seconds).
  nlohmann::json stats() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace segflow::daemon::dicom

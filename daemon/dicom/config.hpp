#pragma once
// The `dicom` section of segflowd's config: the DICOM storage node (C-ECHO / C-STORE SCP
// feeding a dataset under data_root, on a plain port, a TLS port or both) and the
// destinations results are sent to: DICOM peers by C-STORE (plain or TLS) and DICOMweb
// servers by STOW-RS; a DICOMweb destination is also where `segflow ctl dicom fetch` pulls
// studies from (QIDO-RS, WADO-RS). Port 0 (the default) or no section: no listener. Every
// key is checked when the config is read; errors name the key ("daemon.yaml: dicom.bind:
// ..."); files named by keys are checked when the config is finalized (check_dicom_files).
//
//   dicom:
//     port: 11112                  # TCP port of the plain listener; 0 = off
//     ae_title: SEGFLOW            # our AE title: the called AE peers must use
//     dataset: incoming            # folder under data_root the received series go to
//     allowed_calling_aes: []      # calling AE titles admitted; [] = any (loopback only)
//     max_associations: 4          # associations served at once (both ports); more are rejected
//     bind: 127.0.0.1              # IPv4 address to listen on; another than loopback
//                                  # requires a non-empty allowed_calling_aes
//     max_association_bytes: 4294967296   # data set bytes one association may send
//     idle_timeout_s: 30           # ACSE/DIMSE timeout: a peer silent this long is cut off
//     tls:                         # the DICOM TLS listener (PS3.15 B.9, BCP 195); off without port
//       port: 2762
//       certificate: node.pem      # PEM certificate and its unencrypted PEM key
//       private_key: node.key
//       trusted_cas: [ca.pem]      # PEM CA files (or hashed folders) client certificates chain to
//       profile: bcp195-nd         # bcp195-nd (TLS 1.2+) | bcp195 (may fall back) | bcp195-extended
//       require_client_certificate: false
//     send_to:                     # where `segflow ctl dicom send` delivers results
//       ae_title: PACS
//       host: 127.0.0.1
//       port: 104
//       retry_initial_s: 5         # first retry delay; doubles per failed attempt
//       retry_max_s: 600           # longest delay between attempts
//       max_attempts: 20           # then the send is marked failed
//       tls: {trusted_cas: [ca.pem], certificate: me.pem, private_key: me.key, profile: bcp195-nd,
//             verify_peer_name: true}   # C-STORE over TLS (certificate: client authentication)
//     destinations:                # named destinations (auto_infer's send_to names one)
//       PACS_A: {ae_title: ORTHANC, host: 10.0.0.5, port: 4242}   # same keys as send_to
//       CLOUD:                     # a DICOMweb server: STOW-RS out, QIDO-RS / WADO-RS in
//         kind: dicomweb           # dimse (the default) | dicomweb
//         url: https://pacs.example.org/dicom-web   # the DICOMweb base URL
//         auth: bearer             # none | basic (username, password_file) | bearer (token_file)
//         token_file: /etc/segflow/token
//         timeout_s: 60            # connect, or no byte moved for this long: the attempt failed
//         tls: {trusted_cas: [ca.pem], certificate: me.pem, private_key: me.key}   # https trust

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "messages/status.hpp"

namespace segflow::pipeline {
class OptionParser;
}

namespace segflow::daemon::dicom {

/// How a destination is reached.
enum class DestinationKind : std::uint8_t {
  dimse,     ///< a DICOM peer: C-STORE over an association (plain or TLS)
  dicomweb,  ///< a DICOMweb server: STOW-RS out, QIDO-RS and WADO-RS in (fetch)
};
/// "dimse", "dicomweb".
const char* to_string(DestinationKind kind);

/// HTTP authentication of a DICOMweb destination.
enum class WebAuth : std::uint8_t {
  none,    ///< no Authorization header
  basic,   ///< username and the password of password_file
  bearer,  ///< "Authorization: Bearer <the token of token_file>" (read again on each attempt)
};
/// "none", "basic", "bearer".
const char* to_string(WebAuth auth);

/// Certificates and trust of one side of a TLS connection (the node's listener, a C-STORE
/// destination, or the https of a DICOMweb destination). Paths are made absolute by
/// check_dicom_files.
struct TlsFiles {
  std::string certificate;               ///< PEM certificate of this side ("" = none)
  std::string private_key;               ///< its PEM private key, unencrypted (with certificate)
  std::vector<std::string> trusted_cas;  ///< PEM CA files, or folders of hashed CA files
  std::string profile = "bcp195-nd";  ///< bcp195-nd (TLS 1.2+) | bcp195 (falls back to 1.0) | bcp195-extended
};

/// The node's TLS listener (dicom.tls).
struct NodeTls : TlsFiles {
  std::int64_t port = 0;                    ///< TLS port; 0 = no TLS listener
  bool require_client_certificate = false;  ///< refuse clients without a trusted certificate
  /// True when the TLS listener is on.
  bool enabled() const { return port > 0; }
  /// Reads dicom.tls: certificate, private_key and trusted_cas are required with a port.
  void bind(pipeline::OptionParser& p);
};

/// TLS towards a destination (its `tls` section).
struct PeerTls : TlsFiles {
  bool enabled = false;          ///< a tls section was given
  bool verify_peer_name = true;  ///< the peer's certificate must name the destination's host
};

/// A destination of results (dicom.send_to or one of dicom.destinations).
struct DicomDestination {
  DestinationKind kind = DestinationKind::dimse;
  // kind dimse
  std::string ae_title;   ///< the peer's AE title (1-16 characters)
  std::string host;       ///< host name or address
  std::int64_t port = 0;  ///< TCP port, 1-65535
  // kind dicomweb
  std::string url;               ///< DICOMweb base URL (http:// or https://), without a trailing '/'
  WebAuth auth = WebAuth::none;  ///< HTTP authentication
  std::string username;          ///< auth basic
  std::string password_file;     ///< auth basic: a file holding the password
  std::string token_file;        ///< auth bearer: a file holding the token
  double timeout_s = 60.0;       ///< connect timeout, and the longest stall of a transfer, s
  // both
  PeerTls tls;                     ///< C-STORE over TLS, or the trust of an https url
  double retry_initial_s = 5.0;    ///< delay after the first failure, s (> 0)
  double retry_max_s = 600.0;      ///< the longest delay, s (>= retry_initial_s)
  std::int64_t max_attempts = 20;  ///< attempts before the send is marked failed (>= 1)
  /// True when a destination is configured.
  bool enabled() const { return !host.empty() || !url.empty(); }
  /// Reads a destination (pipeline/options.hpp): kind dimse needs ae_title, host and port;
  /// kind dicomweb needs url (and the files of its auth). Keys of the other kind are errors.
  void bind(pipeline::OptionParser& p);

 private:
  void bind_dimse(pipeline::OptionParser& p);
  void bind_dicomweb(pipeline::OptionParser& p);
  void bind_tls(pipeline::OptionParser& p);
};

/// The DICOM node settings (dicom).
struct DicomSettings {
  std::int64_t port = 0;                         ///< plain listener port; 0 = no plain listener
  std::string ae_title = "SEGFLOW";              ///< our AE title (called by peers, calling when sending)
  std::string dataset = "incoming";              ///< dataset folder under data_root
  std::vector<std::string> allowed_calling_aes;  ///< admitted calling AE titles; empty = any
  std::int64_t max_associations = 4;             ///< associations at once, both ports together (1-64)
  std::string bind_address = "127.0.0.1";        ///< IPv4 address listened on
  std::int64_t max_association_bytes = std::int64_t{4} << 30;  ///< per association, >= 4096
  std::int64_t idle_timeout_s = 30;                            ///< ACSE and DIMSE timeout, s (1-3600)
  NodeTls tls;                                                 ///< the TLS listener (optional)
  DicomDestination send_to;                                    ///< results go here (optional)
  std::map<std::string, DicomDestination> destinations;        ///< named destinations (optional)

  /// True when a listener is on (port > 0 or tls.port > 0).
  bool listening() const { return port > 0 || tls.enabled(); }
  /// Reads the `dicom` section and checks the keys against each other (bind vs. the allow list).
  void bind(pipeline::OptionParser& p);
  /// True when some destination is configured (send_to or destinations).
  bool sends() const { return send_to.enabled() || !destinations.empty(); }
  /// The destination a send's target names: destinations[target], or send_to for "" (null
  /// when there is no such destination).
  const DicomDestination* destination(const std::string& target) const;
  /// What an auto_infer send_to NAME refers to: the target "NAME" when dicom.destinations has
  /// it, "" (send_to) when it is dicom.send_to's AE title; an error listing what may be named.
  Result<std::string> resolve(const std::string& name) const;
  /// The DICOMweb destination `name` a fetch pulls from; an error listing the DICOMweb
  /// destinations when `name` is not one.
  Result<const DicomDestination*> web_source(const std::string& name) const;

 private:
  void bind_destinations(pipeline::OptionParser& p);
};

/// Makes the paths of the dicom section absolute and checks the files it names: TLS
/// certificates, keys and CAs readable, each key matching its certificate (DCMTK's dcmtls
/// loads them); password and token files readable and not empty. `where` prefixes the key
/// in errors ("daemon.yaml: dicom.tls.certificate: /etc/x.pem: cannot read ...").
Status check_dicom_files(DicomSettings& s, const std::string& where);

/// The secret of a password or token file: its one line, trailing whitespace removed; an
/// error naming the file when it cannot be read, is empty or has several lines.
Result<std::string> read_secret_file(const std::string& path);

/// "AE@host:port" (" (TLS)" appended with tls) of a DIMSE destination, the url of a DICOMweb one.
std::string destination_text(const DicomDestination& d);

/// True for a valid AE title: 1-16 characters, printable ASCII without backslash, not only
/// spaces (leading and trailing spaces are not significant).
bool is_valid_ae_title(const std::string& ae);

/// True for a valid UID: 1-64 characters of digits and dots, no empty component.
bool is_valid_uid(const std::string& uid);

/// True when `address` is an IPv4 loopback address (127.0.0.0/8).
bool is_loopback_ipv4(const std::string& address);

}  // namespace segflow::daemon::dicom

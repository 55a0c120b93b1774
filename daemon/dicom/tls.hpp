#pragma once
// DICOM TLS (PS3.15 Annex B.9) on DCMTK's dcmtls and OpenSSL: the transport layer of the
// node's TLS listener and of a C-STORE sender whose destination has a `tls` section. The
// BCP 195 profiles choose the TLS versions and cipher suites (DCMTK's tables).
//
// An acceptor presents its certificate and asks clients for theirs: a client certificate is
// required with require_client_certificate, and checked against the trusted CAs whenever one
// is presented. A requestor requires the server's certificate to chain to the trusted CAs
// and, with a peer name, to name it (subjectAltName DNS or IP, else the common name).
//
// Threading: a layer may serve several connections one after another or at once (OpenSSL
// contexts are thread-safe once set up); make it before the threads that use it start.

#include <memory>
#include <string>

#include "daemon/dicom/config.hpp"
#include "messages/status.hpp"

class DcmTLSTransportLayer;

namespace segflow::daemon::dicom {

/// Which side of the connection a layer serves.
enum class TlsRole : std::uint8_t {
  acceptor,   ///< the node's TLS listener
  requestor,  ///< a sender opening associations
};

/// The peer a requestor's layer checks the server certificate against.
struct TlsPeer {
  bool require_certificate = true;  ///< acceptor: refuse clients without a certificate
  std::string name;                 ///< requestor: host name or IP the certificate must name; "" = none
};

/// A transport layer made from `tls` (include <dcmtk/dcmtls/tlslayer.h> to use or destroy it) (files already
/// made absolute by check_dicom_files). Errors name the key under `section` ("dicom.tls.private_key: /x.key:
/// cannot read a PEM private key (unencrypted)", "...: is not the private key of certificate /x.pem").
Result<std::unique_ptr<DcmTLSTransportLayer>> make_tls_layer(const TlsFiles& tls, TlsRole role,
                                                             const TlsPeer& peer, const std::string& section);

}  // namespace segflow::daemon::dicom

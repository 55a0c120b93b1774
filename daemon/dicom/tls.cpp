#include "daemon/dicom/tls.hpp"

#include <arpa/inet.h>

#include <dcmtk/config/osconfig.h>
#include <dcmtk/dcmtls/tlslayer.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include <filesystem>

namespace segflow::daemon::dicom {

namespace fs = std::filesystem;

namespace {

DcmTLSSecurityProfile profile_of(const std::string& name) {
  if (name == "bcp195") return TSP_Profile_BCP195;
  if (name == "bcp195-extended") return TSP_Profile_BCP195_Extended;
  return TSP_Profile_BCP195_ND;
}

/// The requestor checks that the server's certificate names `name` (an IPv4/IPv6 address or
/// a host name).
Status check_peer_name(DcmTLSTransportLayer& layer, const std::string& name, const std::string& section) {
  SSL_CTX* ctx = layer.getNativeHandle();
  X509_VERIFY_PARAM* param = ctx ? SSL_CTX_get0_param(ctx) : nullptr;
  if (!param) return internal_error(section + ": no OpenSSL context to check the peer name with");
  unsigned char buf[16];
  const bool ip =
      ::inet_pton(AF_INET, name.c_str(), buf) == 1 || ::inet_pton(AF_INET6, name.c_str(), buf) == 1;
  const int ok = ip ? X509_VERIFY_PARAM_set1_ip_asc(param, name.c_str())
                    : X509_VERIFY_PARAM_set1_host(param, name.c_str(), name.size());
  if (ok != 1)
    return invalid_config(section + ": cannot check the peer's certificate against \"" + name + "\"");
  return Status::ok();
}

}  // namespace

Result<std::unique_ptr<DcmTLSTransportLayer>> make_tls_layer(const TlsFiles& tls, TlsRole role,
                                                             const TlsPeer& peer,
                                                             const std::string& section) {
  auto layer = std::make_unique<DcmTLSTransportLayer>(
      role == TlsRole::acceptor ? NET_ACCEPTOR : NET_REQUESTOR, nullptr, OFTrue);
  if (!*layer) return internal_error(section + ": cannot set up OpenSSL for DICOM TLS");
  std::error_code ec;
  for (std::size_t i = 0; i < tls.trusted_cas.size(); ++i) {
    const std::string& ca = tls.trusted_cas[i];
    const bool dir = fs::is_directory(ca, ec);
    OFCondition c = dir ? layer->addTrustedCertificateDir(ca.c_str(), DCF_Filetype_PEM)
                        : layer->addTrustedCertificateFile(ca.c_str(), DCF_Filetype_PEM);
    if (c.bad() || (!dir && !fs::is_regular_file(ca, ec)))
      return invalid_config(section + ".trusted_cas[" + std::to_string(i) + "]: " + ca + ": cannot read " +
                            (dir ? "a folder of hashed PEM CA certificates" : "a PEM CA certificate"));
  }
  if (!tls.certificate.empty()) {
    // An empty password: an encrypted key fails to load instead of asking on the console.
    layer->setPrivateKeyPasswd("");
    if (layer->setPrivateKeyFile(tls.private_key.c_str(), DCF_Filetype_PEM).bad())
      return invalid_config(section + ".private_key: " + tls.private_key +
                            ": cannot read a PEM private key (expected an unencrypted PEM key file)");
    if (layer->setCertificateFile(tls.certificate.c_str(), DCF_Filetype_PEM).bad())
      return invalid_config(section + ".certificate: " + tls.certificate + ": cannot read a PEM certificate");
    if (!layer->checkPrivateKeyMatchesCertificate())
      return invalid_config(section + ".private_key: " + tls.private_key + ": is not the private key of " +
                            tls.certificate);
  }
  OFCondition c = layer->setTLSProfile(profile_of(tls.profile));
  if (c.good()) c = layer->activateCipherSuites();
  if (c.bad()) return invalid_config(section + ".profile: " + tls.profile + ": " + c.text());
  if (role == TlsRole::acceptor) {
    layer->setCertificateVerification(peer.require_certificate ? DCV_requireCertificate
                                                               : DCV_checkCertificate);
  } else {
    layer->setCertificateVerification(DCV_requireCertificate);
    if (!peer.name.empty()) SEGFLOW_RETURN_IF_ERROR(check_peer_name(*layer, peer.name, section));
  }
  return layer;
}

}  // namespace segflow::daemon::dicom

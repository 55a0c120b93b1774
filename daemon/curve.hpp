#pragma once
// ZeroMQ CURVE for the control and event sockets: key pairs as Z85 text files (written by
// `segflow ctl keygen`), and the ZAP handler that admits only the clients whose public keys
// sit in the authorized folder.
//
// Key folder layout (keygen --out DIR): DIR/public.key (0644) and DIR/secret.key (0600),
// each one line of 40 Z85 characters. To authorize a client, copy its public.key into the
// server's authorized_clients_dir under any name; the folder is re-read on every connection,
// so keys can be added and removed while the daemon runs.

#include <atomic>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>

#include "messages/status.hpp"

namespace zmq {
class context_t;
}

namespace segflow::daemon {

/// A CURVE key pair in Z85 text (40 characters each).
struct CurveKeyPair {
  std::string public_key;
  std::string secret_key;
};

/// Makes a key pair (zmq_curve_keypair) and writes DIR/public.key and DIR/secret.key (mode
/// 0600, never overwriting an existing secret key). DIR is created with mode 0700.
Result<CurveKeyPair> write_keypair(const std::filesystem::path& dir);
/// Reads a Z85 key file (first non-empty line that is not a # comment); checks its form.
Result<std::string> read_key_file(const std::filesystem::path& file);
/// The public key of a Z85 secret key (zmq_curve_public).
Result<std::string> public_key_of(const std::string& secret_key);

/// The ZAP handler (RFC 27) on inproc://zeromq.zap.01 of `context`: a thread answering
/// authentication requests. CURVE clients are admitted when their public key is in
/// `authorized_dir`; every other mechanism is refused. Must start before any CURVE socket
/// of that context accepts connections; stop() before the context closes.
class ZapHandler {
 public:
  ZapHandler(zmq::context_t& context, std::filesystem::path authorized_dir);
  ~ZapHandler();
  ZapHandler(const ZapHandler&) = delete;
  ZapHandler& operator=(const ZapHandler&) = delete;
  /// Binds the ZAP endpoint and starts the thread.
  Status start();
  /// Stops and joins the thread. Idempotent.
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
};

}  // namespace segflow::daemon

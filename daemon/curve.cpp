#include "daemon/curve.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <zmq.hpp>
#include <zmq_addon.hpp>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <vector>

#include "messages/log.hpp"

namespace segflow::daemon {

namespace fs = std::filesystem;

namespace {

Status write_text(const fs::path& p, const std::string& text, mode_t mode, bool exclusive) {
  const int flags = O_WRONLY | O_CREAT | O_CLOEXEC | (exclusive ? O_EXCL : O_TRUNC);
  const int fd = ::open(p.c_str(), flags, mode);
  if (fd < 0) return io_error(p.string() + ": cannot write: " + std::strerror(errno));
  const std::string line = text + "\n";
  const bool ok = ::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size());
  ::fchmod(fd, mode);
  ::close(fd);
  if (!ok) return io_error(p.string() + ": short write");
  return Status::ok();
}

bool valid_z85_key(const std::string& k) {
  if (k.size() != 40) return false;
  std::uint8_t bin[32];
  return zmq_z85_decode(bin, k.c_str()) != nullptr;
}

}  // namespace

Result<CurveKeyPair> write_keypair(const fs::path& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (!fs::is_directory(dir, ec)) return io_error(dir.string() + ": cannot create the key folder");
  ::chmod(dir.c_str(), 0700);
  const fs::path pub = dir / "public.key", sec = dir / "secret.key";
  if (fs::exists(sec, ec))
    return invalid_argument(sec.string() + ": exists; refusing to overwrite a secret key");
  char p[41] = {0}, s[41] = {0};
  if (zmq_curve_keypair(p, s) != 0)
    return unsupported(std::string("zmq_curve_keypair failed (libzmq built without CURVE?): ") +
                       zmq_strerror(errno));
  CurveKeyPair kp{p, s};
  SEGFLOW_RETURN_IF_ERROR(write_text(sec, kp.secret_key, 0600, true));
  SEGFLOW_RETURN_IF_ERROR(write_text(pub, kp.public_key, 0644, false));
  return kp;
}

Result<std::string> read_key_file(const fs::path& file) {
  std::ifstream f(file);
  if (!f) return not_found(file.string() + ": cannot read the key file");
  std::string line;
  while (std::getline(f, line)) {
    const auto b = line.find_first_not_of(" \t\r");
    if (b == std::string::npos || line[b] == '#') continue;
    const auto e = line.find_last_not_of(" \t\r");
    std::string key = line.substr(b, e - b + 1);
    if (!valid_z85_key(key))
      return invalid_config(file.string() + ": expected a 40-character Z85 CURVE key, got " +
                            std::to_string(key.size()) + " characters");
    return key;
  }
  return invalid_config(file.string() + ": no key in the file");
}

Result<std::string> public_key_of(const std::string& secret_key) {
  char p[41] = {0};
  if (!valid_z85_key(secret_key) || zmq_curve_public(p, secret_key.c_str()) != 0)
    return invalid_config("not a valid Z85 CURVE secret key");
  return std::string(p);
}

struct ZapHandler::Impl {
  zmq::socket_t sock;
  fs::path dir;
  Impl(zmq::context_t& ctx, fs::path d) : sock(ctx, zmq::socket_type::rep), dir(std::move(d)) {}

  std::set<std::string> authorized() const {
    std::set<std::string> keys;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      if (!e.is_regular_file(ec)) continue;
      auto k = read_key_file(e.path());
      if (k.is_ok()) keys.insert(*k);
    }
    return keys;
  }

  void answer(const std::vector<zmq::message_t>& req) {
    // version, request id, domain, address, identity, mechanism, credentials...
    std::string version = req.size() > 0 ? req[0].to_string() : "";
    std::string id = req.size() > 1 ? req[1].to_string() : "";
    std::string mechanism = req.size() > 5 ? req[5].to_string() : "";
    std::string code = "400", text = "refused", user;
    if (version != "1.0" || req.size() < 6) {
      text = "malformed ZAP request";
    } else if (mechanism != "CURVE" || req.size() < 7 || req[6].size() != 32) {
      text = "only CURVE clients are accepted";
    } else {
      char z85[41] = {0};
      zmq_z85_encode(z85, static_cast<const std::uint8_t*>(req[6].data()), 32);
      if (authorized().count(z85)) {
        code = "200";
        text = "OK";
        user = z85;
      } else {
        text = "client key not authorized";
        log::warn(std::string("control: refused a CURVE client with unknown public key ") + z85 + " from " +
                  (req.size() > 3 ? req[3].to_string() : std::string("?")));
      }
    }
    std::vector<zmq::message_t> rep;
    rep.emplace_back(std::string("1.0"));
    rep.emplace_back(id);
    rep.emplace_back(code);
    rep.emplace_back(text);
    rep.emplace_back(user);
    rep.emplace_back(std::string());
    zmq::send_multipart(sock, rep);
  }
};

ZapHandler::ZapHandler(zmq::context_t& context, fs::path authorized_dir)
    : impl_(std::make_unique<Impl>(context, std::move(authorized_dir))) {}

ZapHandler::~ZapHandler() { stop(); }

Status ZapHandler::start() {
  try {
    impl_->sock.set(zmq::sockopt::linger, 0);
    impl_->sock.bind("inproc://zeromq.zap.01");
  } catch (const zmq::error_t& e) {
    return io_error(std::string("ZAP handler: cannot bind inproc://zeromq.zap.01: ") + e.what());
  }
  std::error_code ec;
  if (!fs::is_directory(impl_->dir, ec))
    log::warn("control: curve.authorized_clients_dir " + impl_->dir.string() +
              " does not exist: no client is admitted");
  thread_ = std::thread([this] {
    while (!stop_.load()) {
      try {
        zmq::pollitem_t items[] = {{impl_->sock.handle(), 0, ZMQ_POLLIN, 0}};
        zmq::poll(items, 1, std::chrono::milliseconds(200));
        if (!(items[0].revents & ZMQ_POLLIN)) continue;
        std::vector<zmq::message_t> req;
        if (!zmq::recv_multipart(impl_->sock, std::back_inserter(req))) continue;
        impl_->answer(req);
      } catch (const zmq::error_t& e) {
        if (e.num() == ETERM) break;
        if (e.num() != EINTR) log::error(std::string("ZAP handler: ") + e.what());
      } catch (const std::exception& e) {
        log::error(std::string("ZAP handler: ") + e.what());
      }
    }
  });
  return Status::ok();
}

void ZapHandler::stop() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
  if (impl_ && impl_->sock) impl_->sock.close();
}

}  // namespace segflow::daemon

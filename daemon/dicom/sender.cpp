#include "daemon/dicom/sender.hpp"
#include "messages/file_util.hpp"

#include <dcmtk/config/osconfig.h>
#include <dcmtk/dcmdata/dcdeftag.h>
#include <dcmtk/dcmdata/dcfilefo.h>
#include <dcmtk/dcmdata/dcmetinf.h>
#include <dcmtk/dcmdata/dcuid.h>
#include <dcmtk/dcmdata/dcxfer.h>
#include <dcmtk/dcmnet/dcmtrans.h>
#include <dcmtk/dcmnet/diutil.h>
#include <dcmtk/dcmnet/scu.h>
#include <dcmtk/dcmtls/tlslayer.h>
#include <dcmtk/oflog/oflog.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "daemon/dicom/dicomweb.hpp"
#include "daemon/dicom/tags.hpp"
#include "daemon/dicom/tls.hpp"
#include "messages/log.hpp"
#include "pipeline/io/dicom.hpp"

namespace segflow::daemon::dicom {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr std::int64_t kPerAssociation = 16;

/// A retry delay for the log: "2 s", "7.5 s".
std::string retry_delay_text(double seconds) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g s", seconds);
  return buf;
}

/// The UIDs a send needs from a file's header.
struct FileHeader {
  std::string sop_class, sop_instance, transfer_syntax;
};

/// "SOP class 1.2.840.10008.5.1.4.1.1.66.4 (SegmentationStorage) in 1.2.840.10008.1.2.1" for
/// each distinct class and transfer syntax of the ready headers.
std::string sop_classes_text(const std::vector<FileHeader>& headers, const std::vector<bool>& ready) {
  std::set<std::string> seen;
  std::string out;
  for (std::size_t i = 0; i < headers.size(); ++i) {
    if (!ready[i]) continue;
    const char* name = dcmFindNameOfUID(headers[i].sop_class.c_str(), nullptr);
    std::string one = "SOP class " + headers[i].sop_class + (name ? std::string(" (") + name + ")" : "") +
                      " in " + headers[i].transfer_syntax;
    if (seen.insert(one).second) out += (out.empty() ? "" : ", ") + one;
  }
  return out;
}

Result<FileHeader> read_header(const fs::path& file) {
  DcmFileFormat ff;
  OFCondition c = ff.loadFile(OFFilename(file.c_str()), EXS_Unknown, EGL_noChange, 256);
  if (c.bad()) return corrupt_data(file.string() + ": not a readable DICOM file: " + c.text());
  FileHeader h;
  h.sop_class = tag_text(*ff.getDataset(), DCM_SOPClassUID);
  h.sop_instance = tag_text(*ff.getDataset(), DCM_SOPInstanceUID);
  h.transfer_syntax = tag_text(*ff.getMetaInfo(), DCM_TransferSyntaxUID);
  if (h.sop_class.empty()) return corrupt_data(file.string() + ": SOPClassUID (0008,0016): missing");
  if (h.sop_instance.empty()) return corrupt_data(file.string() + ": SOPInstanceUID (0008,0018): missing");
  if (h.transfer_syntax.empty())
    return corrupt_data(
        file.string() +
        ": TransferSyntaxUID (0002,0010): missing (expected a DICOM Part 10 file with a meta header)");
  return h;
}

/// DcmSCU with its TLS switch reachable (DCMTK keeps useSecureConnection protected for
/// DcmTLSSCU, which would build its own layer without the peer-name check).
class Scu : public DcmSCU {
 public:
  using DcmSCU::useSecureConnection;
};

/// The config key of a send's target: dicom.send_to for "", else dicom.destinations.NAME.
std::string target_key(const std::string& target) {
  return target.empty() ? std::string("dicom.send_to") : "dicom.destinations." + target;
}

/// True for a C-STORE failure status that a retry cannot change (PS3.4 Annex B.2.3 and PS3.7
/// Annex C): the SOP class is not supported or not authorised, the data set does not match
/// its SOP class (A9xx), the peer cannot understand it (Cxxx), a mistyped or unrecognised
/// request. Out of resources (A7xx), a processing failure (0110), a duplicate invocation
/// (0210) and a resource limitation (0213) may pass and are retried.
bool permanent_cstore_failure(Uint16 status) {
  if ((status & 0xFF00) == 0xA700) return false;
  if ((status & 0xFF00) == 0xA900 || (status & 0xF000) == 0xC000) return true;
  switch (status) {
    case 0x0110:
    case 0x0210:
    case 0x0213:
      return false;
    default:
      return true;
  }
}

}  // namespace

double retry_delay_s(const DicomDestination& d, std::int64_t attempts) {
  const double n = static_cast<double>(std::max<std::int64_t>(attempts, 1) - 1);
  return std::min(d.retry_max_s, d.retry_initial_s * std::pow(2.0, std::min(n, 60.0)));
}

struct DicomSender::Impl {
  DicomSettings s;
  fs::path outbox;
  StateDb& db;
  std::thread thread;
  std::atomic<bool> stopping{false};
  std::mutex mu;
  std::condition_variable wake;
  std::uint64_t counter = 0;
  DicomSender::DoneFn on_done;

  void done(const DicomSendRecord& r) {
    if (!on_done) return;
    try {
      on_done(r);
    } catch (const std::exception& e) {
      log::error(std::string("dicom: send callback: ") + e.what());
    }
  }

  Impl(DicomSettings settings, const fs::path& state_dir, StateDb& d)
      : s(std::move(settings)), outbox(state_dir / "dicom-outbox"), db(d) {}

  /// One failed attempt: back off, or give up after max_attempts. A refusal that no retry
  /// can change (`refused`) gives up at once; its error says so.
  void failed(DicomSendRecord& r, const std::string& why, const DicomDestination& d, bool refused = false) {
    r.attempts += 1;
    r.last_error = refused ? "refused by " + destination_text(d) + " (not retried): " + why : why;
    r.destination = destination_text(d);
    const bool given_up = refused || r.attempts >= d.max_attempts;
    if (given_up) {
      r.state = "failed";
      log::error("dicom: send " + std::to_string(r.id) + " of " + r.source + " to " + r.destination +
                 " failed for good after " + std::to_string(r.attempts) + " attempt" +
                 (r.attempts == 1 ? "" : "s") + ": " + r.last_error);
    } else {
      const double delay = retry_delay_s(d, r.attempts);
      r.updated = StateDb::now();  // the callback's attempt time: next_attempt - updated = delay
      r.next_attempt = r.updated + delay;
      log::warn("dicom: send " + std::to_string(r.id) + " to " + r.destination + " failed (attempt " +
                std::to_string(r.attempts) + "): " + why + "; next attempt in " + retry_delay_text(delay));
    }
    if (Status st = db.update_dicom_send(r); !st.is_ok()) log::error("dicom: " + st.message());
    done(r);  // state failed (for good) or queued (retried at next_attempt)
  }

  void sent(DicomSendRecord& r, const DicomDestination& d) {
    r.attempts += 1;
    r.state = "sent";
    r.last_error.clear();
    r.destination = destination_text(d);
    if (Status st = db.update_dicom_send(r); !st.is_ok()) log::error("dicom: " + st.message());
    std::error_code ec;
    fs::remove(r.file, ec);
    log::info("dicom: sent " + r.source + " (" + r.sop_instance_uid + ") to " + r.destination);
    done(r);
  }

  /// Sends a batch of due records for `d` over one association (TLS with d.tls).
  void send(std::vector<DicomSendRecord>& batch, const DicomDestination& d, const std::string& target) {
    std::vector<FileHeader> headers(batch.size());
    std::vector<bool> ready(batch.size(), false);
    std::unique_ptr<DcmTLSTransportLayer> tls;  // outlives the SCU that uses it
    if (d.tls.enabled) {
      TlsPeer peer;
      peer.name = d.tls.verify_peer_name ? d.host : "";
      auto layer = make_tls_layer(d.tls, TlsRole::requestor, peer, target_key(target) + ".tls");
      if (!layer.is_ok()) {
        for (auto& r : batch) failed(r, layer.status().message(), d);
        return;
      }
      tls = std::move(layer).value();
    }
    Scu scu;
    scu.setAETitle(s.ae_title.c_str());
    scu.setPeerHostName(d.host.c_str());
    scu.setPeerPort(static_cast<Uint16>(d.port));
    scu.setPeerAETitle(d.ae_title.c_str());
    scu.setMaxReceivePDULength(65536);
    scu.setACSETimeout(static_cast<Uint32>(s.idle_timeout_s));
    scu.setDIMSEBlockingMode(DIMSE_NONBLOCKING);
    scu.setDIMSETimeout(static_cast<Uint32>(s.idle_timeout_s));
    scu.setConnectionTimeout(static_cast<Sint32>(s.idle_timeout_s));
    std::set<std::pair<std::string, std::string>> contexts;
    for (std::size_t i = 0; i < batch.size(); ++i) {
      auto h = read_header(batch[i].file);
      if (!h.is_ok()) {
        failed(batch[i], h.status().message(), d);
        continue;
      }
      headers[i] = *h;
      ready[i] = true;
      if (!contexts.insert({h->sop_class, h->transfer_syntax}).second) continue;
      OFList<OFString> ts;
      ts.push_back(h->transfer_syntax.c_str());
      if (DcmXfer(h->transfer_syntax.c_str()).isNotEncapsulated())
        for (const char* u : {UID_LittleEndianExplicitTransferSyntax, UID_LittleEndianImplicitTransferSyntax})
          if (h->transfer_syntax != u) ts.push_back(u);
      scu.addPresentationContext(h->sop_class.c_str(), ts);
    }
    if (contexts.empty()) return;
    OFCondition c = scu.initNetwork();
    if (c.good() && tls) c = scu.useSecureConnection(tls.get());
    if (c.good()) c = scu.negotiateAssociation();
    if (c.bad()) {
      // A peer that accepts none of the SOP classes offered (a PACS not set up for DICOM SEG)
      // refuses for good; a peer that is down or busy may answer later.
      const bool refused = c == NET_EC_NoAcceptablePresentationContexts;
      const std::string why = refused
                                  ? "accepts no presentation context for " + sop_classes_text(headers, ready)
                                  : "association with " + destination_text(d) + ": " + c.text();
      for (std::size_t i = 0; i < batch.size(); ++i)
        if (ready[i]) failed(batch[i], why, d, refused);
      return;
    }
    for (std::size_t i = 0; i < batch.size(); ++i) {
      if (!ready[i]) continue;
      if (stopping.load()) break;  // still queued: sent after the restart
      if (!scu.isConnected()) {
        failed(batch[i], "the association ended before this file was sent", d);
        continue;
      }
      T_ASC_PresentationContextID pc =
          scu.findPresentationContextID(headers[i].sop_class.c_str(), headers[i].transfer_syntax.c_str());
      if (pc == 0) pc = scu.findAnyPresentationContextID(headers[i].sop_class.c_str(), "");
      if (pc == 0) {
        failed(batch[i], "accepts no presentation context for " + sop_classes_text({headers[i]}, {true}), d,
               true);
        continue;
      }
      Uint16 status = 0;
      c = scu.sendSTORERequest(pc, OFFilename(batch[i].file.c_str()), nullptr, status);
      if (c.bad()) {
        failed(batch[i], std::string("C-STORE: ") + c.text(), d);
      } else if (status == 0 || (status & 0xF000) == 0xB000) {
        sent(batch[i], d);
      } else {
        char hex[8];
        std::snprintf(hex, sizeof hex, "%04x", status);
        failed(batch[i], std::string("C-STORE status 0x") + hex + " (" + DU_cstoreStatusString(status) + ")",
               d, permanent_cstore_failure(status));
      }
    }
    if (scu.isConnected()) (void)scu.releaseAssociation();
  }

  /// Sends a batch of due records to the DICOMweb destination `d` by STOW-RS, one request
  /// per instance over one kept-alive connection.
  void send_web(std::vector<DicomSendRecord>& batch, const DicomDestination& d) {
    WebClient client(d);
    for (auto& r : batch) {
      if (stopping.load()) break;  // still queued: sent after the restart
      auto h = read_header(r.file);
      if (!h.is_ok()) {
        failed(r, h.status().message(), d);
        continue;
      }
      const StowOutcome o = stow_instance(client, r.file, h->sop_instance);
      if (o.result == StowResult::stored)
        sent(r, d);
      else
        failed(r, o.detail, d, o.result == StowResult::refused);
    }
  }

  /// A send whose named destination is no longer configured: kept queued, looked at again
  /// in a minute (configuring the name again and restarting delivers it).
  void hold(DicomSendRecord& r) {
    r.last_error = target_key(r.target) + ": not configured (kept queued until it is)";
    r.next_attempt = StateDb::now() + 60;
    if (Status st = db.update_dicom_send(r); !st.is_ok()) log::error("dicom: " + st.message());
    log::warn("dicom: send " + std::to_string(r.id) + ": " + r.last_error);
  }

  /// Sends the due records, one association per destination.
  void send_due(std::vector<DicomSendRecord>& due) {
    std::map<std::string, std::vector<DicomSendRecord>> by_target;
    for (auto& r : due) by_target[r.target].push_back(std::move(r));
    for (auto& [target, batch] : by_target) {
      if (stopping.load()) return;
      const DicomDestination* d = s.destination(target);
      if (!d) {
        for (auto& r : batch) hold(r);
        continue;
      }
      if (d->kind == DestinationKind::dicomweb)
        send_web(batch, *d);
      else
        send(batch, *d, target);
    }
  }

  void run() {
    while (!stopping.load()) {
      try {
        auto due = db.due_dicom_sends(StateDb::now(), kPerAssociation);
        if (!due.is_ok()) {
          log::error("dicom: " + due.status().message());
        } else if (!due->empty()) {
          send_due(*due);
          continue;
        }
      } catch (const std::exception& e) {
        log::error(std::string("dicom: sender: ") + e.what());
      }
      std::unique_lock<std::mutex> lock(mu);
      wake.wait_for(lock, std::chrono::milliseconds(250), [&] { return stopping.load(); });
    }
  }
};

DicomSender::DicomSender(DicomSettings settings, fs::path state_dir, StateDb& db)
    : impl_(std::make_unique<Impl>(std::move(settings), state_dir, db)) {}

DicomSender::~DicomSender() { stop(); }

void DicomSender::set_on_done(DoneFn fn) { impl_->on_done = std::move(fn); }

Status DicomSender::start() {
  Impl& m = *impl_;
  if (!m.s.sends()) return Status::ok();
  if (!std::getenv("SEGFLOW_DCMTK_LOG")) OFLog::getLogger("dcmtk").setLogLevel(OFLogger::FATAL_LOG_LEVEL);
  pipeline::register_dicom_codecs();  // a peer that only takes another transfer syntax gets a transcoded copy
  // A peer that stops answering (a TLS handshake included) fails the attempt after this long.
  dcmSocketReceiveTimeout.set(static_cast<Sint32>(m.s.idle_timeout_s));
  std::error_code ec;
  fs::create_directories(m.outbox, ec);
  if (!fs::is_directory(m.outbox, ec))
    return io_error(m.outbox.string() + ": cannot create the DICOM outbox");
  m.stopping.store(false);
  m.thread = std::thread([&m] { m.run(); });
  if (m.s.send_to.enabled()) log::info("dicom: results go to " + destination_text(m.s.send_to));
  for (const auto& [name, d] : m.s.destinations)
    log::info("dicom: destination " + name + " is " + destination_text(d));
  return Status::ok();
}

void DicomSender::stop() {
  Impl& m = *impl_;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    m.stopping.store(true);
  }
  m.wake.notify_all();
  if (m.thread.joinable()) m.thread.join();
}

Status DicomSender::check(const fs::path& file, const std::string& target) const {
  if (!impl_->s.destination(target))
    return invalid_argument(target_key(target) + ": not configured (segflowd has nowhere to send " +
                            file.string() + ")");
  std::error_code ec;
  if (!fs::is_regular_file(file, ec)) return not_found(file.string() + ": no such file");
  return read_header(file).status();
}

Result<DicomSendRecord> DicomSender::enqueue(const fs::path& file, const std::string& target, bool once) {
  Impl& m = *impl_;
  SEGFLOW_RETURN_IF_ERROR(check(file, target));
  std::error_code ec;
  SEGFLOW_ASSIGN_OR_RETURN(FileHeader h, read_header(file));
  if (once) {
    // The same instance queued again for the same target (a caller that stopped between
    // queueing and recording it): the existing send is it.
    SEGFLOW_ASSIGN_OR_RETURN(DicomSendRecord existing, m.db.find_dicom_send(h.sop_instance, target));
    if (existing.id != 0) {
      log::info("dicom: " + h.sop_instance + " is already send " + std::to_string(existing.id) + " (" +
                existing.state + ") for " + target_key(target));
      return existing;
    }
  }
  std::string name;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    name =
        std::to_string(static_cast<std::int64_t>(StateDb::now() * 1000)) + "-" + std::to_string(++m.counter);
  }
  const fs::path copy = m.outbox / (name + ".dcm");
  SEGFLOW_RETURN_IF_ERROR(replace_file_atomically(copy, [&](const fs::path& tmp) -> Status {
    std::error_code cec;
    fs::copy_file(file, tmp, fs::copy_options::overwrite_existing, cec);
    if (cec)
      return io_error("cannot copy " + file.string() + " into " + m.outbox.string() + ": " + cec.message());
    return Status::ok();
  }));
  DicomSendRecord r;
  r.file = copy.string();
  r.source = fs::absolute(file, ec).lexically_normal().string();
  r.sop_class_uid = h.sop_class;
  r.sop_instance_uid = h.sop_instance;
  r.next_attempt = StateDb::now();
  r.target = target;
  r.destination = destination_text(*m.s.destination(target));
  auto id = m.db.insert_dicom_send(r);
  if (!id.is_ok()) {
    fs::remove(copy, ec);
    return id.status();
  }
  r.id = *id;
  m.wake.notify_all();
  log::info("dicom: queued " + r.source + " (" + r.sop_instance_uid + ") for " + r.destination + " as send " +
            std::to_string(r.id));
  return r;
}

Result<json> DicomSender::stats() const {
  const Impl& m = *impl_;
  json out = {{"destination", m.s.send_to.enabled() ? json(destination_text(m.s.send_to)) : json()},
              {"queued", 0},
              {"sent", 0},
              {"failed", 0}};
  json named = json::object();
  for (const auto& [name, d] : m.s.destinations) named[name] = destination_text(d);
  out["destinations"] = named;
  SEGFLOW_ASSIGN_OR_RETURN(auto counts, m.db.dicom_send_counts());
  for (const auto& [state, n] : counts) out[state] = n;
  SEGFLOW_ASSIGN_OR_RETURN(auto sends, m.db.dicom_sends(50));
  json list = json::array();
  for (const auto& r : sends)
    list.push_back({{"id", r.id},
                    {"source", r.source},
                    {"sop_class_uid", r.sop_class_uid},
                    {"sop_instance_uid", r.sop_instance_uid},
                    {"state", r.state},
                    {"attempts", r.attempts},
                    {"next_attempt", r.next_attempt},
                    {"last_error", r.last_error},
                    {"destination", r.destination},
                    {"target", r.target},
                    {"created", r.created},
                    {"updated", r.updated}});
  out["sends"] = list;
  return out;
}

}  // namespace segflow::daemon::dicom

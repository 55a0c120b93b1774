#include "daemon/dicom/node.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <dcmtk/config/osconfig.h>
#include <dcmtk/dcmdata/dccodec.h>
#include <dcmtk/dcmdata/dcdatset.h>
#include <dcmtk/dcmdata/dcdeftag.h>
#include <dcmtk/dcmdata/dcuid.h>
#include <dcmtk/dcmdata/dcxfer.h>
#include <dcmtk/dcmnet/assoc.h>
#include <dcmtk/dcmnet/dcmtrans.h>
#include <dcmtk/dcmnet/dimse.h>
#include <dcmtk/dcmnet/dul.h>
#include <dcmtk/dcmnet/dulstruc.h>
#include <dcmtk/dcmnet/scpthrd.h>
#include <dcmtk/dcmtls/tlslayer.h>
#include <dcmtk/oflog/oflog.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <list>
#include <mutex>
#include <thread>
#include <vector>

#include "daemon/dicom/store.hpp"
#include "daemon/dicom/tls.hpp"
#include "daemon/state_db.hpp"
#include "messages/log.hpp"
#include "pipeline/io/dicom.hpp"

namespace segflow::daemon::dicom {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr Uint32 kMaxPdu = 65536;
constexpr std::size_t kRecent = 20;

/// Candidate transfer syntaxes in the order the node prefers them: lossless compressed
/// (stored as received, fewer bytes on the wire), uncompressed, then lossy compressed
/// (taken only when the peer offers nothing else). start() keeps those the reader decodes.
const E_TransferSyntax kCandidateSyntaxes[] = {
    EXS_RLELossless,          EXS_JPEGLSLossless,    EXS_JPEG2000LosslessOnly,
    EXS_JPEGProcess14SV1,     EXS_JPEGProcess14,     EXS_LittleEndianExplicit,
    EXS_LittleEndianImplicit, EXS_BigEndianExplicit, EXS_DeflatedLittleEndianExplicit,
    EXS_JPEGLSLossy,          EXS_JPEG2000,          EXS_JPEGProcess1,
    EXS_JPEGProcess2_4};

std::string trimmed(const char* s) {
  std::string t = s ? s : "";
  const auto b = t.find_first_not_of(' ');
  if (b == std::string::npos) return "";
  return t.substr(b, t.find_last_not_of(' ') - b + 1);
}

/// Reads the socket of a transport connection (DCMTK keeps the getter protected; a member
/// pointer taken through a derived class reaches it without instantiating anything).
struct SocketOf : DcmTransportConnection {
  static int get(DcmTransportConnection& c) { return static_cast<int>((c.*(&SocketOf::getSocket))()); }
};

/// The TCP socket of an association (-1 when there is none): shut down to cut the peer off.
int socket_of(T_ASC_Association* assoc) {
  if (!assoc || !assoc->DULassociation) return -1;
  auto* key = static_cast<PRIVATE_ASSOCIATIONKEY*>(assoc->DULassociation);
  return key->connection ? SocketOf::get(*key->connection) : -1;
}

void drop(T_ASC_Association*& assoc) {
  if (!assoc) return;
  ASC_dropAssociation(assoc);
  ASC_destroyAssociation(&assoc);
}

}  // namespace

/// One association as it runs and as `recent` remembers it.
struct AssociationRecord {
  std::uint64_t id = 0;
  std::string calling_ae, called_ae, peer;
  bool tls = false;                 ///< came in on the TLS port
  std::string outcome = "running";  ///< running | refused | completed | aborted | failed
  std::string reason;
  std::int64_t instances = 0, refused_instances = 0, bytes = 0, cases = 0;
  double started = 0.0, ended = 0.0;
};

struct DicomNode::Impl {
  /// One listening port: plain (dicom.port) or TLS (dicom.tls.port), with its thread.
  struct Listener {
    explicit Listener(const char* key) : name(key) {}
    const char* name;  ///< "dicom.port" | "dicom.tls.port": the key its errors name
    std::int64_t port = 0;
    std::unique_ptr<DcmTLSTransportLayer> tls;  ///< the TLS listener's layer; null for plain
    T_ASC_Network* net = nullptr;
    int bound_port = 0;
    std::thread thread;
  };

  DicomSettings s;
  DicomStore& store;
  DcmSharedSCPConfig shared;
  std::vector<std::string> syntaxes;  ///< accepted transfer syntax UIDs
  Listener plain{"dicom.port"}, secure{"dicom.tls.port"};
  std::atomic<bool> stopping{false};

  /// One running association: its thread and its socket (cut by stop()).
  struct Active {
    std::thread thread;
    std::atomic<bool> finished{false};
    int socket = -1;  ///< guarded by mu; -1 once the association is being closed
  };

  mutable std::mutex mu;  // guards everything below
  std::list<std::unique_ptr<Active>> active;
  std::uint64_t next_id = 1;
  std::int64_t received = 0, refused = 0, completed = 0, aborted = 0, failed = 0, bad_connections = 0;
  std::int64_t tls_refused = 0;  ///< TLS handshakes that failed (nothing was read or stored)
  std::int64_t echoes = 0, instances_stored = 0, instances_refused = 0, bytes_stored = 0, cases_written = 0;
  std::string last_error;
  std::deque<AssociationRecord> recent;

  Impl(DicomSettings settings, DicomStore& st) : s(std::move(settings)), store(st) {}

  void note_error(const std::string& e) {
    std::lock_guard<std::mutex> lock(mu);
    last_error = e;
  }

  /// Records a finished association (counters, recent list, log line).
  void finish(AssociationRecord rec) {
    rec.ended = StateDb::now();
    std::string line = "dicom: association " + std::to_string(rec.id) + " from " +
                       (rec.calling_ae.empty() ? std::string("?") : rec.calling_ae) + " (" + rec.peer +
                       "): " + rec.outcome;
    if (!rec.reason.empty()) line += " (" + rec.reason + ")";
    if (rec.instances || rec.refused_instances)
      line +=
          ", " + std::to_string(rec.instances) + " instances" +
          (rec.outcome == "completed" ? ", " + std::to_string(rec.cases) + " case(s) written" : " discarded");
    if (rec.outcome == "completed" || rec.outcome == "refused")
      log::info(line);
    else
      log::warn(line);
    std::lock_guard<std::mutex> lock(mu);
    if (rec.outcome == "refused")
      ++refused;
    else if (rec.outcome == "completed")
      ++completed;
    else if (rec.outcome == "aborted")
      ++aborted;
    else
      ++failed;
    if (rec.outcome == "completed") {
      instances_stored += rec.instances;
      bytes_stored += rec.bytes;
      cases_written += rec.cases;
    }
    instances_refused += rec.refused_instances;
    if (rec.outcome != "completed" && !rec.reason.empty()) last_error = line.substr(7);
    recent.push_back(std::move(rec));
    while (recent.size() > kRecent) recent.pop_front();
  }

  Status open_listener(Listener& l);
  void listen_loop(Listener& l);
  void connection_failed(const Listener& l, T_ASC_Association*& assoc, const OFCondition& c);
  void run_association(Active* slot, T_ASC_Association* assoc, std::uint64_t id, bool tls);
  void reap();
};

namespace {

/// The SCP side of one association (DcmSCP does negotiation and the DIMSE loop; this class
/// decides who is admitted and what becomes of C-STORE data sets).
class AssociationWorker : public DcmThreadSCP {
 public:
  AssociationWorker(DicomNode::Impl& node, T_ASC_Association* assoc, std::uint64_t id, bool tls)
      : node_(node), assoc_(assoc) {
    rec_.id = id;
    rec_.tls = tls;
    rec_.started = StateDb::now();
  }

  /// Runs the association to its end; returns what happened.
  AssociationRecord serve() {
    OFCondition c = run(assoc_);
    if (rec_.outcome == "running") {
      rec_.outcome = "failed";
      if (rec_.reason.empty()) rec_.reason = c.bad() ? c.text() : "ended without release";
    }
    if (batch_) batch_->discard();  // no-op after a commit
    return rec_;
  }

 protected:
  void notifyAssociationRequest(const T_ASC_Parameters& params, DcmSCPActionType& action) override {
    rec_.calling_ae = trimmed(params.DULparams.callingAPTitle);
    rec_.called_ae = trimmed(params.DULparams.calledAPTitle);
    rec_.peer = params.DULparams.callingPresentationAddress;
    action = DCMSCP_ACTION_UNDEFINED;
  }

  OFBool checkCalledAETitleAccepted(const OFString& called) override {
    return trimmed(called.c_str()) == node_.s.ae_title;
  }

  OFBool checkCallingAETitleAccepted(const OFString& calling) override {
    const auto& allowed = node_.s.allowed_calling_aes;
    if (allowed.empty()) return OFTrue;
    const std::string ae = trimmed(calling.c_str());
    for (const auto& a : allowed)
      if (a == ae) return OFTrue;
    return OFFalse;
  }

  void refuseAssociation(const DcmRefuseReasonType reason) override {
    rec_.outcome = "refused";
    switch (reason) {
      case DCMSCP_CALLED_AE_TITLE_NOT_RECOGNIZED:
        rec_.reason = "called AE title '" + rec_.called_ae + "' is not " + node_.s.ae_title;
        break;
      case DCMSCP_CALLING_AE_TITLE_NOT_RECOGNIZED:
        rec_.reason = "calling AE title '" + rec_.calling_ae + "' is not in dicom.allowed_calling_aes";
        break;
      case DCMSCP_NO_PRESENTATION_CONTEXTS:
        rec_.reason = "no acceptable presentation context (SOP class or transfer syntax not supported)";
        break;
      case DCMSCP_BAD_APPLICATION_CONTEXT_NAME:
        rec_.reason = "unknown application context";
        break;
      default:
        rec_.reason = "refused";
        break;
    }
    DcmThreadSCP::refuseAssociation(reason);
  }

  OFCondition handleIncomingCommand(T_DIMSE_Message* msg, const DcmPresentationContextInfo& info) override {
    if (msg->CommandField == DIMSE_C_ECHO_RQ) {
      {
        std::lock_guard<std::mutex> lock(node_.mu);
        ++node_.echoes;
      }
      return DcmThreadSCP::handleIncomingCommand(msg, info);
    }
    if (msg->CommandField != DIMSE_C_STORE_RQ) {
      rec_.reason = "unsupported DIMSE command 0x" + hex(static_cast<unsigned>(msg->CommandField));
      return DcmThreadSCP::handleIncomingCommand(msg, info);  // an error: the association is aborted
    }
    T_DIMSE_C_StoreRQ& req = msg->msg.CStoreRQ;
    const T_ASC_PresentationContextID pc = info.presentationContextID;
    if (!batch_) {
      auto b = node_.store.begin("a" + std::to_string(::getpid()) + "-" + std::to_string(rec_.id));
      if (!b.is_ok()) {
        rec_.reason = b.status().message();
        DIC_UL bytes = 0, pdvs = 0;
        OFCondition c = DIMSE_ignoreDataSet(assoc_, DIMSE_NONBLOCKING, timeout(), &bytes, &pdvs);
        if (c.bad()) return c;
        ++rec_.refused_instances;
        return respond(pc, req, 0xA700, rec_.reason);
      }
      batch_ = std::move(b).value();
    }
    const fs::path tmp = batch_->incoming_path();
    OFCondition c = receiveSTORERequest(req, pc, OFString(tmp.c_str()));
    if (c.bad()) {
      if (!over_limit_) rec_.reason = std::string("receiving a data set failed: ") + c.text();
      return c;
    }
    StoredInstance si;
    if (info.abstractSyntax != req.AffectedSOPClassUID) {
      std::error_code ec;
      fs::remove(tmp, ec);
      si.status = 0xA900;
      si.error = std::string("SOP class not the presentation context's: ") + req.AffectedSOPClassUID +
                 " vs " + info.abstractSyntax.c_str();
    } else {
      si = batch_->add(tmp, req.AffectedSOPClassUID, req.AffectedSOPInstanceUID);
    }
    done_bytes_ += si.bytes;
    if (si.status == 0) {
      ++rec_.instances;
      rec_.bytes += si.bytes;
      if (!si.derived_series.empty() && !derived_noted_) {
        derived_noted_ = true;
        log::info("dicom: association " + std::to_string(rec_.id) + ": instance " +
                  req.AffectedSOPInstanceUID + " has no SeriesInstanceUID; filed by its " +
                  si.derived_series + " (case " + si.case_id + ")");
      }
    } else {
      ++rec_.refused_instances;
      log::warn("dicom: association " + std::to_string(rec_.id) + ": instance " + req.AffectedSOPInstanceUID +
                " refused: " + si.error);
      node_.note_error("instance " + std::string(req.AffectedSOPInstanceUID) + " refused: " + si.error);
    }
    return respond(pc, req, si.status, si.error);
  }

  void notifyRECEIVEProgress(const unsigned long bytes) override {
    if (over_limit_ || done_bytes_ + static_cast<std::int64_t>(bytes) <= node_.s.max_association_bytes)
      return;
    over_limit_ = true;
    rec_.reason = "more than dicom.max_association_bytes (" + std::to_string(node_.s.max_association_bytes) +
                  ") data set bytes";
    // Cut the connection at once: reads fail, the data set and the association are dropped.
    const int fd = socket_of(assoc_);
    if (fd >= 0) ::shutdown(fd, SHUT_RD);
  }

  void notifyReleaseRequest() override {
    // Commit before the release is acknowledged: once the peer sees its release confirmed,
    // the series is in the dataset.
    rec_.outcome = "completed";
    if (!batch_) return;
    auto written = batch_->commit();
    if (written.is_ok()) {
      rec_.cases = *written;
    } else {
      rec_.outcome = "failed";
      rec_.reason = "cannot write the received series: " + written.status().message();
    }
  }

  void notifyAbortRequest() override {
    // DUL reports an A-ABORT from the peer and a connection that closed mid-association alike.
    if (over_limit_) {
      rec_.outcome = "failed";
      return;
    }
    rec_.outcome = "aborted";
    rec_.reason = "aborted by the peer, or its connection closed";
  }

  void notifyDIMSEError(const OFCondition& cond) override {
    rec_.outcome = "failed";
    if (over_limit_) return;
    if (cond == DIMSE_NODATAAVAILABLE)
      rec_.reason =
          "the peer was silent for dicom.idle_timeout_s (" + std::to_string(node_.s.idle_timeout_s) + " s)";
    else if (rec_.reason.empty())
      rec_.reason = cond.text();
  }

 private:
  static std::string hex(unsigned v) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "%04x", v);
    return buf;
  }
  Uint32 timeout() const { return static_cast<Uint32>(node_.s.idle_timeout_s); }

  /// ErrorComment is an LO: at most 64 characters, no backslash or control characters. The
  /// refusals put their reason first, so the cut keeps it.
  static std::string error_comment(std::string text) {
    for (char& c : text)
      if (c == '\\' || static_cast<unsigned char>(c) < 0x20) c = ' ';
    return text.substr(0, 64);
  }

  OFCondition respond(T_ASC_PresentationContextID pc, const T_DIMSE_C_StoreRQ& req, std::uint16_t status,
                      const std::string& error) {
    DcmDataset detail;
    if (status != 0) detail.putAndInsertString(DCM_ErrorComment, error_comment(error).c_str());
    return sendSTOREResponse(pc, req.MessageID, req.AffectedSOPClassUID, req.AffectedSOPInstanceUID, status,
                             status != 0 ? &detail : nullptr);
  }

  DicomNode::Impl& node_;
  T_ASC_Association* assoc_;
  AssociationRecord rec_;
  std::unique_ptr<DicomStore::Batch> batch_;
  std::int64_t done_bytes_ = 0;
  bool over_limit_ = false;
  bool derived_noted_ = false;  ///< the derived series identity was logged for this association
};

}  // namespace

Status DicomNode::Impl::open_listener(Listener& l) {
  const std::string where =
      std::string(l.name) + ": cannot listen on " + s.bind_address + ":" + std::to_string(l.port);
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return io_error(where + ": " + std::strerror(errno));
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(l.port));
  ::inet_pton(AF_INET, s.bind_address.c_str(), &a.sin_addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd, 32) != 0) {
    const std::string e = std::strerror(errno);
    ::close(fd);
    return io_error(where + ": " + e);
  }
  socklen_t n = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &n);
  l.bound_port = ntohs(a.sin_port);
  // DCMTK 3.6.7 binds its listener to every address. Handing it an external socket handle
  // while the network is made (its inetd mode) keeps it from opening one; the network then
  // accepts on ours, bound to dicom.bind.
  dcmExternalSocketHandle.set(fd);
  OFCondition c = ASC_initializeNetwork(NET_ACCEPTOR, static_cast<int>(l.port),
                                        static_cast<int>(s.idle_timeout_s), &l.net);
  dcmExternalSocketHandle.set(DCMNET_INVALID_SOCKET);
  if (c.good() && l.tls) c = ASC_setTransportLayer(l.net, l.tls.get(), 0);
  if (c.bad()) {
    if (l.net) ASC_dropNetwork(&l.net);
    ::close(fd);
    return io_error(where + ": " + c.text());
  }
  static_cast<PRIVATE_NETWORKKEY*>(l.net->network)->networkSpecific.TCP.listenSocket = fd;
  return Status::ok();
}

void DicomNode::Impl::reap() {
  std::list<std::unique_ptr<Active>> done;
  {
    std::lock_guard<std::mutex> lock(mu);
    for (auto it = active.begin(); it != active.end();) {
      if ((*it)->finished.load()) {
        done.push_back(std::move(*it));
        it = active.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& a : done)
    if (a->thread.joinable()) a->thread.join();
}

void DicomNode::Impl::run_association(Active* slot, T_ASC_Association* assoc, std::uint64_t id, bool tls) {
  AssociationRecord rec;
  try {
    AssociationWorker w(*this, assoc, id, tls);
    w.setSharedConfig(shared);
    rec = w.serve();
    std::lock_guard<std::mutex> lock(mu);
    slot->socket = -1;  // the worker's destructor closes it
  } catch (const std::exception& e) {
    rec.id = id;
    rec.tls = tls;
    rec.outcome = "failed";
    rec.reason = std::string("internal error: ") + e.what();
    std::lock_guard<std::mutex> lock(mu);
    slot->socket = -1;
  }
  finish(std::move(rec));
  slot->finished.store(true);
}

void DicomNode::Impl::connection_failed(const Listener& l, T_ASC_Association*& assoc, const OFCondition& c) {
  // A refused TLS handshake (a plain client, an untrusted or missing client certificate),
  // garbage instead of an A-ASSOCIATE-RQ, a peer that said nothing, a dropped connection.
  // DUL has the peer's address before the handshake.
  const std::string peer = assoc && assoc->params ? assoc->params->DULparams.callingPresentationAddress : "";
  drop(assoc);
  const bool handshake = l.tls && c.module() == OFM_dcmtls;
  std::lock_guard<std::mutex> lock(mu);
  if (handshake) {
    ++tls_refused;
    last_error = "TLS handshake with " + (peer.empty() ? std::string("a client") : peer) + " on port " +
                 std::to_string(l.bound_port) + " refused: " + c.text() + " (nothing read or stored)";
  } else {
    ++bad_connections;
    last_error = "connection" + (peer.empty() ? std::string() : " from " + peer) +
                 " without a valid association request: " + c.text();
  }
  log::warn("dicom: " + last_error);
}

void DicomNode::Impl::listen_loop(Listener& l) {
  while (!stopping.load()) {
    try {
      T_ASC_Association* assoc = nullptr;
      OFCondition c = ASC_receiveAssociation(l.net, &assoc, kMaxPdu, nullptr, nullptr,
                                             l.tls ? OFTrue : OFFalse, DUL_NOBLOCK, 1);
      reap();
      if (c == DUL_NOASSOCIATIONREQUEST) {
        ASC_destroyAssociation(&assoc);
        continue;
      }
      // DUL reports a connection closed before any PDU as a (blank) association request.
      if (c.good() && (!assoc->params || assoc->params->DULparams.applicationContextName[0] == '\0'))
        c = makeDcmnetCondition(DULC_NETWORKCLOSED, OF_error, "closed before sending an association request");
      if (c.bad()) {
        connection_failed(l, assoc, c);
        continue;
      }
      std::unique_lock<std::mutex> lock(mu);
      ++received;
      const std::uint64_t id = next_id++;
      if (static_cast<std::int64_t>(active.size()) >= s.max_associations) {
        lock.unlock();
        T_ASC_RejectParameters rej{};
        rej.result = ASC_RESULT_REJECTEDTRANSIENT;
        rej.source = ASC_SOURCE_SERVICEPROVIDER_PRESENTATION_RELATED;
        rej.reason = ASC_REASON_SP_PRES_LOCALLIMITEXCEEDED;
        AssociationRecord rec;
        rec.id = id;
        rec.tls = l.tls != nullptr;
        rec.calling_ae = trimmed(assoc->params->DULparams.callingAPTitle);
        rec.called_ae = trimmed(assoc->params->DULparams.calledAPTitle);
        rec.peer = assoc->params->DULparams.callingPresentationAddress;
        rec.started = StateDb::now();
        rec.outcome = "refused";
        rec.reason = "dicom.max_associations (" + std::to_string(s.max_associations) + ") are running";
        ASC_rejectAssociation(assoc, &rej);
        drop(assoc);
        finish(std::move(rec));
        continue;
      }
      auto slot = std::make_unique<Active>();
      Active* raw = slot.get();
      raw->socket = socket_of(assoc);
      active.push_back(std::move(slot));
      const bool tls = l.tls != nullptr;
      raw->thread = std::thread([this, raw, assoc, id, tls] { run_association(raw, assoc, id, tls); });
    } catch (const std::exception& e) {
      note_error(std::string("listener: ") + e.what());
      log::error(std::string("dicom: listener: ") + e.what());
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  }
}

DicomNode::DicomNode(DicomSettings settings, DicomStore& store)
    : impl_(std::make_unique<Impl>(std::move(settings), store)) {}

DicomNode::~DicomNode() { stop(); }

Status DicomNode::start() {
  Impl& m = *impl_;
  if (!m.s.listening()) return invalid_argument("dicom.port: 0 (the DICOM node is off)");
  // DCMTK logs to stderr by itself; segflow reports through its own log.
  if (!std::getenv("SEGFLOW_DCMTK_LOG")) OFLog::getLogger("dcmtk").setLogLevel(OFLogger::FATAL_LOG_LEVEL);
  dcmDisableGethostbyaddr.set(OFTrue);
  // Every connection's socket gets this receive timeout: the TLS handshake, which DCMTK runs
  // in the listener thread with blocking reads, waits for a silent client this long at most.
  dcmSocketReceiveTimeout.set(static_cast<Sint32>(m.s.idle_timeout_s));
  pipeline::register_dicom_codecs();

  OFList<OFString> syntaxes;
  for (E_TransferSyntax x : kCandidateSyntaxes) {
    const DcmXfer xfer(x);
    if (xfer.isNotEncapsulated() || DcmCodecList::canChangeCoding(x, EXS_LittleEndianExplicit)) {
      syntaxes.push_back(xfer.getXferID());
      m.syntaxes.push_back(xfer.getXferID());
    }
  }
  DcmSCPConfig cfg;
  cfg.setAETitle(m.s.ae_title.c_str());
  cfg.setPort(static_cast<Uint16>(m.s.port));
  cfg.setMaxReceivePDULength(kMaxPdu);
  cfg.setACSETimeout(static_cast<Uint32>(m.s.idle_timeout_s));
  cfg.setDIMSEBlockingMode(DIMSE_NONBLOCKING);
  cfg.setDIMSETimeout(static_cast<Uint32>(m.s.idle_timeout_s));
  cfg.setHostLookupEnabled(OFFalse);
  cfg.setProgressNotificationMode(OFTrue);
  OFList<OFString> verification;
  verification.push_back(UID_LittleEndianExplicitTransferSyntax);
  verification.push_back(UID_LittleEndianImplicitTransferSyntax);
  verification.push_back(UID_BigEndianExplicitTransferSyntax);
  OFCondition c = cfg.addPresentationContext(UID_VerificationSOPClass, verification);
  for (const std::string& sop : stored_sop_classes())
    if (c.good()) c = cfg.addPresentationContext(sop.c_str(), syntaxes);
  if (c.bad()) return internal_error(std::string("dicom: presentation contexts: ") + c.text());
  m.shared = DcmSharedSCPConfig(cfg);

  m.plain.port = m.s.port;
  m.secure.port = m.s.tls.port;
  if (m.s.tls.enabled()) {
    TlsPeer peer;
    peer.require_certificate = m.s.tls.require_client_certificate;
    SEGFLOW_ASSIGN_OR_RETURN(m.secure.tls, make_tls_layer(m.s.tls, TlsRole::acceptor, peer, "dicom.tls"));
  }
  for (Impl::Listener* l : {&m.plain, &m.secure})
    if (l->port > 0) SEGFLOW_RETURN_IF_ERROR(m.open_listener(*l));
  m.stopping.store(false);
  for (Impl::Listener* l : {&m.plain, &m.secure})
    if (l->net) l->thread = std::thread([&m, l] { m.listen_loop(*l); });
  std::string where;
  if (m.plain.net) where = m.s.bind_address + ":" + std::to_string(m.plain.bound_port);
  if (m.secure.net)
    where += (where.empty() ? "" : " and ") + m.s.bind_address + ":" + std::to_string(m.secure.bound_port) +
             " (TLS, " + m.s.tls.profile +
             (m.s.tls.require_client_certificate ? ", client certificate required)" : ")");
  log::info("dicom: listening on " + where + " as " + m.s.ae_title + " (dataset " + m.s.dataset + ", " +
            std::to_string(m.syntaxes.size()) + " transfer syntaxes, calling AEs " +
            (m.s.allowed_calling_aes.empty() ? std::string("any")
                                             : std::to_string(m.s.allowed_calling_aes.size()) + " allowed") +
            ")");
  return Status::ok();
}

void DicomNode::stop() {
  Impl& m = *impl_;
  m.stopping.store(true);
  for (Impl::Listener* l : {&m.plain, &m.secure})
    if (l->thread.joinable()) l->thread.join();
  {
    std::lock_guard<std::mutex> lock(m.mu);
    for (auto& a : m.active)
      if (a->socket >= 0) ::shutdown(a->socket, SHUT_RDWR);
  }
  for (;;) {
    std::unique_ptr<Impl::Active> a;
    {
      std::lock_guard<std::mutex> lock(m.mu);
      if (m.active.empty()) break;
      a = std::move(m.active.front());
      m.active.pop_front();
    }
    if (a->thread.joinable()) a->thread.join();
  }
  // The associations are gone: the networks (and the TLS layer they use) may go now.
  for (Impl::Listener* l : {&m.plain, &m.secure})
    if (l->net) ASC_dropNetwork(&l->net);
}

int DicomNode::port() const { return impl_->plain.bound_port; }

int DicomNode::tls_port() const { return impl_->secure.bound_port; }

json DicomNode::stats() const {
  const Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mu);
  json recent = json::array();
  for (auto it = m.recent.rbegin(); it != m.recent.rend(); ++it)
    recent.push_back({{"id", it->id},
                      {"calling_ae", it->calling_ae},
                      {"called_ae", it->called_ae},
                      {"peer", it->peer},
                      {"tls", it->tls},
                      {"outcome", it->outcome},
                      {"reason", it->reason},
                      {"instances", it->instances},
                      {"refused_instances", it->refused_instances},
                      {"bytes", it->bytes},
                      {"cases", it->cases},
                      {"started", it->started},
                      {"ended", it->ended}});
  std::int64_t running = 0;
  for (const auto& a : m.active)
    if (!a->finished.load()) ++running;
  auto address = [&](const Impl::Listener& l) {
    return l.net ? json(m.s.bind_address + ":" + std::to_string(l.bound_port)) : json();
  };
  return {{"listening", m.plain.net != nullptr || m.secure.net != nullptr},
          {"address", address(m.plain)},
          {"tls_address", address(m.secure)},
          {"tls_handshakes_refused", m.tls_refused},
          {"ae_title", m.s.ae_title},
          {"dataset", m.s.dataset},
          {"transfer_syntaxes", m.syntaxes},
          {"active", running},
          {"associations_received", m.received},
          {"associations_refused", m.refused},
          {"associations_completed", m.completed},
          {"associations_aborted", m.aborted},
          {"associations_failed", m.failed},
          {"bad_connections", m.bad_connections},
          {"echoes", m.echoes},
          {"instances_stored", m.instances_stored},
          {"instances_refused", m.instances_refused},
          {"bytes_stored", m.bytes_stored},
          {"cases_written", m.cases_written},
          {"last_error", m.last_error},
          {"recent", recent}};
}

}  // namespace segflow::daemon::dicom

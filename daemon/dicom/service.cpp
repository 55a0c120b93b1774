#include "daemon/dicom/service.hpp"

#include "daemon/dicom/fetcher.hpp"
#include "daemon/dicom/node.hpp"
#include "daemon/dicom/sender.hpp"
#include "daemon/dicom/store.hpp"

namespace segflow::daemon::dicom {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

bool has_web_source(const DicomSettings& s) {
  for (const auto& [name, d] : s.destinations)
    if (d.kind == DestinationKind::dicomweb) return true;
  return false;
}

}  // namespace

DicomService::DicomService(const DicomSettings& settings, fs::path data_root, fs::path state_dir, StateDb& db)
    : settings_(settings),
      store_(std::make_unique<DicomStore>(std::move(data_root), settings.dataset)),
      node_(settings.listening() ? std::make_unique<DicomNode>(settings, *store_) : nullptr),
      sender_(std::make_unique<DicomSender>(settings, std::move(state_dir), db)),
      fetcher_(has_web_source(settings) ? std::make_unique<DicomFetcher>(settings, *store_, db) : nullptr) {}

DicomService::~DicomService() { stop(); }

Status DicomService::start() {
  if (node_ || fetcher_) SEGFLOW_RETURN_IF_ERROR(store_->prepare());
  if (node_) SEGFLOW_RETURN_IF_ERROR(node_->start());
  if (fetcher_) SEGFLOW_RETURN_IF_ERROR(fetcher_->start());
  return sender_->start();
}

void DicomService::stop() {
  if (node_) node_->stop();
  if (fetcher_) fetcher_->stop();
  sender_->stop();
}

Result<json> DicomService::command(const DicomRequest& req) {
  json out = {{"queued", json::array()}};
  if (!req.fetch.empty() && !req.send.empty())
    return invalid_argument("fetch, send: give one of them, not both");
  if (!req.to.empty() && req.send.empty()) return invalid_argument("to: only with send (the files to queue)");
  if (req.fetch.empty() && (!req.study.empty() || !req.series.empty()))
    return invalid_argument(std::string(req.study.empty() ? "series" : "study") +
                            ": only with fetch (the DICOMweb destination to fetch from)");
  if (!req.fetch.empty()) {
    if (req.study.empty()) return invalid_argument("study: missing (fetch needs the StudyInstanceUID)");
    if (!fetcher_) return invalid_argument("fetch: " + settings_.web_source(req.fetch).status().message());
    SEGFLOW_ASSIGN_OR_RETURN(auto f, fetcher_->enqueue(req.fetch, req.study, req.series));
    out["fetch"] = f.id;
  }
  for (std::size_t i = 0; i < req.send.size(); ++i)
    if (Status st = sender_->check(req.send[i], req.to); !st.is_ok())
      return Status(st.code(), "send[" + std::to_string(i) + "]: " + st.message());
  for (const auto& f : req.send) {
    SEGFLOW_ASSIGN_OR_RETURN(auto r, sender_->enqueue(f, req.to));
    out["queued"].push_back(r.id);
  }
  SEGFLOW_ASSIGN_OR_RETURN(out["sender"], sender_->stats());
  out["node"] = node_ ? node_->stats() : json{{"listening", false}};
  if (fetcher_) {
    SEGFLOW_ASSIGN_OR_RETURN(out["fetcher"], fetcher_->stats());
  } else {
    out["fetcher"] = json();
  }
  return out;
}

Result<DicomSendRecord> DicomService::enqueue(const fs::path& file, const std::string& target) {
  return sender_->enqueue(file, target, true);
}

void DicomService::set_on_send_done(std::function<void(const DicomSendRecord&)> fn) {
  sender_->set_on_done(std::move(fn));
}

}  // namespace segflow::daemon::dicom

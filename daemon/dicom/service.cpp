#include "daemon/dicom/service.hpp"

#include "daemon/dicom/node.hpp"
#include "daemon/dicom/sender.hpp"

namespace segflow::daemon::dicom {

namespace fs = std::filesystem;
using nlohmann::json;

DicomService::DicomService(const DicomSettings& settings, fs::path data_root, fs::path state_dir, StateDb& db)
    : settings_(settings),
      node_(settings.listening() ? std::make_unique<DicomNode>(settings, std::move(data_root)) : nullptr),
      sender_(std::make_unique<DicomSender>(settings, std::move(state_dir), db)) {}

DicomService::~DicomService() { stop(); }

Status DicomService::start() {
  if (node_) SEGFLOW_RETURN_IF_ERROR(node_->start());
  return sender_->start();
}

void DicomService::stop() {
  if (node_) node_->stop();
  sender_->stop();
}

Result<json> DicomService::command(const DicomRequest& req) {
  if (!req.to.empty() && req.send.empty()) return invalid_argument("to: only with send (the files to queue)");
  for (std::size_t i = 0; i < req.send.size(); ++i)
    if (Status st = sender_->check(req.send[i], req.to); !st.is_ok())
      return Status(st.code(), "send[" + std::to_string(i) + "]: " + st.message());
  json queued = json::array();
  for (const auto& f : req.send) {
    SEGFLOW_ASSIGN_OR_RETURN(auto r, sender_->enqueue(f, req.to));
    queued.push_back(r.id);
  }
  SEGFLOW_ASSIGN_OR_RETURN(json sender, sender_->stats());
  json node = node_ ? node_->stats() : json{{"listening", false}};
  return json{{"node", node}, {"sender", sender}, {"queued", queued}};
}

Result<DicomSendRecord> DicomService::enqueue(const fs::path& file, const std::string& target) {
  return sender_->enqueue(file, target);
}

void DicomService::set_on_send_done(std::function<void(const DicomSendRecord&)> fn) {
  sender_->set_on_done(std::move(fn));
}

}  // namespace segflow::daemon::dicom

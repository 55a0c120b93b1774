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

Result<json> DicomService::command(const std::vector<std::string>& send) {
  for (std::size_t i = 0; i < send.size(); ++i)
    if (Status st = sender_->check(send[i]); !st.is_ok())
      return Status(st.code(), "send[" + std::to_string(i) + "]: " + st.message());
  json queued = json::array();
  for (const auto& f : send) {
    SEGFLOW_ASSIGN_OR_RETURN(auto r, sender_->enqueue(f));
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

std::string DicomService::destination() const {
  const DicomDestination& d = settings_.send_to;
  if (!d.enabled()) return std::string();
  return d.ae_title + "@" + d.host + ":" + std::to_string(d.port);
}

}  // namespace segflow::daemon::dicom

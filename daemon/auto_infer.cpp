#include "daemon/auto_infer.hpp"

#include <nlohmann/json.hpp>

#include "messages/log.hpp"
#include "pipeline/io/dataset.hpp"

namespace segflow::daemon {

namespace fs = std::filesystem;
using nlohmann::json;

AutoInfer::AutoInfer(std::vector<AutoInferRule> rules, fs::path data_root, StateDb& db, JobManager& jobs,
                     PublishFn publish)
    : rules_(std::move(rules)),
      data_root_(std::move(data_root)),
      db_(db),
      jobs_(jobs),
      publish_(std::move(publish)) {}

Status AutoInfer::prepare() {
  for (const auto& r : rules_) {
    std::error_code ec;
    fs::create_directories(r.output, ec);
    if (!fs::is_directory(r.output, ec))
      return io_error("auto_infer: output " + r.output.string() + " (dataset " + r.dataset +
                      "): cannot create the folder");
    log::info("auto_infer: new cases of " + r.dataset + " are inferred with " + r.checkpoint.string() +
              " into " + r.output.string());
  }
  return Status::ok();
}

bool AutoInfer::watches(const std::string& dataset) const {
  for (const auto& r : rules_)
    if (r.dataset == dataset) return true;
  return false;
}

void AutoInfer::mark_dirty(const std::string& dataset) {
  if (!watches(dataset)) return;
  std::lock_guard<std::mutex> lock(mu_);
  dirty_.insert(dataset);
}

void AutoInfer::poll() {
  std::set<std::string> dirty;
  {
    std::lock_guard<std::mutex> lock(mu_);
    dirty.swap(dirty_);
  }
  for (const auto& r : rules_) {
    try {
      poll_rule(r, dirty.count(r.dataset) > 0);
    } catch (const std::exception& e) {
      log::error("auto_infer: " + r.dataset + ": " + e.what());
    }
  }
}

void AutoInfer::poll_rule(const AutoInferRule& rule, bool dirty) {
  auto records = db_.cases(rule.dataset);
  if (!records.is_ok()) {
    log::warn("auto_infer: " + rule.dataset + ": " + records.status().message());
    return;
  }
  // The case records change when the watcher indexes something: only then list the dataset.
  std::string signature;
  std::map<std::string, const CaseRecord*> by_id;
  for (const auto& c : *records) {
    signature += c.case_id + '\x1f' + c.status + '\x1f' + std::to_string(c.mtime_ns) + '\x1e';
    by_id[c.case_id] = &c;
  }
  auto it = seen_.find(rule.dataset);
  if (!dirty && it != seen_.end() && it->second == signature) return;
  seen_[rule.dataset] = signature;
  if (records->empty()) return;

  const fs::path root = data_root_ / rule.dataset;
  auto index = pipeline::scan_dataset(root, pipeline::ScanOptions{.validate = false});
  if (!index.is_ok()) {
    log::warn("auto_infer: " + rule.dataset + ": " + index.status().message());
    return;
  }
  for (const auto& c : index->cases) {
    auto rec = by_id.find(c.id);
    if (rec == by_id.end() || rec->second->status == "pending") continue;  // not complete yet
    const std::string key = rule.dataset + "/" + c.id;
    const std::int64_t mtime = rec->second->mtime_ns;
    if (auto t = tried_.find(key); t != tried_.end() && t->second == mtime) continue;
    tried_[key] = mtime;
    const fs::path out = rule.output / (c.id + ".nii.gz");
    std::error_code ec;
    // A job in flight, or one submitted since the case's newest file was written (this
    // daemon's or a previous one's, failed or not), is not repeated.
    if (fs::exists(out, ec) || jobs_.infer_submitted(out.string(), static_cast<double>(mtime) * 1e-9))
      continue;
    if (c.images.size() != 1) {
      log::warn("auto_infer: " + key + ": " + std::to_string(c.images.size()) +
                " image channels; auto_infer runs single-channel cases only (skipped)");
      continue;
    }
    InferJobSpec spec;
    spec.checkpoint = rule.checkpoint.string();
    spec.input = c.images.front().string();
    spec.output = out.string();
    spec.tta = rule.tta;
    spec.device = rule.device;
    spec.trigger = "auto_infer";
    spec.dataset = rule.dataset;
    spec.case_id = c.id;
    auto r = jobs_.submit_infer(spec);
    if (r.is_ok()) {
      log::info("auto_infer: " + key + ": job " + std::to_string((*r)["job"].get<std::int64_t>()) + " -> " +
                out.string());
    } else {
      log::error("auto_infer: " + key + ": not submitted: " + r.status().message());
      if (publish_)
        publish_("auto_infer", {{"dataset", rule.dataset},
                                {"case", c.id},
                                {"input", spec.input},
                                {"error", r.status().message()}});
    }
  }
}

}  // namespace segflow::daemon

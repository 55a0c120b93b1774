#include "daemon/auto_train.hpp"

#include <nlohmann/json.hpp>

#include "messages/log.hpp"
#include "pipeline/fingerprint.hpp"

namespace segflow::daemon {

namespace fs = std::filesystem;
using nlohmann::json;

AutoTrain::AutoTrain(std::vector<AutoTrainRule> rules, StateDb& db, JobManager& jobs, PublishFn publish)
    : rules_(std::move(rules)), db_(db), jobs_(jobs), publish_(std::move(publish)) {
  for (const auto& r : rules_)
    log::info("auto_train: " + (r.dataset == "*" ? std::string("every dataset") : "dataset " + r.dataset) +
              " is planned and its " + r.configuration + " trained when it appears");
}

const AutoTrainRule* AutoTrain::rule_for(const std::string& dataset) const {
  const AutoTrainRule* any = nullptr;
  for (const auto& r : rules_) {
    if (r.dataset == dataset) return &r;
    if (r.dataset == "*") any = &r;
  }
  return any;
}

void AutoTrain::mark_dirty(const std::string& dataset) {
  if (!rule_for(dataset)) return;
  std::lock_guard<std::mutex> lock(mu_);
  dirty_.insert(dataset);
}

void AutoTrain::poll() {
  if (rules_.empty()) return;
  std::set<std::string> dirty;
  bool all = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    dirty.swap(dirty_);
    std::swap(all, all_dirty_);
  }
  all = all || ++polls_ % 10 == 0;
  if (!all && dirty.empty()) return;
  auto datasets = db_.datasets();
  if (!datasets.is_ok()) {
    log::warn("auto_train: " + datasets.status().message());
    return;
  }
  for (const auto& d : *datasets) {
    const AutoTrainRule* rule = rule_for(d.name);
    if (!rule || (!all && !dirty.count(d.name))) continue;
    try {
      poll_dataset(d, *rule);
    } catch (const std::exception& e) {
      log::error("auto_train: " + d.name + ": " + e.what());
    }
  }
}

void AutoTrain::poll_dataset(const DatasetRecord& d, const AutoTrainRule& rule) {
  std::error_code ec;
  if (!d.error.empty() || !fs::is_regular_file(fs::path(d.path) / "dataset.json", ec)) return;
  auto cases = db_.cases(d.name);
  if (!cases.is_ok()) {
    log::warn("auto_train: " + d.name + ": " + cases.status().message());
    return;
  }
  // Stable: some case, and none of them pending (a file still being written).
  std::string records;
  for (const auto& c : *cases) {
    if (c.status == "pending") return;
    records += c.case_id + '\x1f' + c.status + '\x1f' + std::to_string(c.mtime_ns) + '\x1e';
  }
  if (cases->empty() || seen_[d.name] == records) return;
  seen_[d.name] = records;
  const std::string path = fs::path(d.path).lexically_normal().string();
  auto signature = pipeline::dataset_signature(path);
  if (!signature.is_ok()) {
    log::warn("auto_train: " + d.name + ": " + signature.status().message());
    return;
  }
  if (jobs_.plan_submitted(d.path, *signature))
    return;  // this data was planned before (maybe before a restart)
  PlanJobSpec spec;
  spec.dataset = path;
  spec.train = rule.configuration;
  spec.folds = rule.folds;
  spec.all_folds = rule.all_folds;
  spec.overrides = rule.set;
  spec.memory_gb = rule.memory_gb;
  spec.memory_model = rule.memory_model;
  spec.preset = rule.preset;
  spec.device = rule.device;
  spec.trigger = "auto_train";
  spec.signature = *signature;
  auto r = jobs_.submit_plan(spec);
  if (r.is_ok()) {
    log::info("auto_train: " + d.name + ": job " + std::to_string((*r)["job"].get<std::int64_t>()) +
              " plans and trains " + rule.configuration);
    return;
  }
  log::error("auto_train: " + d.name + ": not submitted: " + r.status().message());
  if (publish_)
    publish_("auto_train", {{"dataset", d.name}, {"path", d.path}, {"error", r.status().message()}});
}

}  // namespace segflow::daemon

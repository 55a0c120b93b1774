#include "actors/run/metrics_jsonl.hpp"

#include <torch/torch.h>
#include <torch/version.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <mutex>

#include "messages/file_util.hpp"
#include "models/training/class_names.hpp"

namespace segflow::actors {

namespace fs = std::filesystem;
using nlohmann::json;

struct JsonlMetricsObserver::Impl {
  std::ofstream out;
  std::int64_t every = 10;
  std::mutex mu;
  void write(const json& j) {
    std::lock_guard<std::mutex> lock(mu);
    out << j.dump() << '\n';
    out.flush();
  }
};

JsonlMetricsObserver::JsonlMetricsObserver(const fs::path& file, std::int64_t log_every)
    : impl_(std::make_unique<Impl>()) {
  impl_->out.open(file, std::ios::app);
  impl_->every = std::max<std::int64_t>(1, log_every);
}
JsonlMetricsObserver::~JsonlMetricsObserver() = default;

namespace {
/// train.amp as the config says it (auto, say), before the trainer resolved it.
std::string amp_setting(const models::JobConfig& c) {
  const json& r = c.resolved;
  if (r.is_object() && r.contains("train") && r["train"].is_object() && r["train"].contains("amp") &&
      r["train"]["amp"].is_string())
    return r["train"]["amp"].get<std::string>();
  return c.train.amp;
}
}  // namespace

void JsonlMetricsObserver::on_run_start(const models::Trainer& t, const std::string& resumed_from) {
  impl_->write({{"type", "run"},
                {"device", t.device().str()},
                {"amp", t.config().train.amp},
                {"amp_setting", amp_setting(t.config())},
                {"amp_reason", t.amp_reason()},
                {"threads", at::get_num_threads()},
                {"torch", TORCH_VERSION},
                {"resumed_from", resumed_from.empty() ? json(nullptr) : json(resumed_from)},
                {"epoch", t.state().epoch}});
}

void JsonlMetricsObserver::on_step(const models::StepInfo& i) {
  if (i.step % impl_->every != 0 && !i.skipped) return;
  impl_->write({{"type", "step"},
                {"epoch", i.epoch},
                {"step", i.step},
                {"loss", i.loss},
                {"lr", i.lr},
                {"step_ms", i.step_s * 1e3},
                {"data_wait_ms", i.data_wait_s * 1e3},
                {"samples", i.samples},
                {"skipped", i.skipped},
                {"skipped_steps", i.skipped_steps},
                {"loss_scale", i.loss_scale}});
}
void JsonlMetricsObserver::on_epoch_end(const models::EpochInfo& i) {
  impl_->write({{"type", "epoch"},
                {"epoch", i.epoch},
                {"steps", i.steps},
                {"loss", i.loss},
                {"seconds", i.seconds},
                {"samples_per_s", i.samples_per_s},
                {"data_wait_s", i.data_wait_s},
                {"lr", i.lr},
                {"skipped_steps", i.skipped_steps}});
}
void JsonlMetricsObserver::on_validation(const models::ValidationInfo& i) {
  json per = json::array();
  for (double d : i.dice_per_class) per.push_back(std::isfinite(d) ? json(d) : json(nullptr));
  json named = json::object();  // the same Dice keyed by class name (models/training/class_names.hpp)
  for (std::size_t k = 0; k < i.dice_per_class.size(); ++k) named[models::class_key(i, k)] = per[k];
  impl_->write({{"type", "validation"},
                {"epoch", i.epoch},
                {"mean_dice", std::isfinite(i.mean_dice) ? json(i.mean_dice) : json(nullptr)},
                {"dice_per_class", per},
                {"dice_by_class", named},
                {"cases", i.cases},
                {"seconds", i.seconds},
                {"best", i.best}});
}
void JsonlMetricsObserver::on_checkpoint(const fs::path& p, const std::string& kind) {
  impl_->write({{"type", "checkpoint"}, {"kind", kind}, {"path", p.string()}});
}
void JsonlMetricsObserver::on_case_failure(const pipeline::CaseFailure& f) {
  impl_->write({{"type", "case_failure"}, {"case", f.case_id}, {"reason", f.reason}});
}
void JsonlMetricsObserver::on_early_stop(const models::EarlyStopInfo& i) {
  if (i.earlier) return;
  json j = {{"type", "early_stop"}};
  j.update(models::early_stop_info_json(i));
  impl_->write(j);
}
void JsonlMetricsObserver::on_data_event(const Event& e) {
  json j = event_to_json(e);
  j["type"] = "data_event";
  impl_->write(j);
}

namespace {

bool keep_metrics_line(const std::string& line, const models::TrainState& at) {
  const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return false;  // torn by the crash
  const std::string type = j.value("type", "");
  if (type == "step") return j.value("step", std::int64_t{0}) <= at.step;
  if (type == "epoch" || type == "validation" || type == "early_stop")
    return j.value("epoch", std::int64_t{0}) < at.epoch;
  if (type == "data_event") return j.value("epoch", std::int64_t{-1}) < at.epoch;
  return true;  // checkpoints written, cases skipped: facts of the earlier run
}

}  // namespace

Result<std::int64_t> trim_metrics_jsonl(const fs::path& metrics, const models::TrainState& at) {
  std::error_code ec;
  if (!fs::exists(metrics, ec)) return std::int64_t{0};
  std::ifstream in(metrics, std::ios::binary);
  std::string kept;
  std::int64_t dropped = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    if (keep_metrics_line(line, at))
      kept += line + '\n';
    else
      ++dropped;
  }
  if (dropped > 0) SEGFLOW_RETURN_IF_ERROR(write_file_atomically(metrics, kept));
  return dropped;
}

}  // namespace segflow::actors

#include "actors/jobs/validation_predictions.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>

#include "messages/file_util.hpp"
#include "messages/log.hpp"
#include "models/evidence/evaluation.hpp"
#include "models/inference/inference.hpp"
#include "models/training/run_layout.hpp"
#include "pipeline/io/dataset.hpp"

namespace segflow::actors {

namespace fs = std::filesystem;

namespace {

/// The validation cases as inference cases (their channels) and evaluation pairs (their
/// labels); cases without a label are predicted but not scored.
models::InferOptions infer_options(const models::JobConfig& cfg, const pipeline::Split& split,
                                   const fs::path& run_dir, const fs::path& out, const std::string& device) {
  models::InferOptions o;
  o.save_probabilities = cfg.validation.save_probabilities;
  o.checkpoint = models::RunLayout(run_dir).last_checkpoint();
  o.output = out;
  o.device = device;
  o.format = "nifti";
  for (const auto& c : split.val) o.cases.push_back({c.id, c.images, false});
  return o;
}

/// Scores the written predictions; summary.json and scores.csv into `out` (the validation
/// folder being written).
Status score(const pipeline::Split& split, const models::InferBatchResult& written, const fs::path& out,
             double seconds) {
  models::EvaluateOptions eo;
  for (const auto& r : written.outputs) {
    auto it = std::find_if(split.val.begin(), split.val.end(),
                           [&](const pipeline::CaseEntry& c) { return c.id == r.case_id; });
    if (it != split.val.end() && it->label) eo.pairs.push_back({r.case_id, r.output, *it->label});
  }
  nlohmann::json summary;
  if (!eo.pairs.empty()) {
    SEGFLOW_ASSIGN_OR_RETURN(models::EvaluationReport report, models::evaluate(eo));
    summary = models::evaluation_json(report);
    SEGFLOW_RETURN_IF_ERROR(write_file_atomically(out / "scores.csv", models::evaluation_csv(report)));
  }
  summary["checkpoint"] = models::kLastCheckpoint;
  summary["fold"] = split.fold;
  summary["predicted"] = written.outputs.size();
  summary["predict_seconds"] = seconds;
  nlohmann::json failed = nlohmann::json::array();
  for (const auto& [id, why] : written.failed) failed.push_back({{"case", id}, {"error", why}});
  summary["predict_failed"] = failed;
  return write_file_atomically(out / models::RunLayout(out.parent_path()).validation_summary().filename(),
                               summary.dump(2) + "\n");
}

}  // namespace

Status write_validation_predictions(const models::JobConfig& cfg, const pipeline::Split& split,
                                    const fs::path& run_dir, const models::Trainer& trainer) {
  if (!cfg.validation.save_predictions || split.val.empty()) return Status::ok();
  if (trainer.model().info().needs_box) {
    log::info("validation predictions: none for a box-prompted model (segflow infer takes no boxes yet)");
    return Status::ok();
  }
  const std::string device = trainer.device().str();
  const models::RunLayout run(run_dir);
  std::error_code ec;
  if (!fs::is_regular_file(run.last_checkpoint(), ec))
    return not_found(run.last_checkpoint().string() +
                     ": no final checkpoint to predict the validation cases with");
  const fs::path final_dir = run.validation(), tmp = final_dir.string() + ".partial";
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  if (ec) return io_error(tmp.string() + ": cannot create the folder: " + ec.message());
  const auto t0 = std::chrono::steady_clock::now();
  SEGFLOW_ASSIGN_OR_RETURN(models::InferBatchResult written,
                           models::run_inference_batch(infer_options(cfg, split, run_dir, tmp, device)));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (written.outputs.empty())
    return internal_error(run_dir.string() + ": no validation case could be predicted; first error: " +
                          (written.failed.empty() ? std::string("none") : written.failed.front().second));
  SEGFLOW_RETURN_IF_ERROR(score(split, written, tmp, seconds));
  fs::remove_all(final_dir, ec);
  fs::rename(tmp, final_dir, ec);
  if (ec) return io_error(final_dir.string() + ": cannot move the predictions in place: " + ec.message());
  log::info("validation predictions: " + std::to_string(written.outputs.size()) + " cases in " +
            final_dir.string() + " (" + std::to_string(static_cast<int>(seconds * 1000)) + " ms)");
  return Status::ok();
}

}  // namespace segflow::actors

// Inference jobs (`segflow ctl infer`, auto_infer): the request checked and stored as JSON,
// recovery at start, and the worker that runs models::run_inference on one scan or
// run_inference_batch on a folder or dataset, publishing each case as "metrics.<id>".
#include <cmath>
#include <functional>
#include <string>
#include <utility>

#include "daemon/detail/job.hpp"
#include "daemon/job_manager.hpp"
#include "messages/log.hpp"
#include "models/inference/box_inference.hpp"
#include "models/inference/inference.hpp"
#include "models/inference/model_package.hpp"
#include "models/training/trainer.hpp"

namespace segflow::daemon {

namespace fs = std::filesystem;
using detail::absolute_path;
using nlohmann::json;

namespace {

json spec_to_json(const InferJobSpec& s) {
  json j = {
      {"checkpoint", s.checkpoint}, {"input", s.input},     {"output", s.output},   {"tta", s.tta},
      {"device", s.device},         {"trigger", s.trigger}, {"dataset", s.dataset}, {"case", s.case_id}};
  if (!s.model.empty()) j["model"] = s.model;
  if (s.box_prompted())
    j["box_prompts"] = {{"boxes", s.boxes},
                        {"boxes_from", s.boxes_from},
                        {"propagate", s.propagate},
                        {"box_margin", s.box_margin}};
  return j;
}

Result<InferJobSpec> spec_from_json(const std::string& text) {
  try {
    const json j = json::parse(text);
    InferJobSpec s;
    s.checkpoint = j.at("checkpoint").get<std::string>();
    s.model = j.value("model", std::string());
    s.input = j.at("input").get<std::string>();
    s.output = j.at("output").get<std::string>();
    s.tta = j.value("tta", std::string("none"));
    s.device = j.value("device", std::string("auto"));
    s.trigger = j.value("trigger", std::string());
    s.dataset = j.value("dataset", std::string());
    s.case_id = j.value("case", std::string());
    if (j.contains("box_prompts")) {
      const json& b = j.at("box_prompts");
      s.boxes = b.value("boxes", std::string());
      s.boxes_from = b.value("boxes_from", std::string());
      s.propagate = b.value("propagate", false);
      s.box_margin = b.value("box_margin", std::int64_t{-1});
    }
    return s;
  } catch (const std::exception& e) {
    return corrupt_data(std::string("stored inference request: ") + e.what());
  }
}

/// The trigger fields of an inference job's events and status (auto_infer only).
void add_trigger(json& body, const InferJobSpec& s) {
  if (s.trigger.empty()) return;
  body["trigger"] = s.trigger;
  body["dataset"] = s.dataset;
  body["case"] = s.case_id;
}

json infer_output_json(const models::InferResult& r) {
  return {{"case", r.case_id},
          {"output", r.output.string()},
          {"size", {r.size[0], r.size[1], r.size[2]}},
          {"labels", r.labels},
          {"seconds", r.seconds}};
}

/// Box prompts: one source, no package or TTA, paths absolute.
Status check_box_request(InferJobSpec& spec) {
  if (!spec.box_prompted()) return Status::ok();
  if (spec.boxes.empty() == spec.boxes_from.empty())
    return invalid_argument("boxes or boxes_from: expected one of them for box-prompted inference");
  if (!spec.model.empty()) return invalid_argument("model: box prompts take a checkpoint, not a package");
  if (!spec.tta.empty() && spec.tta != "none")
    return invalid_argument("tta: box-prompted inference has no TTA; got " + spec.tta);
  if (!spec.boxes.empty()) spec.boxes = absolute_path(spec.boxes).string();
  if (!spec.boxes_from.empty()) spec.boxes_from = absolute_path(spec.boxes_from).string();
  return Status::ok();
}

/// A box-prompted request's files: one scan, the box file or label map present, a checkpoint
/// that takes boxes; and a checkpoint that takes boxes only with them.
Status check_box_paths(const InferJobSpec& spec, bool needs_box) {
  if (!spec.box_prompted()) {
    if (needs_box)
      return invalid_argument("checkpoint: " + spec.checkpoint +
                              ": a box-prompted model needs boxes (boxes or boxes_from)");
    return Status::ok();
  }
  if (!needs_box)
    return invalid_argument("boxes: " + spec.checkpoint + " is not a box-prompted (sam) checkpoint");
  std::error_code ec;
  const std::string& file = spec.boxes.empty() ? spec.boxes_from : spec.boxes;
  if (!fs::is_regular_file(file, ec))
    return not_found(std::string(spec.boxes.empty() ? "boxes_from: " : "boxes: ") + file + ": no such file");
  if (!models::is_single_scan(spec.input))
    return invalid_argument("input: " + spec.input + ": box-prompted inference takes one scan");
  return Status::ok();
}

/// The request's own fields: present, absolute, tta and device parsed.
Status check_request(InferJobSpec& spec) {
  SEGFLOW_RETURN_IF_ERROR(check_box_request(spec));
  if (!spec.model.empty() && !spec.checkpoint.empty())
    return invalid_argument("model: a package names its checkpoints; got checkpoint " + spec.checkpoint +
                            " too");
  if (!spec.model.empty() && !spec.tta.empty() && spec.tta != "none")
    return invalid_argument("model: a package sets its TTA; got tta " + spec.tta + " too");
  if (spec.checkpoint.empty() && spec.model.empty())
    return invalid_argument(
        "checkpoint: missing (a best.pt or last.pt of a run, or model: a package folder)");
  if (!spec.model.empty()) spec.model = absolute_path(spec.model).string();
  if (spec.input.empty()) return invalid_argument("input: missing (a scan, a folder of scans or a dataset)");
  if (spec.output.empty()) return invalid_argument("output: missing (a label map file or a folder)");
  if (!spec.checkpoint.empty()) spec.checkpoint = absolute_path(spec.checkpoint).string();
  spec.input = absolute_path(spec.input).string();
  spec.output = absolute_path(spec.output).string();
  if (spec.tta.empty()) spec.tta = "none";
  if (spec.device.empty()) spec.device = "auto";
  auto tta = models::parse_tta(spec.tta);
  if (!tta.is_ok()) return invalid_argument("tta: " + tta.status().message());
  if (spec.device != "auto") {
    auto d = models::resolve_device(spec.device);
    if (!d.is_ok()) return invalid_argument("device: " + d.status().message());
  }
  return Status::ok();
}

/// What the request names on disk: a checkpoint that loads, an input with scans, an output
/// whose folder exists (a folder for a batch).
Status check_paths(const InferJobSpec& spec) {
  std::error_code ec;
  if (!spec.model.empty()) {
    // The whole package: its manifest and every file's sha256.
    auto package = models::read_model_package(spec.model);
    if (!package.is_ok()) return invalid_argument("model: " + package.status().message());
  } else if (!fs::is_regular_file(spec.checkpoint, ec)) {
    return not_found("checkpoint: " + spec.checkpoint + ": no such file");
  } else {
    auto model = models::load_for_inference(spec.checkpoint, "cpu");
    if (!model.is_ok())
      return invalid_argument("checkpoint: " + spec.checkpoint +
                              ": cannot be loaded: " + model.status().message());
    SEGFLOW_RETURN_IF_ERROR(check_box_paths(spec, (*model)->model().info().needs_box));
  }
  if (!fs::exists(spec.input, ec)) return not_found("input: " + spec.input + ": no such file or folder");
  const bool single = models::is_single_scan(spec.input);
  if (!single) {
    auto cases = models::list_inference_cases(spec.input);
    if (!cases.is_ok()) return invalid_argument("input: " + cases.status().message());
    if (cases->empty()) return invalid_argument("input: " + spec.input + ": expected scans, found none");
  }
  // An existing folder takes the output; else the output's folder must exist (a batch creates its folder).
  const fs::path out_dir =
      fs::is_directory(spec.output, ec) ? fs::path(spec.output) : fs::path(spec.output).parent_path();
  if (!fs::is_directory(out_dir, ec))
    return not_found("output: " + spec.output + ": its folder " + out_dir.string() + " does not exist");
  if (!single && fs::exists(spec.output, ec) && !fs::is_directory(spec.output, ec))
    return invalid_argument("output: " + spec.output +
                            ": expected a folder for a folder or dataset input, got a file");
  return Status::ok();
}

/// What one run of an inference job wrote and could not write.
struct InferRun {
  Status status = Status::ok();
  json outputs = json::array();
  json failed = json::array();  ///< [{case, error}]
};

/// Runs the job's inference; exceptions become the run's status.
InferRun run_inference_job_body(const models::InferOptions& io, bool single,
                                const std::function<void(const models::InferProgress&)>& progress) {
  InferRun run;
  try {
    if (single) {
      auto r = models::run_inference(io);
      if (r.is_ok())
        run.outputs.push_back(infer_output_json(*r));
      else
        run.status = r.status();
      return run;
    }
    auto r = models::run_inference_batch(io, progress);
    if (!r.is_ok()) {
      run.status = r.status();
      return run;
    }
    for (const auto& o : r->outputs) run.outputs.push_back(infer_output_json(o));
    for (const auto& [id, why] : r->failed) run.failed.push_back({{"case", id}, {"error", why}});
    if (run.outputs.empty() && !run.failed.empty())
      run.status = internal_error("every case failed; first: " + r->failed.front().first + ": " +
                                  r->failed.front().second);
  } catch (const std::exception& e) {
    run.status = internal_error(std::string("inference failed with an exception: ") + e.what());
  } catch (...) {
    run.status = internal_error("inference failed with an unknown exception");
  }
  return run;
}

/// Runs a box-prompted job (one scan); exceptions become the run's status.
InferRun run_box_job_body(const InferJobSpec& spec, const std::string& device) {
  InferRun run;
  try {
    models::BoxInferOptions o;
    o.checkpoint = spec.checkpoint;
    o.input = spec.input;
    o.output = spec.output;
    o.device = device;
    o.boxes = spec.boxes;
    o.boxes_from = spec.boxes_from;
    o.propagate = spec.propagate;
    if (spec.box_margin >= 0) o.box_margin = spec.box_margin;
    auto r = models::run_box_inference(o);
    if (r.is_ok())
      run.outputs.push_back(infer_output_json(r->result));
    else
      run.status = r.status();
  } catch (const std::exception& e) {
    run.status = internal_error(std::string("inference failed with an exception: ") + e.what());
  }
  return run;
}

/// The reason of a completed run: what was written where, and the first failed case.
std::string completed_reason(const InferRun& run, const std::string& output) {
  std::string reason = std::to_string(run.outputs.size()) + " label map(s) written to " + output;
  if (!run.failed.empty())
    reason += "; " + std::to_string(run.failed.size()) + " case(s) failed, first " +
              run.failed[0]["case"].get<std::string>() + ": " + run.failed[0]["error"].get<std::string>();
  return reason;
}

}  // namespace

namespace detail {

void add_infer_event_fields(const Job& j, json& body) {
  body["output"] = j.infer.output;
  if (!j.outputs.empty()) body["outputs"] = j.outputs;
  add_trigger(body, j.infer);
}

void add_infer_status_fields(const Job& j, json& body) {
  body["checkpoint"] = j.infer.checkpoint;
  if (!j.infer.model.empty()) body["model"] = j.infer.model;
  body["input"] = j.infer.input;
  body["output"] = j.infer.output;
  body["tta"] = j.infer.tta;
  if (!j.infer.boxes.empty()) body["boxes"] = j.infer.boxes;
  if (!j.infer.boxes_from.empty()) body["boxes_from"] = j.infer.boxes_from;
  if (j.infer.propagate) body["propagate"] = true;
  body["outputs"] = j.outputs;
  add_trigger(body, j.infer);
}

}  // namespace detail

Result<json> JobManager::submit_infer(InferJobSpec spec) {
  // Everything checked before a job exists; each error names its field.
  SEGFLOW_RETURN_IF_ERROR(check_request(spec));
  SEGFLOW_RETURN_IF_ERROR(check_paths(spec));
  JobRecord rec;
  rec.kind = JobKind::infer;
  rec.name = "infer " + fs::path(spec.input).filename().string();
  rec.file = spec.model.empty() ? spec.checkpoint : spec.model;
  rec.config_yaml = spec_to_json(spec).dump();
  rec.state = JobState::queued;
  rec.run_dir = spec.output;
  rec.loss = std::nan("");
  rec.created = rec.updated = StateDb::now();

  std::lock_guard<std::mutex> lock(mu_);
  SEGFLOW_ASSIGN_OR_RETURN(Job * job, insert_locked(std::move(rec)));
  job->infer = std::move(spec);
  log::info("job " + std::to_string(job->rec.id) + " (" + job->rec.name + ") queued; output " +
            job->infer.output);
  publish_state_locked(*job);
  schedule_locked();
  json reply = {{"job", job->rec.id},
                {"state", to_string(job->rec.state)},
                {"kind", to_string(job->rec.kind)},
                {"output", job->infer.output}};
  add_trigger(reply, job->infer);
  return reply;
}

void JobManager::restore_infer_locked(Job& j) {
  const bool active = j.rec.state == JobState::running || j.rec.state == JobState::queued;
  auto spec = spec_from_json(j.rec.config_yaml);
  if (spec.is_ok()) {
    j.infer = std::move(*spec);
  } else if (active || j.rec.state == JobState::paused) {
    j.rec.state = JobState::failed;
    j.rec.reason = spec.status().message();
    save_locked(j);
  }
  if (j.rec.state == JobState::running || j.rec.state == JobState::queued) {
    if (j.rec.state == JobState::running) j.rec.reason = "restarting after a daemon restart";
    j.rec.state = JobState::queued;
    j.rec.epoch = 0;
    save_locked(j);
  }
}

void JobManager::run_infer_job(Job* j) {
  models::InferOptions io;
  bool single = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    io.checkpoint = j->infer.checkpoint;
    io.model = j->infer.model;
    io.input = j->infer.input;
    io.output = j->infer.output;
    io.device = j->rec.device;
    auto tta = models::parse_tta(j->infer.tta);
    if (tta.is_ok()) io.tta = *tta;
    single = models::is_single_scan(io.input);
    j->outputs = json::array();
    j->rec.epoch = 0;
    j->rec.epochs = single ? 1 : 0;
  }
  // A batch reports each case before and after it (epoch/epochs count the cases).
  auto progress = [this, j](const models::InferProgress& p) {
    std::lock_guard<std::mutex> lock(mu_);
    j->rec.epochs = static_cast<std::int64_t>(p.total);
    json body = {{"job", j->rec.id}, {"type", "case"},   {"case", p.case_id},
                 {"index", p.index}, {"total", p.total}, {"done", p.done}};
    if (p.done) {
      j->rec.epoch = static_cast<std::int64_t>(p.index + 1);
      body["seconds"] = p.seconds;
      if (!p.error.empty()) body["error"] = p.error;
      if (!p.output.empty()) body["output"] = p.output.string();
      save_locked(*j);
    }
    publish_(j->metrics_topic(), body);
  };
  const InferRun run = j->infer.box_prompted() ? run_box_job_body(j->infer, io.device)
                                               : run_inference_job_body(io, single, progress);
  std::lock_guard<std::mutex> lock(mu_);
  j->outputs = run.outputs;
  if (!run.status.is_ok()) {
    end_job_locked(*j, JobState::failed, run.status.message(), run.status.code());
    return;
  }
  j->rec.epoch = j->rec.epochs = static_cast<std::int64_t>(run.outputs.size() + run.failed.size());
  end_job_locked(*j, JobState::completed, completed_reason(run, j->infer.output));
}

}  // namespace segflow::daemon

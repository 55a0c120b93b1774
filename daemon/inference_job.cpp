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

/// The stored form: the request's fields and the trigger's.
json spec_to_json(const InferJobSpec& s) {
  json j = s.request.to_json();
  j["trigger"] = s.trigger;
  j["dataset"] = s.dataset;
  j["case"] = s.case_id;
  return j;
}

Result<InferJobSpec> spec_from_json(const std::string& text) {
  json j;
  try {
    j = json::parse(text);
  } catch (const std::exception& e) {
    return corrupt_data(std::string("stored inference request: ") + e.what());
  }
  if (!j.is_object()) return corrupt_data("stored inference request: expected a JSON object");
  // Stored before the request was one table: a single checkpoint ("" with a package) and the
  // box prompts nested.
  if (j.contains("checkpoint") && j["checkpoint"] == "") j.erase("checkpoint");
  if (j.contains("box_prompts")) {
    const json nested = j["box_prompts"];
    j.erase("box_prompts");
    for (const auto& [k, v] : nested.items())
      if (!(v == "" || v == false || v == -1)) j[k] = v;
  }
  InferJobSpec s;
  s.trigger = j.value("trigger", std::string());
  s.dataset = j.value("dataset", std::string());
  s.case_id = j.value("case", std::string());
  auto r = models::read_infer_request(j, "stored inference request: ", {"trigger", "dataset", "case"});
  if (!r.is_ok()) return corrupt_data(r.status().message());
  s.request = std::move(*r);
  return s;
}

/// The trigger fields of an inference job's events and status (auto_infer only).
void add_trigger(json& body, const InferJobSpec& s) {
  if (s.trigger.empty()) return;
  body["trigger"] = s.trigger;
  body["dataset"] = s.dataset;
  body["case"] = s.case_id;
}

json infer_output_json(const models::InferResult& r) {
  json j = {{"case", r.case_id},
            {"output", r.output.string()},
            {"size", {r.size[0], r.size[1], r.size[2]}},
            {"labels", r.labels},
            {"seconds", r.seconds}};
  if (!r.also_written.empty()) {
    j["also_output"] = json::array();
    for (const auto& f : r.also_written) j["also_output"].push_back(f.string());
  }
  return j;
}

/// A box-prompted request's files: one scan, the box file or label map present, a checkpoint
/// that takes boxes; and a checkpoint that takes boxes only with them.
Status check_box_paths(const models::InferRequest& r, bool needs_box) {
  const std::string checkpoint = r.options.checkpoint.string();
  if (!r.box_prompted()) {
    if (needs_box)
      return invalid_argument("checkpoint: " + checkpoint +
                              ": a box-prompted model needs boxes (boxes or boxes_from)");
    return Status::ok();
  }
  if (!needs_box) return invalid_argument("boxes: " + checkpoint + " is not a box-prompted (sam) checkpoint");
  std::error_code ec;
  const std::string& file = r.boxes.empty() ? r.boxes_from : r.boxes;
  if (!fs::is_regular_file(file, ec))
    return not_found(std::string(r.boxes.empty() ? "boxes_from: " : "boxes: ") + file + ": no such file");
  if (!models::is_single_scan(r.options.input))
    return invalid_argument("input: " + r.options.input.string() + ": box-prompted inference takes one scan");
  return Status::ok();
}

/// The request's own fields: present and absolute (bind checked each field and the rules
/// between them).
Status check_request(models::InferRequest& r) {
  SEGFLOW_RETURN_IF_ERROR(r.check());
  models::InferOptions& o = r.options;
  if (o.checkpoint.empty() && o.model.empty())
    return invalid_argument(
        "checkpoint: missing (a best.pt or last.pt of a run, or model: a package folder)");
  if (o.input.empty()) return invalid_argument("input: missing (a scan, a folder of scans or a dataset)");
  if (o.output.empty()) return invalid_argument("output: missing (a label map file or a folder)");
  auto absolute = [](fs::path& p) {
    if (!p.empty()) p = absolute_path(p.string());
  };
  absolute(o.checkpoint);
  for (auto& e : o.ensemble) absolute(e);
  absolute(o.model);
  absolute(o.input);
  absolute(o.output);
  for (auto& f : o.also_output) absolute(f);
  if (!r.postprocess.empty() && r.postprocess != "none")
    r.postprocess = absolute_path(r.postprocess).string();
  if (!r.boxes.empty()) r.boxes = absolute_path(r.boxes).string();
  if (!r.boxes_from.empty()) r.boxes_from = absolute_path(r.boxes_from).string();
  return Status::ok();
}

/// What the request names on disk: checkpoints that load, an input with scans, an output
/// whose folder exists (a folder for a batch), a postprocessing plan that reads.
Status check_paths(const models::InferRequest& r) {
  const models::InferOptions& o = r.options;
  std::error_code ec;
  if (!o.model.empty()) {
    // The whole package: its manifest and every file's sha256.
    auto package = models::read_model_package(o.model);
    if (!package.is_ok()) return invalid_argument("model: " + package.status().message());
  } else {
    std::vector<fs::path> members = {o.checkpoint};
    members.insert(members.end(), o.ensemble.begin(), o.ensemble.end());
    for (const fs::path& m : members) {
      if (!fs::is_regular_file(m, ec)) return not_found("checkpoint: " + m.string() + ": no such file");
      auto model = models::load_for_inference(m, "cpu");
      if (!model.is_ok())
        return invalid_argument("checkpoint: " + m.string() +
                                ": cannot be loaded: " + model.status().message());
      if (m == o.checkpoint) SEGFLOW_RETURN_IF_ERROR(check_box_paths(r, (*model)->model().info().needs_box));
    }
  }
  if (const fs::path plan = r.postprocess_file(); !plan.empty()) {
    auto p = models::read_postprocessing(plan);
    if (!p.is_ok()) return invalid_argument("postprocess: " + p.status().message());
  }
  const std::string input = o.input.string(), output = o.output.string();
  if (!fs::exists(input, ec)) return not_found("input: " + input + ": no such file or folder");
  const bool single = models::is_single_scan(input);
  if (!single) {
    auto cases = models::list_inference_cases(input);
    if (!cases.is_ok()) return invalid_argument("input: " + cases.status().message());
    if (cases->empty()) return invalid_argument("input: " + input + ": expected scans, found none");
  }
  // An existing folder takes the output; else the output's folder must exist (a batch creates its folder).
  const fs::path out_dir = fs::is_directory(output, ec) ? fs::path(output) : fs::path(output).parent_path();
  if (!fs::is_directory(out_dir, ec))
    return not_found("output: " + output + ": its folder " + out_dir.string() + " does not exist");
  if (single && !fs::is_directory(output, ec))
    if (Status st = models::check_label_map_path(output); !st.is_ok())
      return invalid_argument("output: " + st.message());
  if (!single && !o.also_output.empty())
    return invalid_argument("also_output: " + o.also_output.front().string() +
                            ": names a file of one scan; " + input + " is a folder or dataset");
  for (const fs::path& f : o.also_output) {
    if (!fs::is_directory(f.parent_path(), ec))
      return not_found("also_output: " + f.string() + ": its folder " + f.parent_path().string() +
                       " does not exist");
    SEGFLOW_RETURN_IF_ERROR(models::check_label_map_path(f, "also_output"));
  }
  if (!single && fs::exists(output, ec) && !fs::is_directory(output, ec))
    return invalid_argument("output: " + output +
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
InferRun run_box_job_body(const models::InferRequest& request, const std::string& device) {
  InferRun run;
  try {
    models::BoxInferOptions o = request.box_options();
    o.device = device;
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
  body["output"] = j.infer.request.options.output.string();
  if (!j.outputs.empty()) body["outputs"] = j.outputs;
  add_trigger(body, j.infer);
}

void add_infer_status_fields(const Job& j, json& body) {
  // The request as stored (every option it names), then what it wrote.
  const json request = j.infer.request.to_json();  // a local: items() of a temporary dangles
  for (const auto& [k, v] : request.items()) body[k] = v;
  body["checkpoint"] = j.infer.request.options.checkpoint.string();
  if (!j.infer.request.options.ensemble.empty()) {
    json rest = json::array();
    for (const auto& e : j.infer.request.options.ensemble) rest.push_back(e.string());
    body["ensemble"] = rest;
  }
  body["outputs"] = j.outputs;
  add_trigger(body, j.infer);
}

}  // namespace detail

Result<json> JobManager::submit_infer(InferJobSpec spec) {
  // Everything checked before a job exists; each error names its field.
  SEGFLOW_RETURN_IF_ERROR(check_request(spec.request));
  SEGFLOW_RETURN_IF_ERROR(check_paths(spec.request));
  const models::InferOptions& o = spec.request.options;
  JobRecord rec;
  rec.kind = JobKind::infer;
  rec.name = "infer " + o.input.filename().string();
  rec.file = (o.model.empty() ? o.checkpoint : o.model).string();
  rec.config_yaml = spec_to_json(spec).dump();
  rec.state = JobState::queued;
  rec.run_dir = o.output.string();
  rec.loss = std::nan("");
  rec.created = rec.updated = StateDb::now();

  std::lock_guard<std::mutex> lock(mu_);
  SEGFLOW_ASSIGN_OR_RETURN(Job * job, insert_locked(std::move(rec)));
  job->infer = std::move(spec);
  log::info("job " + std::to_string(job->rec.id) + " (" + job->rec.name + ") queued; output " +
            job->infer.request.options.output.string());
  publish_state_locked(*job);
  schedule_locked();
  json reply = {{"job", job->rec.id},
                {"state", to_string(job->rec.state)},
                {"kind", to_string(job->rec.kind)},
                {"output", job->infer.request.options.output.string()}};
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
    io = j->infer.request.run_options();
    io.device = j->rec.device;
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
  const InferRun run = j->infer.request.box_prompted() ? run_box_job_body(j->infer.request, io.device)
                                                       : run_inference_job_body(io, single, progress);
  std::lock_guard<std::mutex> lock(mu_);
  j->outputs = run.outputs;
  if (!run.status.is_ok()) {
    end_job_locked(*j, JobState::failed, run.status.message(), run.status.code());
    return;
  }
  j->rec.epoch = j->rec.epochs = static_cast<std::int64_t>(run.outputs.size() + run.failed.size());
  end_job_locked(*j, JobState::completed, completed_reason(run, io.output.string()));
}

}  // namespace segflow::daemon

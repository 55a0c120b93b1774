#include "daemon/auto_infer.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <cstdio>

#include "daemon/dicom/service.hpp"
#include "messages/hashing.hpp"
#include "messages/log.hpp"
#include "models/inference/box_inference.hpp"

namespace segflow::daemon {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

/// The state database key of a DICOM case's record.
std::string meta_key(const std::string& dataset, const std::string& case_id) {
  return "auto_infer:" + dataset + "/" + case_id;
}

/// The stored record of a DICOM case; an empty object when there is none (or it is unreadable).
json read_record(StateDb& db, const std::string& key) {
  auto v = db.meta(key);
  if (!v.is_ok() || v->empty()) return json::object();
  json j = json::parse(*v, nullptr, false);
  return j.is_object() ? j : json::object();
}

/// seg and/or nifti for one case: the rule's format, or seg for a DICOM series.
std::vector<std::string> formats_of(const AutoInferRule& rule, bool dicom_series) {
  const std::string f = rule.output_format.empty() ? (dicom_series ? "seg" : "nifti") : rule.output_format;
  if (f == "both") return {"nifti", "seg"};
  return {f};
}

/// A file's mtime in nanoseconds since the Unix epoch (as the watcher's case records); 0
/// when it cannot be read.
std::int64_t file_mtime_ns(const fs::path& p) {
  struct stat st {};
  if (::stat(p.c_str(), &st) != 0) return 0;
  return static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1000000000LL + st.st_mtim.tv_nsec;
}

/// "name size mtime" of each entry of a folder (a box rule's boxes_dir), sorted: a box file
/// that arrives or changes changes it. "" for a missing folder.
std::string folder_listing(const fs::path& dir) {
  std::vector<std::string> parts;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code ec2;
    const auto size = it->is_regular_file(ec2) ? it->file_size(ec2) : 0;
    parts.push_back(it->path().filename().string() + '\x1f' + std::to_string(size) + '\x1f' +
                    std::to_string(file_mtime_ns(it->path())));
  }
  std::sort(parts.begin(), parts.end());
  std::string out;
  for (const auto& p : parts) out += p + '\x1e';
  return out;
}

/// A box rule's prompts for one case: its prompt file (box file or label map) and that file's
/// mtime, or the error naming what is missing.
struct CasePrompts {
  fs::path file;
  std::int64_t mtime_ns = 0;
  std::string error;
};

/// The prompts of case `c` under `rule` (prompts: boxes | label_map); the box file is found by
/// the rule of `segflow infer --boxes DIR` (models::prompt_file_for).
CasePrompts prompts_of(const AutoInferRule& rule, const pipeline::CaseEntry& c) {
  CasePrompts p;
  if (rule.prompts == "boxes") {
    p.file = models::prompt_file_for(rule.boxes_dir, c.id, true);
    if (p.file.empty())
      p.error = rule.boxes_dir.string() + ": no box file " + c.id + ".json or " + c.id + ".csv for case " +
                c.id + " (prompts: boxes)";
  } else if (c.label) {
    p.file = *c.label;
  } else {
    p.error = "case " + c.id +
              ": no label map (prompts: label_map takes the case's label file, e.g. labelsTr/" + c.id +
              ".nii.gz)";
  }
  if (!p.file.empty()) p.mtime_ns = file_mtime_ns(p.file);
  return p;
}

constexpr const char* kEmptyReason =
    "the model found no foreground in this series; a DICOM SEG cannot hold zero segments, so no SEG "
    "was written or sent";

}  // namespace

std::string series_signature(const CaseRecord& rec, const std::string& label_path) {
  std::vector<std::string> parts;
  for (const auto& f : rec.files) {
    const std::string path = f.value("path", std::string());
    if (path.empty() || path == label_path) continue;
    parts.push_back(fs::path(path).filename().string() + '\x1f' + std::to_string(f.value("size", 0LL)) +
                    '\x1f' + std::to_string(f.value("mtime_ns", 0LL)));
  }
  std::sort(parts.begin(), parts.end());
  Fnv1a64 h;
  for (const auto& p : parts) h.add(p).add("\x1e");
  return std::to_string(parts.size()) + "-" + h.hex();
}

AutoInfer::AutoInfer(std::vector<AutoInferRule> rules, fs::path data_root, StateDb& db, JobManager& jobs,
                     PublishFn publish, dicom::DicomService* dicom)
    : rules_(std::move(rules)),
      data_root_(std::move(data_root)),
      db_(db),
      jobs_(jobs),
      publish_(std::move(publish)),
      dicom_(dicom) {}

Status AutoInfer::prepare() {
  for (const auto& r : rules_) {
    std::error_code ec;
    fs::create_directories(r.output, ec);
    if (!fs::is_directory(r.output, ec))
      return io_error("auto_infer: output " + r.output.string() + " (dataset " + r.dataset +
                      "): cannot create the folder");
    const std::string prompts = r.prompts.empty()      ? ""
                                : r.prompts == "boxes" ? ", box prompts from " + r.boxes_dir.string()
                                                       : ", box prompts from each case's label map";
    log::info("auto_infer: new cases of " + r.dataset + " are inferred with " +
              (r.model.empty() ? r.checkpoint.string() : "the package " + r.model.string()) + prompts +
              (r.propagate ? " (propagated)" : "") + " into " + r.output.string() +
              (r.send_to.empty() ? "" : ", SEGs sent to " + r.send_to));
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

void AutoInfer::publish(const std::string& event, const std::string& dataset, const std::string& case_id,
                        json body) {
  body["event"] = event;
  body["dataset"] = dataset;
  body["case"] = case_id;
  if (event == "failed")
    log::error("auto_infer: " + dataset + "/" + case_id + ": " + body.value("stage", "") +
               " failed: " + body.value("error", ""));
  if (publish_) publish_("auto_infer", body);
}

void AutoInfer::store(const Tracked& t) {
  if (!t.stored) return;
  if (Status st = db_.set_meta(meta_key(t.dataset, t.case_id), t.record.dump()); !st.is_ok())
    log::error("auto_infer: " + st.message());
}

void AutoInfer::poll() {
  std::set<std::string> dirty;
  {
    std::lock_guard<std::mutex> lock(mu_);
    dirty.swap(dirty_);
  }
  for (std::size_t i = 0; i < rules_.size(); ++i) {
    try {
      poll_rule(i, dirty.count(rules_[i].dataset) > 0);
    } catch (const std::exception& e) {
      log::error("auto_infer: " + rules_[i].dataset + ": " + e.what());
    }
  }
  try {
    follow_jobs();
  } catch (const std::exception& e) {
    log::error(std::string("auto_infer: ") + e.what());
  }
}

void AutoInfer::poll_rule(std::size_t index, bool dirty) {
  const AutoInferRule& rule = rules_[index];
  auto records = db_.cases(rule.dataset);
  if (!records.is_ok()) {
    log::warn("auto_infer: " + rule.dataset + ": " + records.status().message());
    return;
  }
  // The case records change when the watcher indexes something: only then list the dataset
  // (or while a series waits for its quiet period to end).
  std::string signature;
  std::map<std::string, const CaseRecord*> by_id;
  for (const auto& c : *records) {
    signature += c.case_id + '\x1f' + c.status + '\x1f' + std::to_string(c.mtime_ns) + '\x1e';
    by_id[c.case_id] = &c;
  }
  if (rule.prompts == "boxes") signature += folder_listing(rule.boxes_dir);  // a box file that arrives late
  auto it = seen_.find(rule.dataset);
  if (!dirty && !quiet_.count(rule.dataset) && it != seen_.end() && it->second == signature) return;
  seen_[rule.dataset] = signature;
  quiet_.erase(rule.dataset);
  if (records->empty()) return;

  const fs::path root = data_root_ / rule.dataset;
  auto index_r = pipeline::scan_dataset(root, pipeline::ScanOptions{.validate = false});
  if (!index_r.is_ok()) {
    log::warn("auto_infer: " + rule.dataset + ": " + index_r.status().message());
    return;
  }
  for (const auto& c : index_r->cases) {
    auto rec = by_id.find(c.id);
    if (rec == by_id.end() || rec->second->status == "pending") continue;  // not complete yet
    consider_case(index, c, *rec->second);
  }
}

void AutoInfer::consider_case(std::size_t index, const pipeline::CaseEntry& c, const CaseRecord& rec) {
  const AutoInferRule& rule = rules_[index];
  const std::string key = rule.dataset + "/" + c.id;
  std::error_code ec;
  const bool series = c.images.size() == 1 && fs::is_directory(c.images.front(), ec);
  if (series && StateDb::now() - static_cast<double>(rec.mtime_ns) * 1e-9 < rule.quiet_seconds) {
    quiet_.insert(rule.dataset);  // look again at the next poll
    return;
  }
  // A case's version: its newest file, or its prompt file when that is newer (a box file
  // that arrives after the case, or is corrected, runs it again).
  const CasePrompts prompts = rule.prompts.empty() ? CasePrompts{} : prompts_of(rule, c);
  const std::int64_t version = std::max(rec.mtime_ns, prompts.mtime_ns);
  if (auto t = tried_.find(key); t != tried_.end() && t->second == version) return;
  tried_[key] = version;
  if (c.images.size() != 1) {
    log::warn("auto_infer: " + key + ": " + std::to_string(c.images.size()) +
              " image channels; auto_infer runs single-channel cases only (skipped)");
    return;
  }
  if (!prompts.error.empty()) {
    publish("failed", rule.dataset, c.id,
            {{"stage", "prompts"},
             {"prompts", rule.prompts},
             {"input", c.images.front().string()},
             {"error", prompts.error}});
    return;
  }
  if (series)
    submit_series(index, c, rec, prompts.file);
  else
    submit_nifti_case(index, c, version, prompts.file);
}

Result<std::int64_t> AutoInfer::submit(const AutoInferRule& rule, const pipeline::CaseEntry& c,
                                       const fs::path& out, const std::vector<fs::path>& also,
                                       const fs::path& prompt) {
  InferJobSpec spec;
  models::InferRequest& q = spec.request;
  q = rule.options;  // the rule's model options (amp, overlap, class names, postprocessing, ...)
  q.options.checkpoint = rule.checkpoint;
  q.options.model = rule.model;
  q.options.input = c.images.front();
  q.options.output = out;
  q.options.also_output = also;
  auto tta = models::parse_tta(rule.tta);
  if (tta.is_ok()) q.options.tta = *tta;
  q.options.device = rule.device;
  spec.trigger = "auto_infer";
  spec.dataset = rule.dataset;
  spec.case_id = c.id;
  if (!rule.prompts.empty()) {
    (rule.prompts == "boxes" ? q.boxes : q.boxes_from) = prompt.string();
    q.propagate = rule.propagate;
    q.box_margin = rule.box_margin;
  }
  auto r = jobs_.submit_infer(spec);
  if (!r.is_ok()) {
    publish("failed", rule.dataset, c.id,
            {{"stage", "submit"},
             {"input", q.options.input.string()},
             {"output", q.options.output.string()},
             {"error", r.status().message()}});
    return r.status();
  }
  const std::int64_t job = (*r)["job"].get<std::int64_t>();
  log::info("auto_infer: " + rule.dataset + "/" + c.id + ": job " + std::to_string(job) + " -> " +
            out.string());
  return job;
}

void AutoInfer::submit_nifti_case(std::size_t index, const pipeline::CaseEntry& c, std::int64_t version_ns,
                                  const fs::path& prompt) {
  const AutoInferRule& rule = rules_[index];
  std::error_code ec;
  for (const auto& format : formats_of(rule, false)) {
    if (format == "seg") {
      log::warn("auto_infer: " + rule.dataset + "/" + c.id +
                ": a DICOM SEG needs a DICOM series as input; this case is not one (no SEG written)");
      continue;
    }
    const fs::path out = rule.output / (c.id + ".nii.gz");
    // A job in flight, or one submitted since the case's newest file was written (this
    // daemon's or a previous one's, failed or not), is not repeated.
    if (fs::exists(out, ec) || jobs_.infer_submitted(out.string(), static_cast<double>(version_ns) * 1e-9))
      continue;
    auto job = submit(rule, c, out, {}, prompt);
    if (!job.is_ok()) continue;
    json body = {{"input", c.images.front().string()}, {"jobs", json::array({*job})}};
    if (!prompt.empty()) body["prompt_file"] = prompt.string();
    publish("received", rule.dataset, c.id, body);
    Tracked t;  // followed until its job ends (inferred or failed), not stored
    t.rule = index;
    t.dataset = rule.dataset;
    t.case_id = c.id;
    t.last_instance = static_cast<double>(version_ns) * 1e-9;
    t.stored = false;
    t.record = {
        {"jobs", json::array({*job})}, {"outputs", json::array({out.string()})}, {"state", "submitted"}};
    active_[rule.dataset + "/" + c.id] = std::move(t);
  }
}

void AutoInfer::submit_series(std::size_t index, const pipeline::CaseEntry& c, const CaseRecord& rec,
                              const fs::path& prompt) {
  const AutoInferRule& rule = rules_[index];
  Tracked t;
  t.rule = index;
  t.dataset = rule.dataset;
  t.case_id = c.id;
  t.last_instance = static_cast<double>(rec.mtime_ns) * 1e-9;
  const std::string key = meta_key(rule.dataset, c.id);
  // With prompts, the prompt file is part of the signature: new boxes make a new SEG.
  std::string signature = series_signature(rec, c.label ? c.label->string() : std::string());
  if (!prompt.empty()) {
    std::error_code ec;
    signature += "+prompts-" +
                 Fnv1a64()
                     .add(prompt.filename().string() + '\x1f' + std::to_string(fs::file_size(prompt, ec)) +
                          '\x1f' + std::to_string(file_mtime_ns(prompt)))
                     .hex();
  }
  t.record = read_record(db_, key);
  const bool seen = t.record.value("signature", "") == signature;
  const std::string state = seen ? t.record.value("state", "") : "";
  if (seen && state != "submitting") {
    // Seen before with these very instances: follow what is left of it (after a restart).
    t.last_instance = t.record.value("last_instance", t.last_instance);
    if (state == "submitted") active_[rule.dataset + "/" + c.id] = t;
    if (state == "queued") follow_send(t);
    log::info("auto_infer: " + rule.dataset + "/" + c.id + ": the same instances as before (" + signature +
              "): no new SEG");
    return;
  }
  if (!seen) {
    // Stored before the jobs are submitted: a daemon stopped in between finds them by it.
    t.record = {{"signature", signature},   {"jobs", json::array()},
                {"state", "submitting"},    {"last_instance", t.last_instance},
                {"outputs", json::array()}, {"submitted_at", StateDb::now()}};
    store(t);
  } else {
    t.last_instance = t.record.value("last_instance", t.last_instance);
    log::info("auto_infer: " + rule.dataset + "/" + c.id +
              ": resuming the submission a previous segflowd began");
  }
  submit_jobs(t, c, prompt);
  t.record["state"] = t.record["jobs"].empty() ? "failed" : "submitted";
  store(t);
  if (t.record["jobs"].empty()) return;
  json body = {{"input", c.images.front().string()},
               {"instances", std::stoll(signature.substr(0, signature.find('-')))},
               {"signature", signature},
               {"jobs", t.record["jobs"]}};
  if (!prompt.empty()) body["prompt_file"] = prompt.string();
  publish("received", rule.dataset, c.id, body);
  active_[rule.dataset + "/" + c.id] = std::move(t);
}

void AutoInfer::submit_jobs(Tracked& t, const pipeline::CaseEntry& c, const fs::path& prompt) {
  const AutoInferRule& rule = rules_[t.rule];
  const double since = t.record.value("submitted_at", 0.0);
  t.record["jobs"] = json::array();
  t.record["outputs"] = json::array();
  // One job for every format: the model runs once and writes the SEG and the NIfTI.
  std::vector<fs::path> outs;
  for (const auto& format : formats_of(rule, true))
    outs.push_back(rule.output / (c.id + (format == "seg" ? ".dcm" : ".nii.gz")));
  std::stable_partition(outs.begin(), outs.end(), [](const fs::path& p) { return p.extension() == ".dcm"; });
  // A job this record's submission made before a restart is the job: not submitted twice.
  std::int64_t job = jobs_.infer_job_since(outs.front().string(), since);
  if (job == 0) {
    auto r = submit(rule, c, outs.front(), {outs.begin() + 1, outs.end()}, prompt);
    if (!r.is_ok()) return;
    job = *r;
  }
  t.record["jobs"].push_back(job);
  for (const auto& o : outs) t.record["outputs"].push_back(o.string());
}

void AutoInfer::follow_jobs() {
  for (auto it = active_.begin(); it != active_.end();) {
    if (follow(it->second))
      it = active_.erase(it);
    else
      ++it;
  }
}

/// True when every job of `t` ended (then inferred or failed is published and the SEG queued).
bool AutoInfer::follow(Tracked& t) {
  std::string error;
  bool empty = false;
  json outputs = json::array();
  const json& jobs = t.record["jobs"];
  const json& written = t.record["outputs"];
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    const std::int64_t id = jobs[i].get<std::int64_t>();
    // The job's files: every output of the record (one job writes them all), or the i-th
    // (a record of an earlier segflowd, which ran a job per format).
    std::vector<std::string> files;
    if (jobs.size() == written.size())
      files.push_back(written.at(i).get<std::string>());
    else
      for (const auto& o : written) files.push_back(o.get<std::string>());
    auto rec = jobs_.record(id);
    if (!rec.is_ok()) {
      error = rec.status().message();
      continue;
    }
    if (!is_final(rec->state)) return false;
    // A SEG cannot hold zero segments: the writer's no_foreground (pipeline/io/dicom.hpp).
    // The label-map files are written before the SEG, so they are there all the same.
    if (rec->state == JobState::failed && rec->error == ErrorCode::no_foreground) {
      empty = true;
      std::error_code ec;
      for (const auto& f : files)
        if (fs::path(f).extension() != ".dcm" && fs::exists(f, ec)) outputs.push_back(f);
    } else if (rec->state != JobState::completed) {
      if (error.empty())
        error = "job " + std::to_string(id) + " " + to_string(rec->state) + ": " + rec->reason;
    } else {
      for (const auto& f : files) outputs.push_back(f);
    }
  }
  const double since = StateDb::now() - t.last_instance;
  if (!error.empty()) {
    t.record["state"] = "failed";
    store(t);
    publish("failed", t.dataset, t.case_id, {{"stage", "inference"}, {"jobs", jobs}, {"error", error}});
    return true;
  }
  json body = {{"jobs", jobs}, {"outputs", outputs}, {"seconds_since_last_instance", since}};
  if (empty) {
    body["empty"] = true;
    body["reason"] = kEmptyReason;
    log::info("auto_infer: " + t.dataset + "/" + t.case_id + ": " + kEmptyReason);
  }
  publish("inferred", t.dataset, t.case_id, body);
  if (empty) {
    t.record["state"] = "empty";
    store(t);
    return true;
  }
  std::string seg;
  for (const auto& o : outputs)
    if (fs::path(o.get<std::string>()).extension() == ".dcm") seg = o.get<std::string>();
  if (rules_[t.rule].send_to.empty() || seg.empty()) {
    t.record["state"] = "inferred";
    store(t);
    return true;
  }
  queue_seg(t, seg);
  return true;
}

void AutoInfer::queue_seg(Tracked& t, const std::string& seg) {
  if (!dicom_) {
    t.record["state"] = "failed";
    store(t);
    publish("failed", t.dataset, t.case_id, {{"stage", "send"}, {"error", "segflowd has no DICOM sender"}});
    return;
  }
  // The sender finds a SEG it has queued or sent already (a daemon stopped between queueing
  // it and recording the send below): it is queued once.
  auto r = dicom_->enqueue(seg, rules_[t.rule].send_target);
  if (!r.is_ok()) {
    t.record["state"] = "failed";
    store(t);
    publish("failed", t.dataset, t.case_id,
            {{"stage", "send"}, {"output", seg}, {"error", r.status().message()}});
    return;
  }
  t.record["state"] = "queued";
  t.record["send"] = r->id;
  store(t);
  follow_send(t);
}

void AutoInfer::follow_send(const Tracked& t) {
  const std::int64_t id = t.record.value("send", std::int64_t{0});
  std::lock_guard<std::mutex> lock(mu_);  // on_send_done waits: the send is found once registered
  // The send may have ended already: before a restart, or at the start of this daemon, whose
  // sender runs before auto_infer is there to hear of it.
  auto now = db_.dicom_send(id);
  if (now.is_ok() && now->id == id && (now->state == "sent" || now->state == "failed")) {
    send_ended_locked(Tracked(t), *now);
    return;
  }
  sends_[id] = t;
}

void AutoInfer::on_send_done(const DicomSendRecord& send) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sends_.find(send.id);
  if (it == sends_.end()) return;  // not a SEG of auto_infer
  if (send.state == "queued") {    // a failed attempt; the sender tries again at next_attempt
    const Tracked& q = it->second;
    publish("retrying", q.dataset, q.case_id,
            {{"send", send.id},
             {"destination", send.destination},
             {"attempts", send.attempts},
             {"error", send.last_error},
             {"next_attempt", send.next_attempt},
             {"retry_in_s", std::max(0.0, send.next_attempt - send.updated)}});
    return;
  }
  Tracked t = std::move(it->second);
  sends_.erase(it);
  send_ended_locked(std::move(t), send);
}

void AutoInfer::send_ended_locked(Tracked t, const DicomSendRecord& send) {
  const json common = {{"send", send.id},
                       {"destination", send.destination},
                       {"sop_instance_uid", send.sop_instance_uid},
                       {"output", send.source},
                       {"attempts", send.attempts}};
  t.record["state"] = send.state;
  store(t);
  json body = common;
  if (send.state == "sent") {
    body["seconds_since_last_instance"] = StateDb::now() - t.last_instance;
    publish("sent", t.dataset, t.case_id, body);
  } else {
    body["stage"] = "send";
    body["error"] = send.last_error;
    publish("failed", t.dataset, t.case_id, body);
  }
}

}  // namespace segflow::daemon

// A plan folder: written file by file through temporaries, checked for reuse, and made or
// reused under its lock (plan_or_reuse).
#include <torch/cuda.h>

#include <fstream>

#include "messages/file_util.hpp"
#include "models/planning/plan.hpp"
#include "models/training/run_layout.hpp"

namespace segflow::models::planning {

namespace fs = std::filesystem;

Status write_plan(const PlanResult& plan, const fs::path& out) {
  std::error_code ec;
  fs::create_directories(out, ec);
  if (ec) return io_error(out.string() + ": cannot create the plan folder: " + ec.message());
  // Everything is rendered before anything is written; plans.json goes last, so a folder
  // with plans.json has the rest (plan_is_current looks for it).
  std::vector<std::pair<fs::path, std::string>> files;
  files.emplace_back(out / "fingerprint.json", plan.fingerprint.to_json().dump(2) + '\n');
  for (const auto& c : plan.configurations)
    files.emplace_back(out / yaml_file_name(c.kind), plan.job_yaml(c));
  files.emplace_back(out / "plans.json", plan.plans_json().dump(2) + '\n');
  fs::remove(out / "plans.json", ec);  // an old plan is not current while it is replaced
  for (const auto& [path, bytes] : files) SEGFLOW_RETURN_IF_ERROR(write_file_atomically(path, bytes));
  return Status::ok();
}

Status copy_plan_into_run(const fs::path& plan_yaml, const fs::path& run_dir) {
  const fs::path dir = RunLayout(run_dir).plan();
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return io_error(dir.string() + ": cannot create: " + ec.message());
  for (const fs::path& f :
       {plan_yaml, plan_yaml.parent_path() / "plans.json", plan_yaml.parent_path() / "fingerprint.json"}) {
    fs::copy_file(f, dir / f.filename(), fs::copy_options::overwrite_existing, ec);
    if (ec) return io_error(f.string() + ": cannot copy into " + dir.string() + ": " + ec.message());
  }
  return Status::ok();
}

Status plan_is_current(const fs::path& out, const fs::path& dataset, ConfigurationKind k,
                       const std::string& preset) {
  const fs::path plans = out / "plans.json";
  if (!fs::exists(plans)) return not_found(plans.string() + ": no plan");
  SEGFLOW_ASSIGN_OR_RETURN(pipeline::DatasetFingerprint fp,
                           pipeline::read_fingerprint(out / "fingerprint.json"));
  SEGFLOW_ASSIGN_OR_RETURN(std::string now, pipeline::dataset_signature(dataset));
  if (fp.data_signature != now)
    return invalid_argument((out / "fingerprint.json").string() + ": data_signature: expected " + now +
                            " (the files of " + dataset.string() + " now), got " + fp.data_signature);
  std::ifstream f(plans);
  const auto j = nlohmann::json::parse(f, nullptr, false);
  if (j.is_discarded() || !j.contains("configurations") || !j["configurations"].contains(to_string(k)))
    return not_found(plans.string() + ": configurations: no " + to_string(k));
  // A plan from before presets is the default preset's.
  const std::string made = j.value("/segflow/preset"_json_pointer, std::string("default"));
  if (made != preset)
    return invalid_argument(plans.string() + ": segflow.preset: expected " + preset + ", got " + made);
  if (!fs::exists(out / yaml_file_name(k)))
    return not_found((out / yaml_file_name(k)).string() + ": missing");
  return Status::ok();
}

std::string default_plan_device() { return torch::cuda::is_available() ? "cuda:0" : "cpu"; }

namespace {

Result<FileLock> lock_plan_folder(const fs::path& out) {
  std::error_code ec;
  fs::create_directories(out, ec);
  if (ec) return io_error(out.string() + ": cannot create the plan folder: " + ec.message());
  return FileLock::acquire(out / ".plan.lock");
}

}  // namespace

Result<PlanResult> plan_into_folder(const fs::path& dataset, const fs::path& out,
                                    const PlanOptions& options) {
  // Planned first, so that a refused dataset leaves no folder; written under the lock, so
  // that plan_or_reuse never reads a folder half replaced.
  SEGFLOW_ASSIGN_OR_RETURN(PlanResult r, plan_dataset(dataset, options));
  SEGFLOW_ASSIGN_OR_RETURN(FileLock lock, lock_plan_folder(out));
  SEGFLOW_RETURN_IF_ERROR(write_plan(r, out));
  return r;
}

Result<EnsuredPlan> plan_or_reuse(const fs::path& dataset, const fs::path& out, ConfigurationKind kind,
                                  PlanOptions options, const PlanNoteFn& note) {
  // One planner at a time per plan folder (ranks of one job, two jobs on one dataset).
  SEGFLOW_ASSIGN_OR_RETURN(FileLock lock, lock_plan_folder(out));
  EnsuredPlan e;
  e.yaml = out / yaml_file_name(kind);
  const Status current = plan_is_current(out, dataset, kind, options.preset);
  if (current.is_ok()) {
    if (note) note("reusing the plan in " + out.string() + " (its fingerprint matches the data)");
    e.reused = true;
    return e;
  }
  if (note) note("planning " + dataset.string() + " into " + out.string() + " (" + current.message() + ")");
  options.configurations = {kind};
  if (kind == ConfigurationKind::lowres_3d)
    options.configurations.insert(options.configurations.begin(), ConfigurationKind::fullres_3d);
  SEGFLOW_ASSIGN_OR_RETURN(PlanResult r, plan_dataset(dataset, options));
  if (!r.find(kind))
    return invalid_argument(dataset.string() + ": configuration " + to_string(kind) + " was not planned" +
                            (r.notes.empty() ? std::string() : ": " + r.notes.front()));
  SEGFLOW_RETURN_IF_ERROR(write_plan(r, out));
  e.plan = std::move(r);
  return e;
}

}  // namespace segflow::models::planning

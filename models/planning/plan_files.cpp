// A plan folder: written file by file through temporaries, and checked for reuse.
#include <fstream>

#include "messages/file_util.hpp"
#include "models/planning/plan.hpp"

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

Status plan_is_current(const fs::path& out, const fs::path& dataset, ConfigurationKind k) {
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
  if (!fs::exists(out / yaml_file_name(k)))
    return not_found((out / yaml_file_name(k)).string() + ": missing");
  return Status::ok();
}

}  // namespace segflow::models::planning

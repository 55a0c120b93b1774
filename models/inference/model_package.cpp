#include "models/inference/model_package.hpp"

#include <algorithm>

#include "messages/file_util.hpp"
#include "messages/hashing.hpp"

namespace segflow::models {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

/// A field of model.json, checked: "MODEL_DIR/model.json: members[1].checkpoint: expected a string".
template <typename T>
Result<T> pkg_field(const json& j, const std::string& key, const fs::path& file, const std::string& where,
                    const char* expected) {
  const std::string name = where.empty() ? key : where + "." + key;
  if (!j.is_object() || !j.contains(key))
    return corrupt_data(file.string() + ": " + name + ": missing (expected " + expected + ")");
  try {
    return j.at(key).get<T>();
  } catch (const std::exception&) {
    return corrupt_data(file.string() + ": " + name + ": expected " + expected + ", got " + j.at(key).dump());
  }
}

Status verify_files(const fs::path& dir, const json& files, const fs::path& file) {
  if (!files.is_object() || files.empty())
    return corrupt_data(file.string() + ": files: expected {path: sha256} of the package's files");
  for (const auto& [rel, want] : files.items()) {
    const fs::path p = dir / rel;
    std::error_code ec;
    if (!fs::is_regular_file(p, ec))
      return not_found(p.string() + ": missing from the package (model.json lists it)");
    SEGFLOW_ASSIGN_OR_RETURN(std::string got, sha256_file(p));
    if (!want.is_string() || got != want.get<std::string>())
      return corrupt_data(p.string() + ": sha256 " + got + " differs from model.json's " +
                          (want.is_string() ? want.get<std::string>() : want.dump()) +
                          " (the file changed after packaging)");
  }
  return Status::ok();
}

Result<PackageMember> member_of(const json& m, const fs::path& file, const std::string& where,
                                const json& files) {
  PackageMember pm;
  SEGFLOW_ASSIGN_OR_RETURN(std::string ckpt,
                           pkg_field<std::string>(m, "checkpoint", file, where, "a relative path"));
  pm.checkpoint = ckpt;
  if (pm.checkpoint.is_absolute() || ckpt.find("..") != std::string::npos)
    return corrupt_data(file.string() + ": " + where +
                        ".checkpoint: expected a path inside the package, got " + ckpt);
  if (!files.is_object() || !files.contains(ckpt))
    return corrupt_data(file.string() + ": files: no sha256 of " + where + ".checkpoint " + ckpt);
  pm.config = m.value("config", std::string());
  pm.run = m.value("run", std::string());
  pm.source = m.value("source", std::string());
  pm.fold = m.value("fold", std::int64_t{-1});
  pm.configuration = m.value("configuration", std::string());
  pm.family = m.value("family", std::string());
  pm.overlap = m.value("overlap", 0.25);
  return pm;
}

}  // namespace

Result<ModelPackage> read_model_package(const fs::path& dir, bool verify) {
  const fs::path file = dir / "model.json";
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return not_found(dir.string() + ": --model: no such model folder");
  SEGFLOW_ASSIGN_OR_RETURN(
      json m, read_json_object(file, "no such model manifest (expected a segflow package folder)"));
  SEGFLOW_ASSIGN_OR_RETURN(std::string format,
                           pkg_field<std::string>(m, "format", file, "", kModelPackageFormat));
  if (format != kModelPackageFormat)
    return corrupt_data(file.string() + ": format: expected " + kModelPackageFormat + ", got " + format);
  const json files = m.value("files", json());
  if (verify) SEGFLOW_RETURN_IF_ERROR(verify_files(dir, files, file));
  ModelPackage p;
  p.dir = dir;
  SEGFLOW_ASSIGN_OR_RETURN(json members, pkg_field<json>(m, "members", file, "", "a list of members"));
  if (!members.is_array() || members.empty())
    return corrupt_data(file.string() + ": members: expected a non-empty list");
  for (std::size_t i = 0; i < members.size(); ++i) {
    SEGFLOW_ASSIGN_OR_RETURN(PackageMember pm,
                             member_of(members[i], file, "members[" + std::to_string(i) + "]", files));
    p.members.push_back(std::move(pm));
  }
  SEGFLOW_ASSIGN_OR_RETURN(json classes, pkg_field<json>(m, "classes", file, "", "a list of {label, name}"));
  for (const auto& c : classes)
    p.class_names.push_back(c.value("name", json()).is_string() ? c["name"].get<std::string>() : "");
  if (std::all_of(p.class_names.begin(), p.class_names.end(), [](const std::string& n) { return n.empty(); }))
    p.class_names.clear();
  SEGFLOW_ASSIGN_OR_RETURN(std::string tta,
                           pkg_field<std::string>(m, "tta", file, "", "none, mirror or mirror-all"));
  auto t = parse_tta(tta);
  if (!t.is_ok())
    return corrupt_data(file.string() + ": tta: expected none, mirror or mirror-all, got " + tta);
  p.tta = *t;
  p.overlap = m.contains("overlap") && m["overlap"].is_number() ? m["overlap"].get<double>() : -1.0;
  p.spatial_dims = m.value("spatial_dims", 3);
  p.in_channels = m.value("in_channels", std::int64_t{1});
  p.family = m.value("family", std::string());
  p.checkpoint = m.value("checkpoint", std::string());
  if (m.contains("postprocessing") && m["postprocessing"].is_string()) {
    SEGFLOW_ASSIGN_OR_RETURN(PostprocessPlan plan,
                             read_postprocessing(dir / m["postprocessing"].get<std::string>()));
    p.postprocessing = std::move(plan);
  }
  p.manifest = std::move(m);
  return p;
}

}  // namespace segflow::models

#include "models/inference/model_package.hpp"

#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <ctime>
#include <fstream>
#include <set>

#include "messages/file_util.hpp"
#include "models/evidence/cross_validation.hpp"
#include "models/training/checkpoint.hpp"
#include "models/training/class_names.hpp"
#include "models/training/trainer.hpp"

namespace segflow::models {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

/// FIPS 180-4 SHA-256, fed in chunks.
class Sha256 {
 public:
  void update(const unsigned char* p, std::size_t n) {
    bytes_ += n;
    while (n > 0) {
      const std::size_t take = std::min<std::size_t>(n, 64 - fill_);
      std::memcpy(block_.data() + fill_, p, take);
      fill_ += take, p += take, n -= take;
      if (fill_ == 64) compress(), fill_ = 0;
    }
  }
  std::string hex() {
    const std::uint64_t bits = bytes_ * 8;
    const unsigned char one = 0x80, zero = 0;
    update(&one, 1);
    while (fill_ != 56) update(&zero, 1);
    unsigned char len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(bits >> (56 - 8 * i));
    update(len, 8);
    std::string out;
    char buf[9];
    for (std::uint32_t v : h_) std::snprintf(buf, sizeof buf, "%08x", v), out += buf;
    return out;
  }

 private:
  static std::uint32_t rotr(std::uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }
  void compress() {
    static constexpr std::uint32_t k[64] = {
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
        0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
        0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
        0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
        0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
        0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
        0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
        0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};
    std::uint32_t w[64];
    for (int i = 0; i < 16; ++i)
      w[i] = std::uint32_t(block_[4 * i]) << 24 | std::uint32_t(block_[4 * i + 1]) << 16 |
             std::uint32_t(block_[4 * i + 2]) << 8 | std::uint32_t(block_[4 * i + 3]);
    for (int i = 16; i < 64; ++i) {
      const std::uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
      const std::uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
      w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    std::array<std::uint32_t, 8> v = h_;
    for (int i = 0; i < 64; ++i) {
      const std::uint32_t s1 = rotr(v[4], 6) ^ rotr(v[4], 11) ^ rotr(v[4], 25);
      const std::uint32_t t1 = v[7] + s1 + ((v[4] & v[5]) ^ (~v[4] & v[6])) + k[i] + w[i];
      const std::uint32_t s0 = rotr(v[0], 2) ^ rotr(v[0], 13) ^ rotr(v[0], 22);
      const std::uint32_t t2 = s0 + ((v[0] & v[1]) ^ (v[0] & v[2]) ^ (v[1] & v[2]));
      for (int j = 7; j > 0; --j) v[j] = v[j - 1];
      v[4] += t1;
      v[0] = t1 + t2;
    }
    for (int i = 0; i < 8; ++i) h_[i] += v[i];
  }

  std::array<std::uint32_t, 8> h_ = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                     0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  std::array<unsigned char, 64> block_{};
  std::size_t fill_ = 0;
  std::uint64_t bytes_ = 0;
};

Result<json> read_json_file(const fs::path& file, const std::string& what) {
  std::ifstream in(file);
  if (!in) return not_found(file.string() + ": no such " + what);
  try {
    return json::parse(in);
  } catch (const std::exception& e) {
    return corrupt_data(file.string() + ": not JSON: " + e.what());
  }
}

/// A run path written in `file` (absolute, relative to the working folder, else to the file's folder).
fs::path resolve_listed(const std::string& p, const fs::path& file) {
  const fs::path path(p);
  std::error_code ec;
  if (path.is_absolute() || fs::exists(path, ec)) return path;
  const fs::path beside = file.parent_path() / path;
  return fs::exists(beside, ec) ? beside : path;
}

/// The run folders a JSON array of paths (or of {"run": path}) names.
Result<std::vector<fs::path>> listed_runs(const json& list, const fs::path& file, const std::string& field) {
  std::vector<fs::path> runs;
  if (!list.is_array() || list.empty())
    return invalid_argument(file.string() + ": " + field + ": expected a non-empty list of run folders");
  for (std::size_t i = 0; i < list.size(); ++i) {
    const json& e = list[i];
    const json& p = e.is_object() && e.contains("run") ? e["run"] : e;
    if (!p.is_string())
      return invalid_argument(file.string() + ": " + field + "[" + std::to_string(i) +
                              "]: expected a run folder path, got " + e.dump());
    runs.push_back(resolve_listed(p.get<std::string>(), file));
  }
  return runs;
}

/// A cv summary without its per-case rows, with the file it came from.
json cv_figures(json cv, const std::string& source) {
  cv.erase("cases");
  cv["source"] = source;
  return cv;
}

/// The runs to pack and the figures they were chosen on, from the options' three sources.
struct Sources {
  std::vector<fs::path> runs;
  json cv = json::array();
  json selection;  ///< null unless packaged from a selection
};

/// segflow select's selection.json (docs/reference/run-folder.md#selectionjson): the
/// winner's runs, its configurations' cv summaries as the figures, and the verdict.
Status add_selection(const fs::path& file, Sources& s) {
  SEGFLOW_ASSIGN_OR_RETURN(json sel, read_json_file(file, "selection file"));
  const json winner = sel.is_object() ? sel.value("winner", json()) : json();
  if (!winner.is_object() || !winner.contains("runs"))
    return invalid_argument(file.string() +
                            ": winner.runs: missing (expected segflow select's selection.json)");
  SEGFLOW_ASSIGN_OR_RETURN(std::vector<fs::path> runs, listed_runs(winner["runs"], file, "winner.runs"));
  s.runs.insert(s.runs.end(), runs.begin(), runs.end());
  for (const auto& m : winner.value("members", json::array())) {
    if (!m.is_object() || !m.value("summary", json()).is_string()) continue;
    auto cv = read_json_file(resolve_listed(m["summary"].get<std::string>(), file), "cv summary");
    if (cv.is_ok()) s.cv.push_back(cv_figures(*cv, m["summary"].get<std::string>()));
  }
  s.selection = {{"source", file.string()}};
  for (const char* key :
       {"metric", "class", "confidence", "winner", "runner_up", "distinguishable", "statement"})
    if (sel.contains(key)) s.selection[key] = sel[key];
  for (const char* key : {"winner", "runner_up"})
    if (s.selection.value(key, json()).is_object()) s.selection[key].erase("values");
  return Status::ok();
}

Result<Sources> gather_sources(const PackageOptions& o) {
  Sources s;
  s.runs = o.runs;
  for (const auto& file : o.cv) {
    SEGFLOW_ASSIGN_OR_RETURN(json cv, read_json_file(file, "cv summary"));
    if (!cv.is_object() || !cv.contains("runs"))
      return invalid_argument(file.string() + ": runs: missing (expected segflow cv's cv_summary.json)");
    SEGFLOW_ASSIGN_OR_RETURN(std::vector<fs::path> runs, listed_runs(cv["runs"], file, "runs"));
    s.runs.insert(s.runs.end(), runs.begin(), runs.end());
    s.cv.push_back(cv_figures(cv, file.string()));
  }
  if (!o.selection.empty()) SEGFLOW_RETURN_IF_ERROR(add_selection(o.selection, s));
  if (s.runs.empty())
    return invalid_argument("expected run folders, --cv cv_summary.json or --selection selection.json");
  std::set<std::string> seen;
  for (const auto& r : s.runs)
    if (!seen.insert(fs::weakly_canonical(r).string()).second)
      return invalid_argument(r.string() + ": this run is named twice");
  return s;
}

/// Packaged from runs alone: the figures are segflow cv's on their out-of-fold predictions
/// (when every run has them).
Status add_computed_cv(const PackageOptions& o, Sources& s) {
  if (!o.cv.empty() || !o.selection.empty()) return Status::ok();
  std::error_code ec;
  for (const auto& r : s.runs)
    if (!fs::exists(r / "validation" / "summary.json", ec)) {
      if (o.note) o.note("no cross-validation figures: " + r.string() + " has no validation/summary.json");
      return Status::ok();
    }
  CvOptions co;
  co.runs = s.runs;
  // Runs of several configurations share cases: pass their cv summaries (--cv) instead.
  auto report = cross_validate(co);
  if (report.is_ok())
    s.cv.push_back(cv_figures(cv_json(*report), "segflow cv of the members"));
  else if (o.note)
    o.note("no cross-validation figures: " + report.status().message());
  return Status::ok();
}

const char* tta_name(TtaMode t) {
  switch (t) {
    case TtaMode::none:
      return "none";
    case TtaMode::mirror:
      return "mirror";
    case TtaMode::mirror_all:
      return "mirror-all";
  }
  return "none";
}

/// A member before it is copied: its checkpoint loaded once to check it.
struct Candidate {
  fs::path run, checkpoint;
  ModelInfo info;
  json config;  ///< the checkpoint's resolved job config
  std::int64_t classes = 2, fold = -1;
  std::string name;
  double overlap = 0.25;
  std::vector<std::string> class_names;
};

Result<Candidate> load_candidate(const fs::path& run, const std::string& which) {
  Candidate c;
  c.run = run;
  c.checkpoint = run / (which + ".pt");
  std::error_code ec;
  if (!fs::is_directory(run, ec)) return not_found(run.string() + ": no such run folder");
  if (!fs::is_regular_file(c.checkpoint, ec))
    return not_found(c.checkpoint.string() + ": no such checkpoint (--checkpoint " + which + ")");
  SEGFLOW_ASSIGN_OR_RETURN(auto trainer, load_for_inference(c.checkpoint, "cpu"));
  SEGFLOW_ASSIGN_OR_RETURN(json meta, read_checkpoint_meta(c.checkpoint));
  c.info = trainer->model().info();
  if (c.info.needs_box)
    return unsupported(c.checkpoint.string() +
                       ": box-prompted models cannot be packaged (segflow infer runs "
                       "them without boxes)");
  c.classes = c.info.out_channels == 1 ? 2 : c.info.out_channels;
  const JobConfig& cfg = trainer->config();
  c.config = meta.value("config", json::object());
  c.fold = cfg.data.fold;
  c.name = cfg.name;
  c.overlap = cfg.validation.overlap;
  c.class_names = job_class_names(cfg);
  return c;
}

/// Every member predicts what the first does: the same classes (count and known names) from
/// the same input channels (2D and 3D members may mix: infer averages them on one grid).
Status check_members(const std::vector<Candidate>& cs) {
  const Candidate& a = cs.front();
  for (const Candidate& b : cs) {
    const std::string head = b.run.string() + ": cannot be packaged with " + a.run.string() + ": ";
    if (b.classes != a.classes)
      return invalid_argument(head + "classes: " + std::to_string(b.classes) + " (labels 0.." +
                              std::to_string(b.classes - 1) + "), expected " + std::to_string(a.classes));
    if (b.info.in_channels != a.info.in_channels)
      return invalid_argument(head + "input channels: " + std::to_string(b.info.in_channels) + ", expected " +
                              std::to_string(a.info.in_channels));
    if (!a.class_names.empty() && !b.class_names.empty() && a.class_names != b.class_names)
      for (std::size_t k = 0; k < a.class_names.size(); ++k)
        if (a.class_names[k] != b.class_names[k])
          return invalid_argument(head + "class " + std::to_string(k) + " is '" + b.class_names[k] +
                                  "', expected '" + a.class_names[k] + "'");
  }
  return Status::ok();
}

/// The plan's classes and steps must be classes 1..K-1 of the package.
Status check_postprocessing(const PostprocessPlan& plan, const fs::path& file, std::int64_t classes) {
  const auto bad = [&](const std::string& field, std::int64_t label) {
    return invalid_argument(file.string() + ": " + field + ": class " + std::to_string(label) +
                            " is not a class of the model (labels 1.." + std::to_string(classes - 1) +
                            "): a postprocessing.json of other classes");
  };
  for (std::size_t i = 0; i < plan.classes.size(); ++i)
    if (plan.classes[i] < 1 || plan.classes[i] >= classes)
      return bad("classes[" + std::to_string(i) + "]", plan.classes[i]);
  for (std::size_t i = 0; i < plan.steps.size(); ++i)
    if (plan.steps[i].label < 0 || plan.steps[i].label >= classes)
      return bad("steps[" + std::to_string(i) + "].class", plan.steps[i].label);
  return Status::ok();
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

/// The manifest's members and shared fields (files and hashes are added by the writer).
json manifest_of(const std::vector<Candidate>& cs, const PackageOptions& o, const Sources& src,
                 const std::optional<PostprocessPlan>& plan) {
  const Candidate& a = cs.front();
  json classes = json::array();
  for (std::int64_t k = 0; k < a.classes; ++k) {
    const auto n = static_cast<std::size_t>(k);
    classes.push_back(
        {{"label", k}, {"name", n < a.class_names.size() ? json(a.class_names[n]) : json(nullptr)}});
  }
  bool same_overlap = true;
  for (const auto& c : cs) same_overlap = same_overlap && c.overlap == a.overlap;
  json members = json::array();
  for (std::size_t i = 0; i < cs.size(); ++i) {
    const Candidate& c = cs[i];
    const fs::path folder = fs::path("members") / (std::to_string(i) + "-" + c.run.filename().string());
    members.push_back({{"checkpoint", (folder / c.checkpoint.filename()).string()},
                       {"config", (folder / "config.json").string()},
                       {"run", c.run.filename().string()},
                       {"source", fs::absolute(c.checkpoint).lexically_normal().string()},
                       {"fold", c.fold},
                       {"configuration", c.name},
                       {"family", c.info.name},
                       {"spatial_dims", c.info.spatial_dims},
                       {"overlap", c.overlap}});
  }
  json m = {{"format", kModelPackageFormat},
            {"created", utc_now()},
            {"classes", classes},
            {"spatial_dims", a.info.spatial_dims},
            {"in_channels", a.info.in_channels},
            {"family", a.info.name},
            {"tta", tta_name(o.tta)},
            {"overlap", same_overlap ? json(a.overlap) : json(nullptr)},
            {"checkpoint", o.checkpoint},
            {"members", members},
            {"postprocessing", plan ? json("postprocessing.json") : json(nullptr)},
            {"cv", src.cv},
            {"selection", src.selection}};
  if (plan) {
    m["postprocessing_summary"] = postprocessing_json(*plan);
    m["postprocessing_summary"].erase("steps");
  }
  return m;
}

/// Copies the members' checkpoints, their configs and the plan into `tmp`, then writes
/// model.json with every file's sha256.
Status fill_package(const fs::path& tmp, json& manifest, const std::vector<Candidate>& cs,
                    const fs::path& postprocessing) {
  json files = json::object();
  std::error_code ec;
  for (std::size_t i = 0; i < cs.size(); ++i) {
    const json& m = manifest["members"][i];
    const fs::path ckpt = tmp / m["checkpoint"].get<std::string>();
    fs::create_directories(ckpt.parent_path(), ec);
    if (ec) return io_error(ckpt.parent_path().string() + ": cannot create the folder: " + ec.message());
    if (!fs::copy_file(cs[i].checkpoint, ckpt, ec) || ec)
      return io_error(cs[i].checkpoint.string() + ": cannot copy into the package: " + ec.message());
    SEGFLOW_RETURN_IF_ERROR(
        write_file_atomically(tmp / m["config"].get<std::string>(), cs[i].config.dump(2) + "\n"));
  }
  if (!postprocessing.empty() && (!fs::copy_file(postprocessing, tmp / "postprocessing.json", ec) || ec))
    return io_error(postprocessing.string() + ": cannot copy into the package: " + ec.message());
  for (const auto& e : fs::recursive_directory_iterator(tmp, ec)) {
    if (!e.is_regular_file()) continue;
    SEGFLOW_ASSIGN_OR_RETURN(std::string hex, sha256_file(e.path()));
    files[e.path().lexically_relative(tmp).string()] = hex;
  }
  if (ec) return io_error(tmp.string() + ": cannot list the folder: " + ec.message());
  manifest["files"] = files;
  return write_file_atomically(tmp / "model.json", manifest.dump(2) + "\n");
}

}  // namespace

Result<std::string> sha256_file(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) return not_found(file.string() + ": cannot be read");
  Sha256 h;
  std::vector<char> buf(1 << 20);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    h.update(reinterpret_cast<const unsigned char*>(buf.data()), static_cast<std::size_t>(in.gcount()));
  }
  if (in.bad()) return io_error(file.string() + ": read error");
  return h.hex();
}

Result<ModelPackage> write_model_package(const PackageOptions& o) {
  if (o.out.empty()) return invalid_argument("--out: required (the model folder to write)");
  if (o.checkpoint != "last" && o.checkpoint != "best")
    return invalid_argument("--checkpoint: expected last or best, got '" + o.checkpoint + "'");
  std::error_code ec;
  if (fs::exists(o.out, ec))
    return invalid_argument(o.out.string() +
                            ": --out: already exists (a package is never overwritten; "
                            "remove it or name another folder)");
  SEGFLOW_ASSIGN_OR_RETURN(Sources src, gather_sources(o));
  std::vector<Candidate> cs;
  for (const auto& run : src.runs) {
    if (o.note) o.note("checking " + (run / (o.checkpoint + ".pt")).string());
    SEGFLOW_ASSIGN_OR_RETURN(Candidate c, load_candidate(run, o.checkpoint));
    cs.push_back(std::move(c));
  }
  SEGFLOW_RETURN_IF_ERROR(check_members(cs));
  SEGFLOW_RETURN_IF_ERROR(add_computed_cv(o, src));
  std::optional<PostprocessPlan> plan;
  if (!o.postprocessing.empty()) {
    SEGFLOW_ASSIGN_OR_RETURN(plan, read_postprocessing(o.postprocessing));
    SEGFLOW_RETURN_IF_ERROR(check_postprocessing(*plan, o.postprocessing, cs.front().classes));
  }
  json manifest = manifest_of(cs, o, src, plan);
  SEGFLOW_RETURN_IF_ERROR(write_folder_atomically(
      o.out, [&](const fs::path& tmp) { return fill_package(tmp, manifest, cs, o.postprocessing); }));
  if (o.note) o.note("wrote " + o.out.string() + " (" + std::to_string(cs.size()) + " member(s))");
  return read_model_package(o.out, false);
}

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
  SEGFLOW_ASSIGN_OR_RETURN(json m,
                           read_json_file(file, "model manifest (expected a segflow package folder)"));
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

InferOptions package_infer_options(const ModelPackage& p, const InferOptions& base) {
  InferOptions o = base;
  o.model.clear();
  o.checkpoint = p.dir / p.members.front().checkpoint;
  o.ensemble.clear();
  for (std::size_t i = 1; i < p.members.size(); ++i) o.ensemble.push_back(p.dir / p.members[i].checkpoint);
  o.tta = p.tta;
  if (o.overlap < 0) o.overlap = p.overlap;
  if (o.class_names.empty()) o.class_names = p.class_names;
  return o;
}

}  // namespace segflow::models

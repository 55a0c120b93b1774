#include "pipeline/fingerprint.hpp"

#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>
#include <variant>

#include "messages/file_util.hpp"
#include "messages/hashing.hpp"
#include "pipeline/io/case_files.hpp"

namespace segflow::pipeline {

namespace fs = std::filesystem;

namespace {

// ---- dataset.json ----

/// What dataset.json promises (each field unset when the file or the key is absent).
struct DatasetPromises {
  std::vector<std::string> channel_names;  ///< channel_names (or MSD's modality), by index
  std::optional<std::int64_t> num_training;
  std::optional<std::int64_t> num_classes;  ///< largest label value + 1 of `labels`
};

Result<DatasetPromises> read_promises(const fs::path& root) {
  DatasetPromises p;
  const fs::path dj = root / "dataset.json";
  if (!fs::exists(dj)) return p;
  std::ifstream f(dj);
  const auto j = nlohmann::json::parse(f, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return corrupt_data(dj.string() + ": expected a JSON object, got invalid JSON");
  for (const char* key : {"channel_names", "modality"}) {
    if (!j.contains(key) || !p.channel_names.empty()) continue;
    if (!j[key].is_object())
      return corrupt_data(dj.string() + ": " + key + ": expected an object {\"0\": \"CT\", ...}");
    std::map<int, std::string> m;
    for (auto it = j[key].begin(); it != j[key].end(); ++it) {
      int k = -1;
      try {
        k = std::stoi(it.key());
      } catch (...) {
      }
      if (k < 0 || !it->is_string())
        return corrupt_data(dj.string() + ": " + key +
                            ": expected {\"0\": name, \"1\": name, ...}, got key \"" + it.key() + "\"");
      m[k] = it->get<std::string>();
    }
    for (auto& [k, v] : m) {
      if (k != static_cast<int>(p.channel_names.size()))
        return corrupt_data(dj.string() + ": " + key + ": expected channels numbered 0, 1, ..., got " +
                            std::to_string(k) + " after " + std::to_string(p.channel_names.size()) +
                            " channels");
      p.channel_names.push_back(v);
    }
  }
  if (j.contains("numTraining")) {
    if (!j["numTraining"].is_number_integer())
      return corrupt_data(dj.string() + ": numTraining: expected an integer, got " + j["numTraining"].dump());
    p.num_training = j["numTraining"].get<std::int64_t>();
  }
  if (j.contains("labels")) {
    const auto names = label_names_from_json(j["labels"]);
    if (names.empty())
      return corrupt_data(dj.string() + ": labels: expected {\"background\": 0, ...}, got " +
                          j["labels"].dump());
    for (std::size_t v = 0; v < names.size(); ++v)
      if (names[v].empty())
        return corrupt_data(dj.string() +
                            ": labels: expected consecutive values 0, 1, ..., got no name for " +
                            std::to_string(v));
    p.num_classes = static_cast<std::int64_t>(names.size());
  }
  return p;
}

// ---- one case ----

/// What a worker hands back for a good case: its fingerprint and, per channel, the kept
/// foreground sample.
struct CaseResult {
  CaseFingerprint fp;
  std::vector<at::Tensor> kept;  ///< per channel, float32 (k)
  std::string modality;          ///< the reader's modality ("CT", "MR", "" when the format says none)
};

using CaseOutcome = std::variant<CaseResult, ExcludedCase>;

ExcludedCase excluded(const std::string& id, const fs::path& file, const std::string& field,
                      const std::string& what) {
  return {id, file, field, file.string() + ": " + field + ": " + what};
}

/// Axis codes of a direction matrix: for each axis (column) the letter of its dominant LPS
/// component (+x L, -x R, +y P, -y A, +z S, -z I).
std::string orientation_code(const std::array<double, 9>& d) {
  static const char pos[3] = {'L', 'P', 'S'}, neg[3] = {'R', 'A', 'I'};
  std::string s;
  for (int c = 0; c < 3; ++c) {
    int best = 0;
    for (int r = 1; r < 3; ++r)
      if (std::abs(d[r * 3 + c]) > std::abs(d[best * 3 + c])) best = r;
    s += d[best * 3 + c] >= 0 ? pos[best] : neg[best];
  }
  return s;
}

/// Statistics of one case's foreground values `v` (float32, all of them) and the kept
/// sample (all, or `cap` drawn without replacement by `gen`).
IntensityStats case_stats(const at::Tensor& v, std::int64_t cap, at::Generator& gen, at::Tensor& kept) {
  IntensityStats s;
  s.voxels = v.numel();
  if (s.voxels == 0) {
    kept = torch::empty({0}, torch::kFloat32);
    s.mean = s.median = s.std = s.min = s.max = s.percentile_00_5 = s.percentile_99_5 = NAN;
    return s;
  }
  const at::Tensor d = v.to(torch::kFloat64);
  s.mean = d.mean().item<double>();
  s.std = d.std(/*unbiased=*/false).item<double>();
  s.min = d.min().item<double>();
  s.max = d.max().item<double>();
  kept = s.voxels <= cap ? v.clone() : v.index_select(0, torch::randperm(s.voxels, gen).narrow(0, 0, cap));
  const at::Tensor sorted = std::get<0>(kept.to(torch::kFloat64).sort());
  const auto n = sorted.numel();
  auto at_q = [&](double q) {
    const double h = q / 100.0 * static_cast<double>(n - 1);
    const auto lo = static_cast<std::int64_t>(std::floor(h));
    const auto hi = std::min<std::int64_t>(lo + 1, n - 1);
    const double a = sorted[lo].item<double>(), b = sorted[hi].item<double>();
    return a + (b - a) * (h - static_cast<double>(lo));
  };
  s.percentile_00_5 = at_q(0.5);
  s.median = at_q(50.0);
  s.percentile_99_5 = at_q(99.5);
  return s;
}

/// nnU-Net's crop_to_nonzero box: the bounding box of voxels where any channel is non-zero
/// (its hole filling adds no voxel outside that box). Returns {start, length} per tensor dim
/// Z, Y, X; the whole volume when every voxel is zero.
std::array<std::array<std::int64_t, 2>, 3> nonzero_box(const at::Tensor& image) {
  const at::Tensor nz = (image != 0).any(0);  // (Z, Y, X)
  std::array<std::array<std::int64_t, 2>, 3> box{};
  for (int d = 0; d < 3; ++d) {
    std::vector<std::int64_t> others;
    for (int o = 0; o < 3; ++o)
      if (o != d) others.push_back(o);
    const at::Tensor along = nz.any(others[1]).any(others[0]);
    const at::Tensor idx = along.nonzero();
    if (idx.numel() == 0) return {{{0, nz.size(0)}, {0, nz.size(1)}, {0, nz.size(2)}}};
    const std::int64_t a = idx.min().item<std::int64_t>(), b = idx.max().item<std::int64_t>();
    box[d] = {a, b - a + 1};
  }
  return box;
}

/// The integrity checks on a loaded case; the reason it is excluded, if any.
std::optional<ExcludedCase> check_case(const CaseEntry& entry, const LoadedCase& lc, std::int64_t channels,
                                       std::optional<std::int64_t> num_classes) {
  const at::Tensor& img = lc.image.voxels;
  if (channels > 0 && img.size(0) != channels)
    return excluded(entry.id, entry.images.front(), "channels",
                    "expected " + std::to_string(channels) + " (dataset.json channel_names), got " +
                        std::to_string(img.size(0)));
  for (std::int64_t c = 0; c < img.size(0); ++c) {
    const at::Tensor ch = img[c];
    const std::int64_t nan = torch::isnan(ch).sum().item<std::int64_t>();
    const std::int64_t inf = torch::isinf(ch).sum().item<std::int64_t>();
    if (nan + inf > 0) {
      const fs::path& f = entry.images.size() == static_cast<std::size_t>(img.size(0)) ? entry.images[c]
                                                                                       : entry.images.front();
      return excluded(entry.id, f, "voxels",
                      "expected finite values, got " + std::to_string(nan) + " NaN and " +
                          std::to_string(inf) + " infinite in channel " + std::to_string(c));
    }
  }
  if (num_classes) {
    const std::int64_t mx = lc.label->voxels.max().item<std::int64_t>();
    if (mx >= *num_classes) {
      const at::Tensor counts = torch::bincount(lc.label->voxels.flatten().to(torch::kLong));
      std::string got;
      for (std::int64_t v = *num_classes; v < counts.numel(); ++v)
        if (counts[v].item<std::int64_t>() > 0) got += (got.empty() ? "" : ", ") + std::to_string(v);
      return excluded(
          entry.id, *entry.label, "label values",
          "expected values 0.." + std::to_string(*num_classes - 1) + " (dataset.json labels), got " + got);
    }
  }
  return std::nullopt;
}

/// The fingerprint of a loaded, checked case.
CaseResult summarise_case(const CaseEntry& entry, const LoadedCase& lc, std::int64_t cap,
                          std::uint64_t seed) {
  CaseResult r;
  CaseFingerprint& fp = r.fp;
  fp.id = entry.id;
  fp.images = entry.images;
  fp.label = *entry.label;
  r.modality = lc.image.modality;
  fp.size = lc.image.size();
  fp.spacing = lc.image.geometry.spacing;
  fp.direction = lc.image.geometry.direction;
  fp.orientation = orientation_code(fp.direction);
  const at::Tensor& img = lc.image.voxels;
  const auto box = nonzero_box(img);
  fp.shape_after_crop = {box[2][1], box[1][1], box[0][1]};
  fp.relative_size_after_cropping = static_cast<double>(box[0][1] * box[1][1] * box[2][1]) /
                                    static_cast<double>(img.size(1) * img.size(2) * img.size(3));
  const at::Tensor label = lc.label->voxels[0].to(torch::kLong);
  const at::Tensor counts = torch::bincount(label.flatten());
  for (std::int64_t v = 0; v < counts.numel(); ++v) fp.class_voxels.push_back(counts[v].item<std::int64_t>());
  auto crop = [&](const at::Tensor& t) {
    return t.narrow(0, box[0][0], box[0][1]).narrow(1, box[1][0], box[1][1]).narrow(2, box[2][0], box[2][1]);
  };
  const at::Tensor fg = crop(label) > 0;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  for (std::int64_t c = 0; c < img.size(0); ++c) {
    at::Tensor kept;
    fp.foreground.push_back(case_stats(crop(img[c]).masked_select(fg).to(torch::kFloat32), cap, gen, kept));
    r.kept.push_back(std::move(kept));
  }
  return r;
}

CaseOutcome analyze_case(const CaseEntry& entry, std::int64_t channels,
                         std::optional<std::int64_t> num_classes, std::int64_t cap, std::uint64_t seed) {
  if (!entry.label)
    return excluded(entry.id, entry.images.empty() ? fs::path(entry.id) : entry.images.front(), "label",
                    "expected a label map for case " + entry.id + ", found none");
  try {
    torch::NoGradGuard no_grad;
    auto lc = load_case(entry);
    if (!lc.is_ok()) {
      const std::string m = lc.status().message();
      const bool grid = m.find("does not match") != std::string::npos || m.find("grid") != std::string::npos;
      const fs::path file = m.rfind(entry.label->string(), 0) == 0 ? *entry.label : entry.images.front();
      return ExcludedCase{entry.id, file, grid ? "grid" : "read", m};
    }
    if (auto bad = check_case(entry, *lc, channels, num_classes)) return *bad;
    return summarise_case(entry, *lc, cap, seed);
  } catch (const std::exception& e) {
    return excluded(entry.id, entry.images.front(), "read", first_line(e));
  }
}

/// Runs analyze_case over every case on `threads` workers; outcomes in case order.
std::vector<CaseOutcome> analyze_all(const std::vector<CaseEntry>& cases, int threads, std::int64_t channels,
                                     std::optional<std::int64_t> num_classes, std::int64_t cap,
                                     std::uint64_t seed) {
  std::vector<std::optional<CaseOutcome>> out(cases.size());
  std::atomic<std::size_t> next{0};
  auto work = [&] {
    for (std::size_t i; (i = next.fetch_add(1)) < cases.size();)
      out[i] = analyze_case(cases[i], channels, num_classes, cap, seed * 1000003ULL + i);
  };
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) pool.emplace_back(work);
  for (auto& t : pool) t.join();
  std::vector<CaseOutcome> res;
  for (auto& o : out) res.push_back(std::move(*o));
  return res;
}

// ---- pooling ----

/// The pooled statistics of one channel: every case's kept sample, weighted 1 / its size.
IntensityStats pooled_stats(const std::vector<CaseResult>& cases, std::size_t channel) {
  std::vector<at::Tensor> values, weights;
  IntensityStats s;
  s.min = INFINITY;
  s.max = -INFINITY;
  for (const auto& c : cases) {
    const at::Tensor& k = c.kept[channel];
    if (k.numel() == 0) continue;
    values.push_back(k);
    weights.push_back(torch::full({k.numel()}, 1.0 / static_cast<double>(k.numel()), torch::kFloat64));
    s.voxels += c.fp.foreground[channel].voxels;
    s.min = std::min(s.min, c.fp.foreground[channel].min);
    s.max = std::max(s.max, c.fp.foreground[channel].max);
  }
  if (values.empty()) {
    s.mean = s.median = s.std = s.min = s.max = s.percentile_00_5 = s.percentile_99_5 = NAN;
    return s;
  }
  const at::Tensor v = torch::cat(values).to(torch::kFloat64), w = torch::cat(weights);
  const double W = w.sum().item<double>();
  s.mean = (v * w).sum().item<double>() / W;
  s.std = std::sqrt(((v - s.mean).square() * w).sum().item<double>() / W);
  std::vector<float> vf(v.numel());
  const at::Tensor vf32 = v.to(torch::kFloat32).contiguous();
  std::copy(vf32.data_ptr<float>(), vf32.data_ptr<float>() + vf.size(), vf.begin());
  std::vector<double> wd(w.data_ptr<double>(), w.data_ptr<double>() + w.numel());
  s.percentile_00_5 = weighted_percentile(vf, wd, 0.5);
  s.median = weighted_percentile(vf, wd, 50.0);
  s.percentile_99_5 = weighted_percentile(std::move(vf), std::move(wd), 99.5);
  return s;
}

double median_of(std::vector<double> v) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/// Channel names when dataset.json has none: the first case's modality as its reader gives
/// it ("CT" from a DICOM series), else "image", for every channel.
std::vector<std::string> default_channel_names(const std::vector<CaseResult>& cases) {
  if (cases.empty()) return {};
  const std::string& m = cases.front().modality;
  return std::vector<std::string>(cases.front().kept.size(), m.empty() ? "image" : m);
}

}  // namespace

double weighted_percentile(std::vector<float> values, std::vector<double> weights, double q) {
  const std::size_t n = values.size();
  if (n == 0 || weights.size() != n) return NAN;
  std::vector<std::size_t> order(n);
  for (std::size_t i = 0; i < n; ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return values[a] < values[b]; });
  if (n == 1) return values[0];
  // Position of sorted value i: (C_i - w_i / 2 - w_first / 2) / (W - w_first / 2 - w_last / 2),
  // C_i the inclusive cumulative weight: 0 for the first, 1 for the last, i / (n - 1) for
  // equal weights (numpy's linear percentile).
  const double w_first = weights[order.front()], w_last = weights[order.back()];
  double W = 0;
  for (double w : weights) W += w;
  const double span = W - w_first / 2 - w_last / 2;
  const double target = q / 100.0 * span;
  double cum = 0, prev_pos = 0, prev_val = values[order[0]];
  for (std::size_t k = 0; k < n; ++k) {
    const double w = weights[order[k]];
    const double pos = cum + w / 2 - w_first / 2;
    cum += w;
    const double val = values[order[k]];
    if (pos >= target) {
      if (k == 0 || pos <= prev_pos) return val;
      return prev_val + (val - prev_val) * (target - prev_pos) / (pos - prev_pos);
    }
    prev_pos = pos;
    prev_val = val;
  }
  return values[order.back()];
}

Result<DatasetFingerprint> compute_fingerprint(const fs::path& root, const FingerprintOptions& options) {
  SEGFLOW_ASSIGN_OR_RETURN(DatasetPromises promises, read_promises(root));
  SEGFLOW_ASSIGN_OR_RETURN(DatasetIndex idx, scan_dataset(root, ScanOptions{false}));
  const auto n = static_cast<std::int64_t>(idx.cases.size());
  if (promises.num_training && *promises.num_training != n)
    return corrupt_data((root / "dataset.json").string() + ": numTraining: expected " + std::to_string(n) +
                        " (the cases found in " + root.string() + "), got " +
                        std::to_string(*promises.num_training));
  if (n == 0) return invalid_argument(root.string() + ": cases: expected at least one case, found none");
  if (std::none_of(idx.cases.begin(), idx.cases.end(),
                   [](const CaseEntry& c) { return c.label.has_value(); }))
    return invalid_argument(root.string() +
                            ": labels: expected a label map per case (labelsTr/, gts/ or a SEG " +
                            "in each case folder), found none");
  SEGFLOW_ASSIGN_OR_RETURN(std::string signature, dataset_signature(root));
  DatasetFingerprint fp;
  fp.root = root;
  fp.layout = idx.layout;
  fp.skipped = idx.skipped;
  fp.seed = options.seed;
  fp.data_signature = signature;
  fp.samples_per_case = std::max(options.min_samples_per_case, options.samples_total / n);
  const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int threads = static_cast<int>(std::min<std::int64_t>(options.threads > 0 ? options.threads : hw, n));
  const auto channels = static_cast<std::int64_t>(promises.channel_names.size());
  std::vector<CaseResult> good;
  for (auto& o :
       analyze_all(idx.cases, threads, channels, promises.num_classes, fp.samples_per_case, options.seed)) {
    if (auto* e = std::get_if<ExcludedCase>(&o))
      fp.excluded.push_back(std::move(*e));
    else
      good.push_back(std::move(std::get<CaseResult>(o)));
  }
  if (good.empty()) {
    std::string why = fp.excluded.empty() ? std::string("none") : fp.excluded.front().message;
    return invalid_argument(root.string() + ": cases: every case failed its checks (" + std::to_string(n) +
                            "), first: " + why);
  }
  // Multi-channel cases must agree with each other when dataset.json does not say.
  const std::size_t nch = good.front().kept.size();
  std::vector<CaseResult> agreeing;
  for (auto& c : good) {
    if (c.kept.size() == nch) {
      agreeing.push_back(std::move(c));
      continue;
    }
    fp.excluded.push_back(excluded(c.fp.id, c.fp.images.front(), "channels",
                                   "expected " + std::to_string(nch) + " (as case " + agreeing.front().fp.id +
                                       "), got " + std::to_string(c.kept.size())));
  }
  fp.channel_names =
      promises.channel_names.empty() ? default_channel_names(agreeing) : promises.channel_names;
  fp.label_names = idx.label_names;
  std::int64_t classes = promises.num_classes.value_or(0);
  for (const auto& c : agreeing)
    classes = std::max<std::int64_t>(classes, static_cast<std::int64_t>(c.fp.class_voxels.size()));
  fp.num_classes = std::max<std::int64_t>(classes, 2);
  std::vector<double> rel;
  for (auto& c : agreeing) {
    c.fp.class_voxels.resize(static_cast<std::size_t>(fp.num_classes), 0);
    rel.push_back(c.fp.relative_size_after_cropping);
  }
  fp.median_relative_size_after_cropping = median_of(rel);
  for (std::size_t ch = 0; ch < nch; ++ch) fp.foreground_intensity.push_back(pooled_stats(agreeing, ch));
  for (auto& c : agreeing) fp.cases.push_back(std::move(c.fp));
  std::sort(fp.excluded.begin(), fp.excluded.end(), [](const auto& a, const auto& b) { return a.id < b.id; });
  return fp;
}

// ---- signature ----

namespace {

/// FNV-1a over fields, each followed by a 0xff separator.
struct Fnv1a {
  Fnv1a64 h;
  void add(std::string_view s) { h.add(s).add("\xff"); }
};

void add_file(Fnv1a& h, const fs::path& root, const fs::path& p) {
  std::error_code ec;
  h.add(fs::relative(p, root, ec).string());
  h.add(std::to_string(fs::file_size(p, ec)));
  const auto t = fs::last_write_time(p, ec);
  h.add(std::to_string(t.time_since_epoch().count()));
}

void add_path(Fnv1a& h, const fs::path& root, const fs::path& p) {
  std::error_code ec;
  if (!fs::is_directory(p, ec)) return add_file(h, root, p);
  std::vector<fs::path> files;
  for (const auto& e : fs::recursive_directory_iterator(p, ec))
    if (e.is_regular_file(ec)) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  for (const auto& f : files) add_file(h, root, f);
}

}  // namespace

Result<std::string> dataset_signature(const fs::path& root) {
  SEGFLOW_ASSIGN_OR_RETURN(DatasetIndex idx, scan_dataset(root, ScanOptions{false}));
  Fnv1a h;
  std::ifstream f(root / "dataset.json", std::ios::binary);
  if (f) h.add(std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()));
  for (const auto& c : idx.cases) {
    h.add(c.id);
    for (const auto& p : c.images) add_path(h, root, p);
    if (c.label && !fs::is_directory(*c.label)) add_file(h, root, *c.label);
  }
  return h.h.hex();
}

// ---- JSON ----

namespace {

nlohmann::json stats_json(const IntensityStats& s) {
  auto num = [](double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); };
  return {{"mean", num(s.mean)},
          {"median", num(s.median)},
          {"std", num(s.std)},
          {"min", num(s.min)},
          {"max", num(s.max)},
          {"percentile_00_5", num(s.percentile_00_5)},
          {"percentile_99_5", num(s.percentile_99_5)},
          {"voxels", s.voxels}};
}

IntensityStats stats_from(const nlohmann::json& j) {
  auto num = [&](const char* k) { return j.contains(k) && j[k].is_number() ? j[k].get<double>() : NAN; };
  IntensityStats s;
  s.mean = num("mean");
  s.median = num("median");
  s.std = num("std");
  s.min = num("min");
  s.max = num("max");
  s.percentile_00_5 = num("percentile_00_5");
  s.percentile_99_5 = num("percentile_99_5");
  s.voxels = j.value("voxels", std::int64_t{0});
  return s;
}

std::vector<std::string> path_strings(const std::vector<fs::path>& ps) {
  std::vector<std::string> out;
  for (const auto& p : ps) out.push_back(p.string());
  return out;
}

nlohmann::json case_json(const CaseFingerprint& c) {
  nlohmann::json fg = nlohmann::json::array();
  for (const auto& s : c.foreground) fg.push_back(stats_json(s));
  std::vector<std::int64_t> present;  // label values with voxels (derived; not read back)
  for (std::size_t v = 0; v < c.class_voxels.size(); ++v)
    if (c.class_voxels[v] > 0) present.push_back(static_cast<std::int64_t>(v));
  return {{"id", c.id},
          {"classes_present", present},
          {"images", path_strings(c.images)},
          {"label", c.label.string()},
          {"size", c.size},
          {"spacing", c.spacing},
          {"direction", c.direction},
          {"orientation", c.orientation},
          {"shape_after_crop", c.shape_after_crop},
          {"relative_size_after_cropping", c.relative_size_after_cropping},
          {"class_voxels", c.class_voxels},
          {"foreground", fg}};
}

CaseFingerprint case_from(const nlohmann::json& j) {
  CaseFingerprint c;
  c.id = j.at("id").get<std::string>();
  for (const auto& p : j.at("images")) c.images.emplace_back(p.get<std::string>());
  c.label = j.at("label").get<std::string>();
  c.size = j.at("size").get<Size3>();
  c.spacing = j.at("spacing").get<std::array<double, 3>>();
  c.direction = j.at("direction").get<std::array<double, 9>>();
  c.orientation = j.at("orientation").get<std::string>();
  c.shape_after_crop = j.at("shape_after_crop").get<Size3>();
  c.relative_size_after_cropping = j.at("relative_size_after_cropping").get<double>();
  c.class_voxels = j.at("class_voxels").get<std::vector<std::int64_t>>();
  for (const auto& s : j.at("foreground")) c.foreground.push_back(stats_from(s));
  return c;
}

}  // namespace

nlohmann::json DatasetFingerprint::to_json() const {
  nlohmann::json j;
  j["format"] = "segflow-fingerprint-1";
  j["root"] = root.string();
  j["layout"] = to_string(layout);
  j["data_signature"] = data_signature;
  j["channel_names"] = channel_names;
  j["label_names"] = label_names;
  j["num_classes"] = num_classes;
  j["sampling"] = {
      {"rule",
       "each case keeps all its foreground voxels (label > 0 inside the non-zero box), or a seeded "
       "random subset of samples_per_case of them, each weighted 1 / kept; pooled weighted statistics "
       "(the limit of nnU-Net's floor(10e7 / cases) draws per case with replacement)"},
      {"samples_per_case", samples_per_case},
      {"seed", seed}};
  // nnU-Net v2's dataset_fingerprint.json fields: array order (z, y, x).
  nlohmann::json spacings = nlohmann::json::array(), shapes = nlohmann::json::array(), props;
  for (const auto& c : cases) {
    spacings.push_back({c.spacing[2], c.spacing[1], c.spacing[0]});
    shapes.push_back({c.shape_after_crop[2], c.shape_after_crop[1], c.shape_after_crop[0]});
  }
  for (std::size_t ch = 0; ch < foreground_intensity.size(); ++ch)
    props[std::to_string(ch)] = stats_json(foreground_intensity[ch]);
  j["spacings"] = spacings;
  j["shapes_after_crop"] = shapes;
  j["foreground_intensity_properties_per_channel"] = props.is_null() ? nlohmann::json::object() : props;
  j["median_relative_size_after_cropping"] = median_relative_size_after_cropping;
  j["cases"] = nlohmann::json::array();
  for (const auto& c : cases) j["cases"].push_back(case_json(c));
  j["excluded"] = nlohmann::json::array();
  for (const auto& e : excluded)
    j["excluded"].push_back(
        {{"id", e.id}, {"file", e.file.string()}, {"field", e.field}, {"message", e.message}});
  j["skipped"] = nlohmann::json::array();
  for (const auto& s : skipped) j["skipped"].push_back({{"path", s.path.string()}, {"reason", s.reason}});
  return j;
}

Result<DatasetFingerprint> fingerprint_from_json(const nlohmann::json& j, const std::string& file) {
  try {
    if (j.value("format", std::string()) != "segflow-fingerprint-1")
      return corrupt_data(file + ": format: expected \"segflow-fingerprint-1\", got " +
                          (j.contains("format") ? j["format"].dump() : std::string("nothing")));
    DatasetFingerprint fp;
    fp.root = j.at("root").get<std::string>();
    const std::string layout = j.at("layout").get<std::string>();
    for (auto l : {DatasetLayout::msd, DatasetLayout::dicom, DatasetLayout::medsam_npy})
      if (layout == to_string(l)) fp.layout = l;
    fp.data_signature = j.at("data_signature").get<std::string>();
    fp.channel_names = j.at("channel_names").get<std::vector<std::string>>();
    fp.label_names = j.at("label_names").get<std::vector<std::string>>();
    fp.num_classes = j.at("num_classes").get<std::int64_t>();
    fp.samples_per_case = j.at("sampling").at("samples_per_case").get<std::int64_t>();
    fp.seed = j.at("sampling").at("seed").get<std::uint64_t>();
    for (std::size_t ch = 0; ch < fp.channel_names.size(); ++ch)
      fp.foreground_intensity.push_back(
          stats_from(j.at("foreground_intensity_properties_per_channel").at(std::to_string(ch))));
    fp.median_relative_size_after_cropping = j.at("median_relative_size_after_cropping").get<double>();
    for (const auto& c : j.at("cases")) fp.cases.push_back(case_from(c));
    for (const auto& e : j.at("excluded"))
      fp.excluded.push_back({e.at("id").get<std::string>(), e.at("file").get<std::string>(),
                             e.at("field").get<std::string>(), e.at("message").get<std::string>()});
    for (const auto& s : j.at("skipped"))
      fp.skipped.push_back({s.at("path").get<std::string>(), s.at("reason").get<std::string>()});
    return fp;
  } catch (const std::exception& e) {
    return corrupt_data(file + ": " + first_line(e));
  }
}

Status write_fingerprint(const DatasetFingerprint& fp, const fs::path& file) {
  return write_file_atomically(file, fp.to_json().dump(2) + '\n');
}

Result<DatasetFingerprint> read_fingerprint(const fs::path& file) {
  std::ifstream f(file);
  if (!f) return not_found(file.string() + ": cannot open");
  const auto j = nlohmann::json::parse(f, nullptr, false);
  if (j.is_discarded()) return corrupt_data(file.string() + ": expected JSON, got invalid JSON");
  return fingerprint_from_json(j, file.string());
}

}  // namespace segflow::pipeline

// segflow_cache_bench: what the memory cache holds and what the process holds, per
// train.cache_dtype, and a dataset several times train.cache_bytes (issue 17 item 4,
// issue 16 item 5). Prints one JSON object per line.
//
//   segflow_cache_bench [--quick] [--dir DIR]
//
// Each measurement runs in a child process of its own (this program, re-executed), so that
// its peak resident set (VmHWM) is its own; the peak is reset ("5" to /proc/self/clear_refs)
// after set-up, and the figure reported is the growth over the resident set at that point.
//
// Scenarios (the actor pipeline, as `segflow train` runs it; synthesized NIfTI phantoms with
// integer HU values):
//   dtype/<pipeline>/<cache_dtype>: every case cached (no binding budget), cache_dtype none
//     (the float32 image + int64 crop-centre lists, the baseline), exact and bfloat16, for a
//     quickstart-like pipeline (CT window, no resampling: the image is a palette of 501
//     values) and a spleen-like one (resampled: a continuous image). Bytes per cached
//     voxel, cache bytes, peak RSS growth over three epochs.
//   budget/<memory|disk>/<cache_dtype>: a dataset about 4.5 times train.cache_bytes; the
//     cases past the budget are decoded again every epoch (memory) or read back from the
//     disk cache (disk). Reports the cache's own bytes and high-water mark against the
//     budget, and the peak RSS growth against the budget plus what the pipeline may hold in
//     flight: the augmenter's window of deterministic samples (window x the largest sample
//     as the stages make it, uncompacted), the ready batches (max_inflight_batches x batch
//     bytes) and one decode in progress per decoder (decode_workers x 2 x that sample: a
//     stage's input and output alive together), an estimate, printed with its parts. The
//     same budget on a dataset twice as large (budget/.../x2) shows whether the peak grows
//     with the dataset; baseline in the same run: budget/unbounded, room for everything.

#include <torch/torch.h>

#include <yaml-cpp/yaml.h>  // complete YAML::Node: build_pipeline has a YAML overload
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "actors/actor_batch_source.hpp"
#include "pipeline/io/dataset.hpp"
#include "pipeline/pipeline_spec.hpp"
#include "pipeline/simple_loader.hpp"
#include "pipeline/stage_registry.hpp"
#include "pipeline/synth.hpp"

using namespace segflow;
using namespace segflow::pipeline;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

/// A field of /proc/self/status in MiB ("VmRSS", "VmHWM").
double proc_status_mb(const std::string& field) {
  std::ifstream f("/proc/self/status");
  for (std::string line; std::getline(f, line);)
    if (line.rfind(field + ":", 0) == 0) return std::stod(line.substr(field.size() + 1)) / 1024.0;
  return 0.0;
}

const char* kWindow =
    "[{name: load}, {name: scale_intensity_range, options: {a_min: -200, a_max: 300, b_min: 0.0, b_max: 1.0,"
    " clip: true}}, {name: fg_bg_indices},"
    " {name: rand_crop_pos_neg, options: {spatial_size: [32, 32, 32], pos: 3, neg: 1, num_samples: 4}},"
    " {name: rand_flip, options: {prob: 0.5, spatial_axis: [0]}}]";
const char* kResampled =
    "[{name: load}, {name: resample, options: {spacing: [1.3, 1.3, 1.6]}},"
    " {name: scale_intensity_range, options: {a_min: -57, a_max: 164, b_min: 0.0, b_max: 1.0, clip: true}},"
    " {name: fg_bg_indices},"
    " {name: rand_crop_pos_neg, options: {spatial_size: [32, 32, 32], pos: 1, neg: 1, num_samples: 4}},"
    " {name: rand_flip, options: {prob: 0.5, spatial_axis: [0]}}]";

std::int64_t batch_bytes(const Batch& b) {
  std::int64_t n = 0;
  for (const auto& [k, t] : b.tensors) n += t.numel() * static_cast<std::int64_t>(t.element_size());
  return n;
}

/// Child: one measurement; prints one JSON line. Arguments: data dir, pipeline (window |
/// resampled), cache_dtype, cache_bytes, disk cache dir ("-" = none), epochs.
/// Longer than a screen: one measurement read top to bottom (as step_bench's main).
int child(int argc, char** argv) {
  if (argc < 8) return 2;
  torch::set_num_threads(1);
  const fs::path data = argv[2];
  const std::string pipe = argv[3], dtype = argv[4];
  const std::int64_t budget = std::stoll(argv[5]);
  const std::string disk = argv[6];
  const int epochs = std::stoi(argv[7]);
  auto idx = scan_dataset(data);
  if (!idx.is_ok()) {
    std::cerr << idx.status().to_string() << "\n";
    return 3;
  }
  auto p = build_pipeline(YAML::Load(pipe == "window" ? kWindow : kResampled), builtin_registry(), pipe);
  if (!p.is_ok()) {
    std::cerr << p.status().to_string() << "\n";
    return 3;
  }
  LoaderOptions o;
  o.cases = idx->cases;
  o.pipeline = &p.value();
  o.batch_size = 2;
  o.decode_workers = 2;
  o.max_inflight_batches = 2;
  o.cache_bytes = budget;
  o.cache_dtype = dtype;
  if (disk != "-") o.disk_cache_dir = disk;
  auto src = actors::ActorBatchSource::make(o);
  if (!src.is_ok()) {
    std::cerr << src.status().to_string() << "\n";
    return 4;
  }
  // The largest deterministic sample as the stages make it (uncompacted), and the float32
  // case a decoder works on: the in-flight allowance below.
  std::int64_t det_bytes = 0, case_voxels = 0;
  for (const auto& c : idx->cases) {
    auto s = p->run_deterministic(c);
    if (!s.is_ok()) return 5;
    det_bytes = std::max(det_bytes, sample_bytes(*s));
    case_voxels = std::max(case_voxels, sample_voxels(*s));
  }
  const double base_mb = proc_status_mb("VmRSS");
  std::ofstream("/proc/self/clear_refs") << "5";
  std::int64_t max_batch = 0, batches = 0;
  std::vector<double> epoch_s, rss_after;
  for (int e = 0; e < epochs; ++e) {
    const auto t0 = std::chrono::steady_clock::now();
    if (!(*src)->start_epoch(e).is_ok()) return 6;
    while (true) {
      auto b = (*src)->next();
      if (!b.is_ok()) {
        std::cerr << b.status().to_string() << "\n";
        return 6;
      }
      if (!b.value()) break;
      max_batch = std::max(max_batch, batch_bytes(*b.value()));
      ++batches;
    }
    epoch_s.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    rss_after.push_back(proc_status_mb("VmRSS") - base_mb);
  }
  auto st = (*src)->stats();
  if (!st.is_ok()) return 7;
  const auto& c = st->cache;
  const auto& a = st->augment;
  const double mib = 1024.0 * 1024.0;
  const double peak_growth = proc_status_mb("VmHWM") - base_mb;
  // What the pipeline may hold besides the cache (see the header comment).
  const double inflight_mb =
      (static_cast<double>(a.window) * det_bytes + static_cast<double>(o.max_inflight_batches) * max_batch +
       static_cast<double>(o.decode_workers) * 2.0 * det_bytes) /
      mib;
  json j = {{"pipeline", pipe},
            {"cache_dtype", dtype},
            {"cases", idx->cases.size()},
            {"voxels_per_case", case_voxels},
            {"epochs", epochs},
            {"epoch_s", epoch_s},
            {"cache_budget_mb", budget / mib},
            {"cache_mb", c.bytes / mib},
            {"cache_max_mb_seen", c.max_bytes_seen / mib},
            {"cache_entries", c.entries},
            {"cache_not_admitted", c.not_admitted},
            {"cached_voxels", c.voxels},
            {"bytes_per_cached_voxel",
             c.voxels > 0 ? static_cast<double>(c.bytes) / static_cast<double>(c.voxels) : 0.0},
            {"decodes", c.decodes},
            {"disk_hits", c.disk_hits},
            {"memory_hits", c.hits},
            {"batches", batches},
            {"batch_mb", max_batch / mib},
            {"window_cases", a.window},
            {"max_window_seen", a.max_window_seen},
            {"max_ready_seen", a.max_ready_seen},
            {"det_sample_mb", det_bytes / mib},
            {"inflight_allowance_mb", inflight_mb},
            {"rss_base_mb", base_mb},
            {"rss_growth_after_epoch_mb", rss_after},
            {"peak_rss_growth_mb", peak_growth},
            {"peak_within_budget_plus_inflight",
             // (meaningless without a binding budget: null then)
             c.not_admitted > 0 ? json(peak_growth <= budget / mib + inflight_mb) : json(nullptr)}};
  std::cout << j.dump() << std::endl;
  return 0;
}

/// Runs a child and returns its JSON line (or an error object).
json run_child(const fs::path& self, const fs::path& data, const std::string& pipe, const std::string& dtype,
               std::int64_t budget, const std::string& disk, int epochs) {
  const std::string cmd = "'" + self.string() + "' --child '" + data.string() + "' " + pipe + " " + dtype +
                          " " + std::to_string(budget) + " '" + disk + "' " + std::to_string(epochs);
  FILE* f = popen(cmd.c_str(), "r");
  if (!f) return {{"error", "popen failed"}};
  std::string out;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, f)) out += buf;
  const int rc = pclose(f);
  const auto brace = out.rfind('{');
  if (rc != 0 || brace == std::string::npos) return {{"error", "child failed (" + std::to_string(rc) + ")"}};
  return json::parse(out.substr(brace));
}

void emit(const std::string& name, json j) {
  j["name"] = name;
  j["device"] = "cpu";
  j["loader"] = "actors";
  std::cout << j.dump() << std::endl;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "--child") return child(argc, argv);
  bool quick = false;
  fs::path dir = fs::temp_directory_path() / "segflow_cache_bench";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--quick") {
      quick = true;
    } else if (a == "--dir" && i + 1 < argc) {
      dir = argv[++i];
    } else {
      std::cerr << "segflow_cache_bench: unknown option " << a << " (known: --quick --dir DIR)\n";
      return 2;
    }
  }
  const fs::path self = fs::read_symlink("/proc/self/exe");
  fs::remove_all(dir);
  SynthOptions so;
  so.cases = quick ? 6 : 12;
  so.size = quick ? 64 : 112;
  so.out = dir / "data";
  so.seed = 3;
  if (Status s = synthesize_dataset(so); !s.is_ok()) {
    std::cerr << "segflow_cache_bench: " << s.to_string() << "\n";
    return 1;
  }
  const std::int64_t unbounded = std::int64_t{64} << 30;
  const int epochs = 3;
  for (const char* pipe : {"window", "resampled"})
    for (const char* dtype : {"none", "exact", "bfloat16"})
      emit(std::string("dtype/") + pipe + "/" + dtype,
           run_child(self, so.out, pipe, dtype, unbounded, "-", epochs));

  // Budget: about 1/4.5 of what the exact cache would hold for the whole dataset.
  const json all = run_child(self, so.out, "window", "exact", unbounded, "-", 1);
  if (!all.contains("cache_mb")) {
    std::cerr << "segflow_cache_bench: " << all.dump() << "\n";
    return 1;
  }
  const auto budget = static_cast<std::int64_t>(all["cache_mb"].get<double>() / 4.5 * 1024 * 1024);
  SynthOptions so2 = so;
  so2.cases = 2 * so.cases;
  so2.out = dir / "data_x2";
  if (Status s = synthesize_dataset(so2); !s.is_ok()) {
    std::cerr << "segflow_cache_bench: " << s.to_string() << "\n";
    return 1;
  }
  for (const auto& [data, tag] : {std::pair{so.out, std::string()}, std::pair{so2.out, std::string("/x2")}}) {
    emit("budget/unbounded/exact" + tag, run_child(self, data, "window", "exact", unbounded, "-", epochs));
    emit("budget/memory/exact" + tag, run_child(self, data, "window", "exact", budget, "-", epochs));
    emit("budget/disk/exact" + tag,
         run_child(self, data, "window", "exact", budget,
                   (dir / ("disk" + tag.substr(tag.empty() ? 0 : 1))).string(), epochs));
    emit("budget/memory/none" + tag, run_child(self, data, "window", "none", budget, "-", epochs));
  }
  fs::remove_all(dir);
  return 0;
}

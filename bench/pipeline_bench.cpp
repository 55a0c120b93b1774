// segflow_pipeline_bench: the data path's throughput and overlap, each scenario with its
// baseline in the same run. Prints one JSON object per line (name, samples_per_s, step_ms,
// device, config, ...).
//
//   segflow_pipeline_bench [--device cpu|cuda:N] [--quick]
//
// Scenarios
//   throughput/simple, throughput/actors: a synthesized NIfTI dataset through the built-in
//     stages (load -> scale_intensity_range | rand_crop_pos_neg -> rand_flip ->
//     rand_gaussian_noise), pulled as fast as possible. Epoch 0 ("cold") decodes every
//     case, epoch 1 ("warm") serves them from the memory cache.
//   overlap/simple, overlap/actors: a trainer stand-in sleeps T per step; a deterministic
//     loader stage sleeps L per sample (cache_rate 0, so every epoch pays it). Serial
//     expectation 1 / (T + L * batch); ideal overlap with W decoders
//     1 / max(T, L * batch / W). Both are reported with the measured rate and the ratios.

#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <string>
#include <thread>

#include <yaml-cpp/yaml.h>  // complete YAML::Node: parse_pipeline_spec has a YAML overload
#include <nlohmann/json.hpp>

#include "actors/actor_batch_source.hpp"
#include "pipeline/io/dataset.hpp"
#include "pipeline/pipeline_spec.hpp"
#include "pipeline/simple_loader.hpp"
#include "pipeline/stage_registry.hpp"
#include "pipeline/synth.hpp"

using namespace segflow;
using namespace segflow::pipeline;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

/// A source that fabricates a (1, S, S, S) image and label from the case file (no I/O cost
/// beyond a tiny read), so that the overlap scenario measures the sleeps only.
class BenchSource final : public SourceStage {
 public:
  explicit BenchSource(int size)
      : SourceStage("bench_source", {{"size", size}}, {"image", "label"}), size_(size) {}
  bool deterministic() const override { return true; }
  Status apply_sample(Sample&, Rng&) const override { return Status::ok(); }
  Result<Sample> read(const CaseEntry& e) const override {
    std::ifstream f(e.images.at(0));
    double n = 0;
    f >> n;
    Sample s;
    s.id = e.id;
    const std::int64_t S = size_;
    s.tensors["image"] = torch::full({1, S, S, S}, n, torch::kFloat32);
    s.tensors["label"] = torch::zeros({1, S, S, S}, torch::kUInt8);
    return s;
  }

 private:
  int size_;
};

/// Deterministic stage that sleeps `ms` per sample (a slow decode / preprocess).
class SleepStage final : public MapStage {
 public:
  explicit SleepStage(double ms) : MapStage("bench_sleep", {{"ms", ms}}, {"image"}), ms_(ms) {}
  bool deterministic() const override { return true; }
  Status apply_sample(Sample&, Rng&) const override {
    std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(ms_));
    return Status::ok();
  }

 private:
  double ms_;
};

/// Random stage that flips with a coin from the Rng (keeps the random part non-empty).
class CoinFlip final : public MapStage {
 public:
  CoinFlip() : MapStage("bench_flip", nlohmann::json::object(), {"image"}) {}
  bool deterministic() const override { return false; }
  Status apply_sample(Sample& s, Rng& rng) const override {
    if (rng.bernoulli(0.5)) s.at("image") = s.at("image").flip({3});
    return Status::ok();
  }
};

struct Run {
  std::int64_t samples = 0;
  std::int64_t steps = 0;
  double seconds = 0;
  double wait_s = 0;
};

/// Pulls one epoch; `step` runs after each batch (the trainer stand-in).
Result<Run> pull_epoch(BatchSource& src, std::int64_t epoch, double step_ms, const c10::Device& device) {
  Run r;
  SEGFLOW_RETURN_IF_ERROR(src.start_epoch(epoch));
  const auto t0 = Clock::now();
  while (true) {
    SEGFLOW_ASSIGN_OR_RETURN(std::optional<Batch> b, src.next());
    r.wait_s += src.last_wait_s();
    if (!b) break;
    if (device.is_cuda()) torch::cuda::synchronize();
    r.samples += static_cast<std::int64_t>(b->ids.size());
    ++r.steps;
    if (step_ms > 0) std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(step_ms));
  }
  r.seconds = seconds_since(t0);
  return r;
}

void emit(const std::string& name, const Run& r, const std::string& device, nlohmann::json config,
          nlohmann::json extra = nlohmann::json::object()) {
  nlohmann::json j;
  j["name"] = name;
  j["samples_per_s"] = r.seconds > 0 ? static_cast<double>(r.samples) / r.seconds : 0.0;
  j["step_ms"] = r.steps > 0 ? 1000.0 * r.seconds / static_cast<double>(r.steps) : 0.0;
  j["steps_per_s"] = r.seconds > 0 ? static_cast<double>(r.steps) / r.seconds : 0.0;
  j["samples"] = r.samples;
  j["steps"] = r.steps;
  j["seconds"] = r.seconds;
  j["data_wait_ms_per_step"] = r.steps > 0 ? 1000.0 * r.wait_s / static_cast<double>(r.steps) : 0.0;
  j["device"] = device;
  j["config"] = std::move(config);
  for (auto it = extra.begin(); it != extra.end(); ++it) j[it.key()] = it.value();
  std::cout << j.dump() << std::endl;
}

Result<std::unique_ptr<BatchSource>> make_source(bool actors, const LoaderOptions& o) {
  if (actors) {
    SEGFLOW_ASSIGN_OR_RETURN(auto s, actors::ActorBatchSource::make(o));
    return std::unique_ptr<BatchSource>(std::move(s));
  }
  SEGFLOW_ASSIGN_OR_RETURN(auto s, SimpleLoader::make(o));
  return std::unique_ptr<BatchSource>(std::move(s));
}

nlohmann::json config_json(const LoaderOptions& o) {
  return {{"cases", o.cases.size()},
          {"batch_size", o.batch_size},
          {"decode_workers", o.decode_workers},
          {"max_inflight_batches", o.max_inflight_batches},
          {"cache_rate", o.cache_rate},
          {"seed", o.seed},
          {"torch_threads", torch::get_num_threads()}};
}

Status throughput(const std::filesystem::path& tmp, const std::string& device, bool quick) {
  SynthOptions so;
  so.cases = quick ? 6 : 12;
  so.size = 64;
  so.format = "nifti";
  so.out = tmp / "throughput_data";
  SEGFLOW_RETURN_IF_ERROR(synthesize_dataset(so));
  SEGFLOW_ASSIGN_OR_RETURN(DatasetIndex index, scan_dataset(so.out));
  const StageRegistry registry = builtin_registry();
  const nlohmann::json stages = nlohmann::json::parse(R"([
    "load",
    {"name": "scale_intensity_range", "options": {"a_min": -200, "a_max": 300, "b_min": 0, "b_max": 1, "clip": true}},
    {"name": "rand_crop_pos_neg", "options": {"spatial_size": [48, 48, 32], "num_samples": 2}},
    {"name": "rand_flip", "options": {"prob": 0.5}},
    {"name": "rand_gaussian_noise", "options": {"prob": 0.5, "std": 0.05}}
  ])");
  SEGFLOW_ASSIGN_OR_RETURN(PipelineSpec spec, parse_pipeline_spec(stages, "bench"));
  SEGFLOW_ASSIGN_OR_RETURN(Pipeline p, build_pipeline(spec, registry));
  LoaderOptions o;
  o.cases = index.cases;
  o.pipeline = &p;
  o.batch_size = 4;
  o.seed = 7;
  o.device = device;
  o.decode_workers = 2;
  o.max_inflight_batches = 2;
  nlohmann::json cfg = config_json(o);
  cfg["stages"] = stages;
  cfg["synth_size"] = so.size;
  for (bool use_actors : {false, true}) {
    SEGFLOW_ASSIGN_OR_RETURN(auto src, make_source(use_actors, o));
    const std::string name = std::string("throughput/") + (use_actors ? "actors" : "simple");
    SEGFLOW_ASSIGN_OR_RETURN(Run cold, pull_epoch(*src, 0, 0, c10::Device(device)));
    emit(name + "/cold", cold, device, cfg, {{"epoch", 0}, {"note", "decodes every case"}});
    SEGFLOW_ASSIGN_OR_RETURN(Run warm, pull_epoch(*src, 1, 0, c10::Device(device)));
    emit(name + "/warm", warm, device, cfg,
         {{"epoch", 1}, {"note", "deterministic part from the memory cache"}});
  }
  return Status::ok();
}

Status overlap(const std::filesystem::path& tmp, const std::string& device, bool quick) {
  const double T = 40, L = 10;  // ms per step, ms per sample
  const int cases = quick ? 16 : 32;
  std::filesystem::create_directories(tmp / "overlap_data");
  std::vector<CaseEntry> entries;
  for (int i = 0; i < cases; ++i) {
    const auto path = tmp / "overlap_data" / ("case_" + std::to_string(i) + ".txt");
    std::ofstream(path) << i << "\n";
    entries.push_back({"case_" + std::to_string(i), {path}, std::nullopt});
  }
  std::vector<std::unique_ptr<Stage>> v;
  v.push_back(std::make_unique<BenchSource>(16));
  v.push_back(std::make_unique<SleepStage>(L));
  v.push_back(std::make_unique<CoinFlip>());
  const Pipeline p(std::move(v));
  LoaderOptions o;
  o.cases = entries;
  o.pipeline = &p;
  o.batch_size = 4;
  o.seed = 7;
  o.device = device;
  o.decode_workers = 4;
  o.max_inflight_batches = 2;
  o.cache_rate = 0;  // every epoch pays the loader cost
  const double B = static_cast<double>(o.batch_size), W = o.decode_workers;
  const double serial = 1000.0 / (T + L * B);            // steps/s
  const double ideal = 1000.0 / std::max(T, L * B / W);  // steps/s
  nlohmann::json cfg = config_json(o);
  cfg["step_sleep_ms"] = T;
  cfg["loader_sleep_ms_per_sample"] = L;
  cfg["epochs"] = 2;
  for (bool use_actors : {false, true}) {
    SEGFLOW_ASSIGN_OR_RETURN(auto src, make_source(use_actors, o));
    Run total;
    for (std::int64_t e = 0; e < 2; ++e) {
      SEGFLOW_ASSIGN_OR_RETURN(Run r, pull_epoch(*src, e, T, c10::Device(device)));
      total.samples += r.samples;
      total.steps += r.steps;
      total.seconds += r.seconds;
      total.wait_s += r.wait_s;
    }
    const double measured = total.seconds > 0 ? static_cast<double>(total.steps) / total.seconds : 0.0;
    emit(std::string("overlap/") + (use_actors ? "actors" : "simple"), total, device, cfg,
         {{"expected_serial_steps_per_s", serial},
          {"expected_ideal_overlap_steps_per_s", ideal},
          {"ratio_to_serial", measured / serial},
          {"ratio_to_ideal", measured / ideal}});
  }
  return Status::ok();
}

}  // namespace

int main(int argc, char** argv) {
  std::string device = "cpu";
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--device" && i + 1 < argc) {
      device = argv[++i];
    } else if (a == "--quick") {
      quick = true;
    } else {
      std::cerr << "segflow_pipeline_bench: unknown argument '" << a << "'; usage: segflow_pipeline_bench "
                << "[--device cpu|cuda:N] [--quick]\n";
      return 2;
    }
  }
  torch::set_num_threads(1);  // one intra-op thread per actor thread: the pipeline parallelises
  std::random_device rd;
  const auto tmp = std::filesystem::temp_directory_path() / ("segflow_bench_" + std::to_string(rd()));
  std::filesystem::create_directories(tmp);
  Status s = throughput(tmp, device, quick);
  if (s.is_ok()) s = overlap(tmp, device, quick);
  std::error_code ec;
  std::filesystem::remove_all(tmp, ec);
  if (!s.is_ok()) {
    std::cerr << "segflow_pipeline_bench: " << s.to_string() << "\n";
    return 1;
  }
  return 0;
}

// segflow_parallel_bench: data-parallel training throughput for several world sizes, with
// the communication time per step. Prints one JSON object per line.
//
//   segflow_parallel_bench [--config PATH] [--world-sizes 1,2] [--steps N | --seconds S]
//                          [--device cpu|cuda] [--set key=value ...]
//
// What it does, per world size W
//   - builds one models::Trainer per rank from the job config (default
//     configs/quickstart-unet3d.yaml, run from the repository root), on cpu (Gloo) or on
//     cuda:0 .. cuda:W-1 (NCCL); ranks are threads of this process meeting through a
//     models::parallel::LocalRendezvous, each with a DdpGradientSync attached to its trainer
//     (W = 1 included: a group of one, so its figure carries the reducer's overhead too);
//   - feeds every rank random batches that are already in memory, on the rank's device
//     (image uniform [0, 1), label integer in [0, num_classes)), shaped like the config's
//     training crops: train.batch_size samples of the last `spatial_size` in `stages` (else
//     validation.roi_size, else data.synth.size), so only compute and communication count;
//   - runs the trainer's own training step (Trainer::train_epoch over that in-memory
//     source): 2 warm-up steps, a barrier, then --steps N (default 10) or --seconds S;
//   - then times K = 10 standalone Collective::allreduce_mean calls on tensors shaped like
//     the model's gradients (the full gradient size, outside backward): comm_ms.
//
// Output lines
//   {"bench":"parallel","backend","world_size","device","devices","per_rank_batch",
//    "global_batch","accumulate","patch_xyz","steps","step_ms","samples_per_s","comm_ms",
//    "grad_mb","threads","sync",...}
//     step_ms: mean wall time per optimizer step, the slowest rank's; samples_per_s: global
//     samples per second; comm_ms: mean of the K all-reduces, the slowest rank's.
//   {"bench":"parallel","world_size":W,"skipped":"only N CUDA devices"} when W > devices.
//   {"bench":"parallel_summary","scaling_efficiency_w2","speedup_w2"}: samples/s at W = 2
//     over 2 x (resp. 1 x) samples/s at W = 1 (null when either is missing).
//
// Reading the numbers: on a CPU the in-process ranks share the same cores and LibTorch's
// one intra-op thread pool, so two ranks on a 2-core machine compete for the same cores and
// a scaling efficiency well below 1 is expected there; the figure that matters is the one
// on GPUs (one device per rank, NCCL).

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "messages/sample.hpp"
#include "messages/status.hpp"
#include "models/parallel/collective.hpp"
#include "models/parallel/ddp_sync.hpp"
#include "models/training/job_config.hpp"
#include "models/training/trainer.hpp"
#include "pipeline/batch_source.hpp"

using namespace segflow;
using Clock = std::chrono::steady_clock;
using nlohmann::json;

namespace {

constexpr int kWarmupSteps = 2;
constexpr int kCommCalls = 10;
constexpr const char* kUsage =
    "usage: segflow_parallel_bench [--config PATH] [--world-sizes 1,2] [--steps N | --seconds S]\n"
    "                              [--device cpu|cuda] [--set key=value ...]\n"
    "  --config       job config (default configs/quickstart-unet3d.yaml)\n"
    "  --world-sizes  comma-separated ranks per run, each >= 1 (default 1,2)\n"
    "  --steps        timed optimizer steps per run, >= 1 (default 10)\n"
    "  --seconds      time-boxed runs instead of --steps, > 0\n"
    "  --device       cpu (Gloo, default) or cuda (NCCL on cuda:0 .. cuda:W-1)\n"
    "  --set          config override, as `segflow train --set` (repeatable)\n";

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct Options {
  std::string config = "configs/quickstart-unet3d.yaml";
  std::vector<int> world_sizes{1, 2};
  std::int64_t steps = 10;
  double seconds = 0;  ///< > 0: time-boxed instead of `steps`
  bool cuda = false;
  std::vector<std::string> overrides;
};

/// Serves one in-memory batch over and over: `limit` micro-batches per epoch, or as many as
/// fit in `seconds` when that is > 0. No I/O, no collation, no waiting.
class MemorySource final : public pipeline::BatchSource {
 public:
  explicit MemorySource(Batch batch) : batch_(std::move(batch)) {}
  void set_limit(std::int64_t micro_batches, double seconds) {
    limit_ = micro_batches;
    seconds_ = seconds;
  }
  Status start_epoch(std::int64_t) override {
    served_ = 0;
    t0_ = Clock::now();
    return Status::ok();
  }
  Result<std::optional<Batch>> next() override {
    const bool done = seconds_ > 0 ? seconds_since(t0_) >= seconds_ : served_ >= limit_;
    if (done) return std::optional<Batch>();
    ++served_;
    return std::optional<Batch>(batch_);  // shallow: the tensors are shared
  }
  std::vector<pipeline::CaseFailure> take_failures() override { return {}; }
  double last_wait_s() const override { return 0.0; }

 private:
  Batch batch_;
  std::int64_t limit_ = 0;
  double seconds_ = 0;
  std::int64_t served_ = 0;
  Clock::time_point t0_ = Clock::now();
};

/// The training crop in config order (x, y, z), or (x, y) for 2D models, rounded up to the
/// model's size divisor.
Result<std::vector<std::int64_t>> patch_xyz(const models::JobConfig& cfg, const models::ModelInfo& info) {
  const auto dims = static_cast<std::size_t>(info.spatial_dims);
  if (info.fixed_size > 0) return std::vector<std::int64_t>(dims, info.fixed_size);
  std::int64_t fallback = 32;
  if (cfg.data.synth) fallback = cfg.data.synth->size;
  std::vector<std::int64_t> xyz;
  for (const auto& st : cfg.stages.stages) {
    const auto it = st.options.find("spatial_size");
    if (it == st.options.end() || !it->is_array()) continue;
    xyz.clear();
    for (const auto& v : *it) xyz.push_back(v.is_number_integer() ? v.get<std::int64_t>() : 0);
  }
  if (xyz.empty()) xyz = cfg.validation.roi_size;
  if (xyz.empty()) xyz.assign(dims, fallback);
  for (auto& v : xyz)
    if (v <= 0) v = fallback;  // "full extent": the synthetic volume's size
  // 2D models train on (x, y, 1) crops of volumes: keep x and y.
  if (xyz.size() > dims) xyz.resize(dims);
  if (xyz.size() < dims)
    return invalid_config(cfg.file + ": crop size has " + std::to_string(xyz.size()) + " axes, the model " +
                          std::to_string(dims));
  const std::int64_t d = std::max<std::int64_t>(1, info.size_divisor);
  for (auto& v : xyz) v = (v + d - 1) / d * d;
  return xyz;
}

/// A random batch of `b` samples for `trainer`, on its device.
Batch random_batch(const models::Trainer& trainer, std::int64_t b, const std::vector<std::int64_t>& xyz,
                   std::uint64_t seed) {
  const auto& info = trainer.model().info();
  torch::manual_seed(seed);
  std::vector<std::int64_t> shape{b, info.in_channels};
  std::vector<std::int64_t> label_shape{b, 1};
  for (auto it = xyz.rbegin(); it != xyz.rend(); ++it) {  // tensors are (N, C, [Z,] Y, X)
    shape.push_back(*it);
    label_shape.push_back(*it);
  }
  Batch out;
  for (std::int64_t i = 0; i < b; ++i) out.ids.push_back("random_" + std::to_string(i));
  const c10::Device dev = trainer.device();
  out.tensors["image"] = torch::rand(shape).to(dev);
  out.tensors["label"] = torch::randint(0, trainer.num_classes(), label_shape, torch::kUInt8).to(dev);
  if (info.needs_box) {
    const double s = static_cast<double>(xyz.front());
    out.tensors["box"] = torch::tensor({s / 4, s / 4, 3 * s / 4, 3 * s / 4}).repeat({b, 1}).to(dev);
  }
  return out;
}

void sync_device(const c10::Device& d) {
  if (d.is_cuda()) torch::cuda::synchronize(d.index());
}

/// What one rank measured.
struct RankResult {
  Status status;
  std::int64_t steps = 0;
  double train_s = 0;
  double comm_s = 0;  ///< per all-reduce
  double loss = 0;
};

/// One rank's thread: join, attach DDP, warm up, time the steps, time the all-reduces.
Status run_rank(int rank, models::parallel::LocalRendezvous& rv, models::Trainer& trainer,
                MemorySource& source, const Options& o, RankResult& out) {
  const c10::Device dev = trainer.device();
  SEGFLOW_ASSIGN_OR_RETURN(std::unique_ptr<models::parallel::Collective> joined, rv.join(rank, dev));
  std::shared_ptr<models::parallel::Collective> coll = std::move(joined);
  SEGFLOW_ASSIGN_OR_RETURN(auto sync, models::parallel::DdpGradientSync::create(trainer, coll));
  trainer.set_gradient_sync(sync);
  struct Detach {  // the collective goes in this thread, whatever happens
    models::Trainer& t;
    ~Detach() { t.set_gradient_sync(nullptr); }
  } detach{trainer};

  const std::int64_t accumulate = trainer.config().train.accumulate;
  const std::int64_t schedule_steps = kWarmupSteps + o.steps;
  models::TrainObserver quiet;
  source.set_limit(kWarmupSteps * accumulate, 0);
  SEGFLOW_ASSIGN_OR_RETURN(models::EpochInfo warm, trainer.train_epoch(source, schedule_steps, quiet));
  (void)warm;

  SEGFLOW_RETURN_IF_ERROR(coll->barrier());
  sync_device(dev);
  source.set_limit(o.steps * accumulate, o.seconds);
  auto t0 = Clock::now();
  SEGFLOW_ASSIGN_OR_RETURN(models::EpochInfo ep, trainer.train_epoch(source, schedule_steps, quiet));
  sync_device(dev);
  out.train_s = seconds_since(t0);
  out.steps = ep.steps;
  out.loss = ep.loss;

  // A standalone all-reduce of the whole gradient, as the reducer's buckets add up to.
  std::vector<at::Tensor> grads;
  {
    torch::NoGradGuard ng;
    for (const auto& p : trainer.parameters()) grads.push_back(torch::rand_like(p));
  }
  SEGFLOW_RETURN_IF_ERROR(coll->allreduce_mean(grads));  // warm-up
  SEGFLOW_RETURN_IF_ERROR(coll->barrier());
  sync_device(dev);
  t0 = Clock::now();
  for (int i = 0; i < kCommCalls; ++i) SEGFLOW_RETURN_IF_ERROR(coll->allreduce_mean(grads));
  sync_device(dev);
  out.comm_s = seconds_since(t0) / kCommCalls;
  return coll->barrier();  // nobody tears the group down while a peer still uses it
}

/// One world size; the JSON line's samples_per_s, or nothing when skipped.
Result<std::optional<double>> run_world(const models::JobConfig& base, int world, const Options& o) {
  if (o.cuda) {
    const auto n = static_cast<int>(torch::cuda::device_count());
    if (n < world) {
      std::cerr << "segflow_parallel_bench: world size " << world << " needs " << world
                << " CUDA devices, found " << n << "; skipped\n";
      std::cout << json{{"bench", "parallel"},
                        {"world_size", world},
                        {"skipped", "only " + std::to_string(n) + " CUDA devices"}}
                       .dump()
                << std::endl;
      return std::optional<double>();
    }
  }
  models::JobConfig cfg = base;
  cfg.train.steps_per_epoch = 0;  // the in-memory source decides the number of batches

  // Trainers one after the other: Trainer::create seeds the process-wide RNG (rank 0's
  // weights win anyway, by broadcast).
  std::vector<std::unique_ptr<models::Trainer>> trainers;
  std::vector<std::unique_ptr<MemorySource>> sources;
  std::vector<std::string> devices;
  std::vector<std::int64_t> xyz;
  for (int r = 0; r < world; ++r) {
    const c10::Device dev =
        o.cuda ? c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(r)) : c10::Device(c10::kCPU);
    devices.push_back(dev.str());
    SEGFLOW_ASSIGN_OR_RETURN(auto t, models::Trainer::create(cfg, dev));
    SEGFLOW_ASSIGN_OR_RETURN(xyz, patch_xyz(cfg, t->model().info()));
    sources.push_back(std::make_unique<MemorySource>(
        random_batch(*t, cfg.train.batch_size, xyz, cfg.seed + 1000 + static_cast<std::uint64_t>(r))));
    trainers.push_back(std::move(t));
  }

  models::parallel::CollectiveOptions co;
  co.timeout = std::chrono::minutes(10);
  models::parallel::LocalRendezvous rv(world, co);
  std::vector<RankResult> results(static_cast<std::size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      const auto i = static_cast<std::size_t>(r);
      try {
        results[i].status = run_rank(r, rv, *trainers[i], *sources[i], o, results[i]);
      } catch (const std::exception& e) {
        results[i].status = internal_error("rank " + std::to_string(r) + ": " + e.what());
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < world; ++r) {
    const auto& st = results[static_cast<std::size_t>(r)].status;
    if (!st.is_ok())
      return st.with_context("world size " + std::to_string(world) + ", rank " + std::to_string(r));
  }

  double train_s = 0, comm_s = 0;
  std::int64_t steps = results[0].steps;
  for (const auto& rr : results) {
    train_s = std::max(train_s, rr.train_s);
    comm_s = std::max(comm_s, rr.comm_s);
    steps = std::min(steps, rr.steps);
  }
  if (steps <= 0 || train_s <= 0)
    return internal_error("world size " + std::to_string(world) +
                          ": no timed step completed (raise --seconds)");
  double grad_bytes = 0;
  for (const auto& p : trainers[0]->parameters())
    grad_bytes += static_cast<double>(p.numel()) * static_cast<double>(p.element_size());
  const std::int64_t b = cfg.train.batch_size;
  const std::int64_t acc = cfg.train.accumulate;
  const double samples_per_s = static_cast<double>(world * b * acc * steps) / train_s;
  json j{{"bench", "parallel"},
         {"backend", o.cuda ? "nccl" : "gloo"},
         {"world_size", world},
         {"device", o.cuda ? "cuda" : "cpu"},
         {"devices", devices},
         {"config", cfg.file},
         {"model", cfg.model.name()},
         {"per_rank_batch", b},
         {"global_batch", b * world},
         {"accumulate", acc},
         {"patch_xyz", xyz},
         {"steps", steps},
         {"seconds", train_s},
         {"step_ms", 1000.0 * train_s / static_cast<double>(steps)},
         {"samples_per_s", samples_per_s},
         {"comm_ms", 1000.0 * comm_s},
         {"comm_calls", kCommCalls},
         {"grad_mb", grad_bytes / (1024.0 * 1024.0)},
         {"threads", at::get_num_threads()},
         {"sync", true},
         {"loss", results[0].loss}};
  std::cout << j.dump() << std::endl;
  return std::optional<double>(samples_per_s);
}

bool parse_int(const std::string& s, std::int64_t& out) {
  try {
    std::size_t pos = 0;
    out = std::stoll(s, &pos);
    return pos == s.size();
  } catch (const std::exception&) {
    return false;
  }
}

/// Fills `o` from argv; an error message for bad arguments ("" for --help).
std::optional<std::string> parse_args(int argc, char** argv, Options& o, bool& help) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    if (a == "--help" || a == "-h") {
      help = true;
      return std::nullopt;
    }
    if (a != "--config" && a != "--world-sizes" && a != "--steps" && a != "--seconds" && a != "--device" &&
        a != "--set")
      return "unknown argument '" + a + "'";
    if (!has_value) return a + ": expected a value";
    const std::string v = argv[++i];
    if (a == "--config") {
      o.config = v;
    } else if (a == "--world-sizes") {
      o.world_sizes.clear();
      std::stringstream ss(v);
      std::string item;
      while (std::getline(ss, item, ',')) {
        std::int64_t w = 0;
        if (!parse_int(item, w) || w < 1 || w > 64)
          return "--world-sizes: expected integers in [1, 64], got '" + v + "'";
        o.world_sizes.push_back(static_cast<int>(w));
      }
      if (o.world_sizes.empty()) return "--world-sizes: expected at least one world size";
    } else if (a == "--steps") {
      if (!parse_int(v, o.steps) || o.steps < 1) return "--steps: expected an integer >= 1, got '" + v + "'";
    } else if (a == "--seconds") {
      try {
        std::size_t pos = 0;
        o.seconds = std::stod(v, &pos);
        if (pos != v.size() || !(o.seconds > 0)) throw std::invalid_argument(v);
      } catch (const std::exception&) {
        return "--seconds: expected a number > 0, got '" + v + "'";
      }
    } else if (a == "--device") {
      if (v != "cpu" && v != "cuda") return "--device: expected cpu or cuda, got '" + v + "'";
      o.cuda = v == "cuda";
    } else {
      o.overrides.push_back(v);
    }
  }
  return std::nullopt;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  bool help = false;
  if (auto err = parse_args(argc, argv, o, help)) {
    std::cerr << "segflow_parallel_bench: " << *err << "\n" << kUsage;
    return 2;
  }
  if (help) {
    std::cout << kUsage;
    return 0;
  }
  auto cfg = models::load_job_config(o.config, o.overrides);
  if (!cfg.is_ok()) {
    std::cerr << "segflow_parallel_bench: " << cfg.status().to_string() << "\n";
    return 1;
  }
  if (o.cuda && !torch::cuda::is_available())
    std::cerr << "segflow_parallel_bench: --device cuda: CUDA is not available on this machine\n";

  std::optional<double> sps1, sps2;
  bool any_ran = false;
  for (int w : o.world_sizes) {
    auto r = run_world(*cfg, w, o);
    if (!r.is_ok()) {
      std::cerr << "segflow_parallel_bench: " << r.status().to_string() << "\n";
      return 1;
    }
    if (!r->has_value()) continue;
    any_ran = true;
    if (w == 1) sps1 = **r;
    if (w == 2) sps2 = **r;
  }
  json summary{{"bench", "parallel_summary"},
               {"backend", o.cuda ? "nccl" : "gloo"},
               {"scaling_efficiency_w2", nullptr},
               {"speedup_w2", nullptr}};
  if (sps1 && sps2 && *sps1 > 0) {
    summary["scaling_efficiency_w2"] = *sps2 / (2.0 * *sps1);
    summary["speedup_w2"] = *sps2 / *sps1;
  }
  std::cout << summary.dump() << std::endl;
  if (!any_ran) {
    std::cerr << "segflow_parallel_bench: no world size could run on this machine\n";
    return 1;
  }
  return 0;
}

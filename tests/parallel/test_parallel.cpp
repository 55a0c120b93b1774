// Data-parallel training (models/parallel/, actors/parallel/data_parallel.hpp): equivalence of W
// ranks with per-rank batch B/W and one rank with batch B, each rank running the trainer's own
// step (Trainer::train_step) on a small UNet, in one process (threads) and in
// two processes over loopback (this executable re-run as workers), with and without
// gradient accumulation; a dead rank; the launcher environment. NCCL/CUDA cases skip with
// a message without a GPU (scripts/gpu-check.sh selects them by name).
#include <doctest/doctest.h>

#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "actors/parallel/data_parallel.hpp"
#include "job_yaml.hpp"
#include "models/parallel/collective.hpp"
#include "models/parallel/ddp_sync.hpp"
#include "models/training/checkpoint.hpp"
#include "models/training/job_config.hpp"
#include "models/training/trainer.hpp"
#include "pipeline/batch_source.hpp"
#include "pipeline/io/dataset.hpp"
#include "pipeline/io/image_io.hpp"
#include "test_util.hpp"

namespace {

using segflow::models::parallel::Collective;
using segflow::models::parallel::CollectiveOptions;
using segflow::models::parallel::DdpGradientSync;
using segflow::models::parallel::DdpOptions;
using segflow::models::parallel::LocalRendezvous;
namespace par = segflow::models::parallel;

constexpr std::int64_t kGlobalBatch = 8;
constexpr std::int64_t kSteps = 4;
constexpr std::int64_t kSide = 8;  ///< voxels per axis of a sample

struct StepPlan {
  std::int64_t accumulate = 1;  ///< micro-batches per optimizer step
  std::int64_t last_micro = 0;  ///< >0: the last step has only this many micro-batches (epoch ends early)
};

/// A small real job: a 3D UNet (instance norm, so a rank's half batch gives the same
/// per-sample gradients as the whole batch), Dice + CE, SGD with momentum, a constant
/// learning rate, and the plan's gradient accumulation. Rank r's trainer is seeded 7 + r:
/// the synchroniser's broadcast must make the initial weights equal.
std::unique_ptr<segflow::models::Trainer> make_trainer(std::uint64_t seed, const StepPlan& plan,
                                                       const c10::Device& device) {
  segflow::testing::JobYaml job;
  job.name = "dpstep";
  job.seed = std::to_string(seed);
  job.root = "unused";
  job.synth = job.val_cases = "";
  job.num_classes = "3";
  job.stages = {segflow::testing::kLoadStage};
  job.model = segflow::testing::unet3d(3, "channels: [4, 8], strides: [2], num_res_units: 1, norm: instance");
  job.optimizer = "{name: sgd, lr: 0.05, momentum: 0.9}";
  job.epochs = 1;
  job.train = "batch_size: 4, device: cpu, accumulate: " + std::to_string(plan.accumulate);
  job.validation = "";
  auto cfg = segflow::models::parse_job_config(job.yaml(), "dpstep.yaml");
  if (!cfg.is_ok()) throw std::runtime_error(cfg.status().message());
  auto t = segflow::models::Trainer::create(*cfg, device);
  if (!t.is_ok()) throw std::runtime_error(t.status().message());
  return std::move(t).value();
}

/// Fixed synthetic data: images (rows, 1, S, S, S) and labels in {0, 1, 2}.
struct Data {
  at::Tensor x, y;
};
Data make_data(std::int64_t rows) {
  auto g = at::make_generator<at::CPUGeneratorImpl>(1234);
  Data d;
  d.x = at::randn({rows, 1, kSide, kSide, kSide}, g);
  d.y = at::randint(0, 3, {rows, 1, kSide, kSide, kSide}, g);
  return d;
}

std::int64_t micro_batches(const StepPlan& p) {
  return (kSteps - 1) * p.accumulate + (p.last_micro > 0 ? p.last_micro : p.accumulate);
}
std::int64_t rows_needed(const StepPlan& p) { return micro_batches(p) * kGlobalBatch; }

/// This rank's share of the data as the trainer pulls it: micro-batch i is rows
/// [i*B + rank*b, +b) of the data, b = B / world, until the plan's micro-batches are used up.
class ShardSource : public segflow::pipeline::BatchSource {
 public:
  ShardSource(const Data& data, const StepPlan& plan, int rank, int world)
      : data_(data), available_(micro_batches(plan)), rank_(rank), b_(kGlobalBatch / world) {}
  segflow::Status start_epoch(std::int64_t) override {
    next_ = 0;
    return segflow::Status::ok();
  }
  segflow::Result<std::optional<segflow::Batch>> next() override {
    if (next_ >= available_) return std::optional<segflow::Batch>();
    const std::int64_t row = next_++ * kGlobalBatch + rank_ * b_;
    segflow::Batch batch;
    batch.tensors["image"] = data_.x.narrow(0, row, b_);
    batch.tensors["label"] = data_.y.narrow(0, row, b_);
    return std::optional<segflow::Batch>(std::move(batch));
  }
  std::vector<segflow::pipeline::CaseFailure> take_failures() override { return {}; }
  double last_wait_s() const override { return 0.0; }

 private:
  const Data& data_;
  std::int64_t available_, next_ = 0;
  int rank_;
  std::int64_t b_;
};

/// Trains kSteps with Trainer::train_step (the step train_epoch runs: all_have,
/// before_backward, backward, after_backward, short-step rescale, optimizer step) on this
/// rank's share of each micro-batch, with the trainer's synchroniser if one is attached.
/// Checks what each step reports; after the last full step, one more call finds no data.
void train(segflow::models::Trainer& trainer, const Data& data, const StepPlan& plan, int rank, int world) {
  ShardSource source(data, plan, rank, world);
  if (!source.start_epoch(0).is_ok()) throw std::runtime_error("start_epoch failed");
  segflow::models::TrainObserver none;
  auto fail = [](const std::string& m) { throw std::runtime_error(m); };
  for (std::int64_t s = 0; s < kSteps; ++s) {
    auto si = trainer.train_step(source, kSteps, none);
    if (!si.is_ok()) fail(si.status().message());
    const bool short_step = plan.last_micro > 0 && s == kSteps - 1;
    if (si->micro_batches != (short_step ? plan.last_micro : plan.accumulate))
      fail("step " + std::to_string(s) + ": " + std::to_string(si->micro_batches) + " micro-batches");
    if (si->data_ended != short_step) fail("step " + std::to_string(s) + ": wrong data_ended");
    if (si->step != s + 1 || si->samples != si->micro_batches * (kGlobalBatch / world))
      fail("step " + std::to_string(s) + ": wrong step or sample count");
  }
  if (plan.last_micro == 0) {
    auto end = trainer.train_step(source, kSteps, none);
    if (!end.is_ok()) fail(end.status().message());
    if (end->micro_batches != 0 || !end->data_ended) fail("a step after the data ended did something");
  }
  if (trainer.state().step != kSteps) fail("wrong optimizer step count");
}

std::vector<at::Tensor> weights(const segflow::models::Trainer& t) {
  std::vector<at::Tensor> out;
  for (auto& p : t.parameters()) out.push_back(p.detach().to(torch::kCPU).clone());
  return out;
}

double max_diff(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  REQUIRE(a.size() == b.size());
  double d = 0;
  for (std::size_t i = 0; i < a.size(); ++i) d = std::max(d, (a[i] - b[i]).abs().max().item<double>());
  return d;
}

/// One rank with the whole batch: the reference.
std::vector<at::Tensor> reference(const StepPlan& plan, const c10::Device& device) {
  auto trainer = make_trainer(7, plan, device);
  train(*trainer, make_data(rows_needed(plan)), plan, 0, 1);
  return weights(*trainer);
}

DdpOptions tiny_buckets() {
  DdpOptions o;
  o.bucket_cap_mb = 1.0 / 1024.0;  // 1 KiB: several buckets for this model
  o.first_bucket_cap_mb = 0.5 / 1024.0;
  return o;
}

/// `world` ranks in this process, one thread each; rank r starts from seed 7 + r (the
/// broadcast must make them equal). Returns each rank's final weights.
std::vector<std::vector<at::Tensor>> train_local(int world, const StepPlan& plan,
                                                 const std::vector<c10::Device>& devices,
                                                 std::size_t* buckets = nullptr,
                                                 std::pair<std::int64_t, std::int64_t>* reduced = nullptr) {
  // Made here, one after the other: Trainer::create seeds the global generator.
  std::vector<std::unique_ptr<segflow::models::Trainer>> trainers;
  for (int r = 0; r < world; ++r) trainers.push_back(make_trainer(7 + r, plan, devices[r]));
  const Data data = make_data(rows_needed(plan));
  CollectiveOptions co;
  co.timeout = std::chrono::seconds(60);
  LocalRendezvous rv(world, co);
  std::vector<std::string> errors(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        auto coll = rv.join(r, devices[r]);
        if (!coll.is_ok()) throw std::runtime_error(coll.status().message());
        std::shared_ptr<Collective> c = std::move(coll).value();
        auto sync = DdpGradientSync::create(*trainers[r], c, tiny_buckets());
        if (!sync.is_ok()) throw std::runtime_error(sync.status().message());
        if (buckets && r == 0) *buckets = (*sync)->num_buckets();
        trainers[r]->set_gradient_sync(*sync);
        train(*trainers[r], data, plan, r, world);
        trainers[r]->set_gradient_sync(nullptr);
        if (reduced && r == 0) *reduced = {(*sync)->reduced_steps(), (*sync)->fallback_steps()};
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < world; ++r) {
    INFO("rank " << r);
    CHECK(errors[r] == "");
  }
  std::vector<std::vector<at::Tensor>> out;
  for (auto& t : trainers) out.push_back(weights(*t));
  return out;
}

void check_local_equivalence(const StepPlan& plan) {
  const c10::Device cpu(c10::kCPU);
  const auto ref = reference(plan, cpu);
  std::size_t buckets = 0;
  std::pair<std::int64_t, std::int64_t> reduced;
  const auto ranks = train_local(2, plan, {cpu, cpu}, &buckets, &reduced);
  CHECK(buckets > 1);
  // One reducer all-reduce per full step (none on accumulating micro-steps), the fallback
  // all-reduce for the short last step.
  CHECK(reduced.first == (plan.last_micro > 0 ? kSteps - 1 : kSteps));
  CHECK(reduced.second == (plan.last_micro > 0 ? 1 : 0));
  CHECK(max_diff(ranks[0], ranks[1]) == 0.0);  // every rank holds the same weights
  CHECK(max_diff(ranks[0], ref) < 1e-5);
  // And training did move the weights (the comparison is not vacuous).
  auto init = make_trainer(7, plan, cpu);
  CHECK(max_diff(weights(*init), ref) > 1e-3);
}

// ---- two processes: this executable again, as workers -----------------------------------

const char* kWorkerEntry = "parallel_worker";

/// This executable again as a data-parallel worker (parallel_worker below), with `extra`
/// added to its environment.
segflow::testing::ChildProcess spawn_worker(const std::map<std::string, std::string>& extra) {
  std::vector<std::string> env;
  for (const auto& [k, v] : extra) env.push_back(k + "=" + v);
  return segflow::testing::start_child_entry(kWorkerEntry, env, segflow::testing::ChildOutput::inherit);
}

}  // namespace

/// A data-parallel rank in its own process, started by spawn_worker: trains the reference
/// model on its shard and writes "ok <weights>" or "error <message>" to SEGFLOW_PARALLEL_OUT.
int parallel_worker() {
  const char* out = std::getenv("SEGFLOW_PARALLEL_OUT");
  if (!out) {
    std::fprintf(stderr, "parallel_worker: SEGFLOW_PARALLEL_OUT is not set\n");
    return 2;
  }
  const std::string mode =
      std::getenv("SEGFLOW_PARALLEL_MODE") ? std::getenv("SEGFLOW_PARALLEL_MODE") : "train";
  StepPlan plan;
  plan.accumulate = std::atoi(
      std::getenv("SEGFLOW_PARALLEL_ACCUMULATE") ? std::getenv("SEGFLOW_PARALLEL_ACCUMULATE") : "1");
  std::string result;
  try {
    auto env = par::launch_env();
    if (!env.is_ok()) throw std::runtime_error(env.status().message());
    CollectiveOptions co;
    co.timeout = std::chrono::seconds(mode == "die" ? 5 : 60);
    const c10::Device cpu(c10::kCPU);
    auto coll = par::connect(*env, cpu, co);
    if (!coll.is_ok()) throw std::runtime_error(coll.status().message());
    std::shared_ptr<Collective> c = std::move(coll).value();
    auto trainer = make_trainer(7 + env->rank, plan, cpu);
    auto sync = DdpGradientSync::create(*trainer, c, tiny_buckets());
    if (!sync.is_ok()) throw std::runtime_error(sync.status().message());
    if (mode == "die" && env->rank == 1) ::_exit(3);  // a rank that dies after the start
    trainer->set_gradient_sync(*sync);
    train(*trainer, make_data(rows_needed(plan)), plan, env->rank, env->world_size);
    std::ostringstream ss;
    ss.precision(9);
    for (auto& w : weights(*trainer)) {
      auto f = w.reshape({-1});
      for (std::int64_t i = 0; i < f.numel(); ++i) ss << f[i].item<float>() << ' ';
    }
    result = "ok " + ss.str();
  } catch (const std::exception& e) {
    result = std::string("error ") + e.what();
  }
  std::ofstream(out) << result;
  return 0;
}

const segflow::testing::ChildEntry kParallelWorker(kWorkerEntry, parallel_worker);

TEST_CASE("2 Gloo ranks in one process match 1 rank with the whole batch") {
  check_local_equivalence({.accumulate = 1});
}

TEST_CASE("2 Gloo ranks in one process match 1 rank with gradient accumulation (no_sync)") {
  check_local_equivalence({.accumulate = 3});
}

TEST_CASE("an epoch that ends mid-accumulation is reduced without the reducer") {
  check_local_equivalence({.accumulate = 3, .last_micro = 2});
}

TEST_CASE(
    "the Gloo collective's allreduce_mean, broadcast, all and any give every rank the expected values") {
  CollectiveOptions co;
  co.timeout = std::chrono::seconds(30);
  co.bucket_bytes = 64;  // several buckets, mixed dtypes
  LocalRendezvous rv(2, co);
  std::vector<std::string> errors(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      auto fail = [&](const std::string& m) { errors[r] = m; };
      auto c = rv.join(r, c10::Device(c10::kCPU));
      if (!c.is_ok()) return fail(c.status().message());
      auto& coll = **c;
      std::vector<at::Tensor> t{torch::full({3, 5}, float(r + 1)), torch::full({40}, double(2 * r)),
                                torch::full({2}, std::int64_t(4 * r))};
      if (auto st = coll.allreduce_mean(t); !st.is_ok()) return fail(st.message());
      if (!t[0].eq(1.5f).all().item<bool>() || !t[1].eq(1.0).all().item<bool>() ||
          !t[2].eq(2).all().item<bool>())
        return fail("allreduce_mean: wrong values");
      std::vector<at::Tensor> b{torch::full({7}, float(r + 10)), torch::full({100}, float(r))};
      if (auto st = coll.broadcast(b, 1); !st.is_ok()) return fail(st.message());
      if (!b[0].eq(11.f).all().item<bool>() || !b[1].eq(1.f).all().item<bool>())
        return fail("broadcast: wrong values");
      auto all = coll.all(r == 0), any = coll.any(r == 0);
      if (!all.is_ok() || !any.is_ok() || *all || !*any) return fail("all/any: wrong answer");
      if (auto st = coll.barrier(); !st.is_ok()) return fail(st.message());
    });
  }
  for (auto& t : threads) t.join();
  CHECK(errors[0] == "");
  CHECK(errors[1] == "");
}

TEST_CASE("a rank that leaves makes the other fail with a clear error, not hang (in process)") {
  CollectiveOptions co;
  co.timeout = std::chrono::seconds(10);
  LocalRendezvous rv(2, co);
  std::string error;
  double seconds = 0;
  std::thread survivor([&] {
    auto c = rv.join(0, c10::Device(c10::kCPU));
    if (!c.is_ok()) return void(error = "join: " + c.status().message());
    if (!(*c)->barrier().is_ok()) return void(error = "barrier failed");
    const auto t0 = std::chrono::steady_clock::now();
    auto r = (*c)->all(true);  // the other rank is gone
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    error = r.is_ok() ? "no error" : r.status().message();
  });
  std::thread leaver([&] {
    auto c = rv.join(1, c10::Device(c10::kCPU));
    if (c.is_ok()) (void)(*c)->barrier();
    // Leaves: its group (and sockets) go away.
  });
  leaver.join();
  survivor.join();
  INFO(error);
  CHECK(error.find("gloo all on rank 0 of 2 failed") != std::string::npos);
  CHECK(seconds < 15.0);
}

TEST_CASE("2 Gloo processes over loopback match 1 rank, with and without accumulation") {
  for (std::int64_t accumulate : {1, 2}) {
    CAPTURE(accumulate);
    segflow::testing::TempDir dir("segflow_parallel");
    const int port = segflow::testing::free_port();
    std::vector<segflow::testing::ChildProcess> workers;
    for (int r = 0; r < 2; ++r)
      workers.push_back(
          spawn_worker({{"MASTER_ADDR", "127.0.0.1"},
                        {"MASTER_PORT", std::to_string(port)},
                        {"WORLD_SIZE", "2"},
                        {"RANK", std::to_string(r)},
                        {"LOCAL_RANK", std::to_string(r)},
                        {"OMP_NUM_THREADS", "1"},
                        {"SEGFLOW_PARALLEL_ACCUMULATE", std::to_string(accumulate)},
                        {"SEGFLOW_PARALLEL_OUT", (dir / ("rank" + std::to_string(r))).string()}}));
    for (auto& w : workers) CHECK(w.wait_exit(120) == 0);
    const std::string r0 = segflow::testing::read_file(dir / "rank0"),
                      r1 = segflow::testing::read_file(dir / "rank1");
    INFO(r0.substr(0, 300));
    INFO(r1.substr(0, 300));
    REQUIRE(r0.rfind("ok ", 0) == 0);
    REQUIRE(r1.rfind("ok ", 0) == 0);
    CHECK(r0 == r1);
    // Compare with the reference, element by element.
    const auto ref = reference({.accumulate = accumulate}, c10::Device(c10::kCPU));
    std::istringstream in(r0.substr(3));
    double worst = 0;
    std::int64_t n = 0;
    for (auto& w : ref) {
      auto f = w.reshape({-1});
      for (std::int64_t i = 0; i < f.numel(); ++i, ++n) {
        double v = 0;
        in >> v;
        worst = std::max(worst, std::abs(v - f[i].item<double>()));
      }
    }
    CHECK(n > 100);
    CHECK(worst < 1e-5);
  }
}

TEST_CASE("a dead worker process makes the survivor fail within the timeout") {
  segflow::testing::TempDir dir("segflow_parallel");
  const int port = segflow::testing::free_port();
  std::vector<segflow::testing::ChildProcess> workers;
  const auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < 2; ++r)
    workers.push_back(
        spawn_worker({{"MASTER_ADDR", "127.0.0.1"},
                      {"MASTER_PORT", std::to_string(port)},
                      {"WORLD_SIZE", "2"},
                      {"RANK", std::to_string(r)},
                      {"OMP_NUM_THREADS", "1"},
                      {"SEGFLOW_PARALLEL_MODE", "die"},
                      {"SEGFLOW_PARALLEL_OUT", (dir / ("rank" + std::to_string(r))).string()}}));
  CHECK(workers[1].wait_exit(60) == 3);
  CHECK(workers[0].wait_exit(60) == 0);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::string r0 = segflow::testing::read_file(dir / "rank0");
  INFO(r0);
  CHECK(r0.rfind("error ", 0) == 0);
  CHECK(r0.find("on rank 0 of 2 failed") != std::string::npos);
  CHECK(seconds < 60.0);
}

TEST_CASE(
    "the launcher environment is read from torchrun's or SLURM's variables, and errors name the variable") {
  auto from = [](std::map<std::string, std::string> m) {
    return par::launch_env([m = std::move(m)](const char* k) -> const char* {
      auto it = m.find(k);
      return it == m.end() ? nullptr : it->second.c_str();
    });
  };
  REQUIRE_OK_AND_ASSIGN(auto e, from({{"MASTER_ADDR", "node1"},
                                      {"MASTER_PORT", "29500"},
                                      {"WORLD_SIZE", "4"},
                                      {"RANK", "3"},
                                      {"LOCAL_RANK", "1"}}));
  CHECK(e.launcher == "torchrun");
  CHECK(e.rank == 3);
  CHECK(e.world_size == 4);
  CHECK(e.local_rank == 1);
  CHECK(e.master_addr == "node1");
  CHECK(e.master_port == 29500);

  REQUIRE_OK_AND_ASSIGN(auto s, from({{"MASTER_ADDR", "n0"},
                                      {"MASTER_PORT", "1234"},
                                      {"SLURM_NTASKS", "8"},
                                      {"SLURM_PROCID", "5"},
                                      {"SLURM_LOCALID", "2"}}));
  CHECK(s.launcher == "slurm");
  CHECK(s.rank == 5);
  CHECK(s.world_size == 8);
  CHECK(s.local_rank == 2);

  auto msg = [&](std::map<std::string, std::string> m) { return from(std::move(m)).status().message(); };
  CHECK(msg({{"MASTER_PORT", "1"}, {"WORLD_SIZE", "2"}, {"RANK", "0"}}).find("MASTER_ADDR is not set") !=
        std::string::npos);
  CHECK(msg({{"MASTER_ADDR", "a"}, {"WORLD_SIZE", "2"}, {"RANK", "0"}}).find("MASTER_PORT is not set") !=
        std::string::npos);
  CHECK(msg({{"MASTER_ADDR", "a"}, {"MASTER_PORT", "99999"}, {"WORLD_SIZE", "2"}, {"RANK", "0"}})
            .find("MASTER_PORT: expected an integer in [1, 65535], got \"99999\"") != std::string::npos);
  CHECK(msg({{"MASTER_ADDR", "a"}, {"MASTER_PORT", "1"}, {"WORLD_SIZE", "two"}, {"RANK", "0"}})
            .find("WORLD_SIZE: expected an integer") != std::string::npos);
  CHECK(msg({{"MASTER_ADDR", "a"}, {"MASTER_PORT", "1"}, {"WORLD_SIZE", "2"}, {"RANK", "2"}})
            .find("RANK 2 is not below WORLD_SIZE 2") != std::string::npos);
  CHECK(msg({{"MASTER_ADDR", "a"}, {"MASTER_PORT", "1"}, {"WORLD_SIZE", "2"}})
            .find("RANK nor SLURM_PROCID is set") != std::string::npos);
}

TEST_CASE("a rendezvous at a port nobody serves fails within the timeout") {
  par::LaunchEnv env;
  env.master_addr = "127.0.0.1";
  env.master_port = segflow::testing::free_port();
  env.world_size = 2;
  env.rank = 1;  // a client: rank 0 never comes
  CollectiveOptions co;
  co.timeout = std::chrono::seconds(3);
  const auto t0 = std::chrono::steady_clock::now();
  auto c = par::connect(env, c10::Device(c10::kCPU), co);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  REQUIRE_FALSE(c.is_ok());
  INFO(c.status().message());
  CHECK(c.status().message().find("rendezvous at 127.0.0.1:") != std::string::npos);
  CHECK(seconds < 30.0);
}

TEST_CASE("NCCL ranks on CUDA devices match 1 rank (GPU only)") {
  if (!segflow::testing::cuda_or_skip()) return;
  // Two NCCL ranks cannot share one GPU: use as many devices as there are, up to 2. With
  // one GPU this still runs the whole NCCL path (broadcast, reducer, all-reduce) on 1 rank.
  const int world = std::min<int>(2, static_cast<int>(torch::cuda::device_count()));
  if (world < 2) MESSAGE("one CUDA device: NCCL runs with world size 1");
  const c10::Device d0(c10::kCUDA, 0);
  for (std::int64_t accumulate : {1, 2}) {
    CAPTURE(accumulate);
    StepPlan plan{.accumulate = accumulate};
    const auto ref = reference(plan, d0);
    std::vector<c10::Device> devices;
    for (int r = 0; r < world; ++r) devices.emplace_back(c10::kCUDA, r);
    const auto ranks = train_local(world, plan, devices);
    for (int r = 0; r < world; ++r) CHECK(max_diff(ranks[r], ref) < 1e-4);
  }
}

TEST_CASE(
    "the NCCL collective's allreduce_mean and broadcast give every rank the expected values on CUDA (GPU "
    "only)") {
  if (!segflow::testing::cuda_or_skip()) return;
  const int world = std::min<int>(2, static_cast<int>(torch::cuda::device_count()));
  LocalRendezvous rv(world, CollectiveOptions{.timeout = std::chrono::seconds(60), .bucket_bytes = 64});
  std::vector<std::string> errors(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      const c10::Device dev(c10::kCUDA, r);
      auto c = rv.join(r, dev);
      if (!c.is_ok()) return void(errors[r] = c.status().message());
      std::vector<at::Tensor> t{torch::full({3, 5}, float(r + 1), torch::TensorOptions().device(dev)),
                                torch::full({40}, float(2 * r), torch::TensorOptions().device(dev))};
      if (auto st = (*c)->allreduce_mean(t); !st.is_ok()) return void(errors[r] = st.message());
      const double want0 = world == 2 ? 1.5 : 1.0, want1 = world == 2 ? 1.0 : 0.0;
      if (!t[0].eq(want0).all().item<bool>() || !t[1].eq(want1).all().item<bool>())
        errors[r] = "wrong values";
      auto any = (*c)->any(r == 0);
      if (!any.is_ok() || !*any) errors[r] = "any: wrong answer";
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < world; ++r) CHECK(errors[r] == "");
}

namespace {
/// The tiny job (tests/job_yaml.hpp) without the flip, a 2-level UNet, 2 epochs of batch 1
/// with accumulation 2; runs in `dir`.
segflow::testing::JobYaml tiny_job(const std::filesystem::path& dir) {
  segflow::testing::JobYaml job;
  job.name = "tinydp";
  job.root = dir / "data";
  job.stages.pop_back();  // no rand_flip
  job.model = segflow::testing::unet3d(5, "channels: [4, 8], strides: [2], num_res_units: 1, norm: batch");
  job.epochs = 2;
  job.train =
      "batch_size: 1, accumulate: 2, device: cpu, val_interval: 1, checkpoint_interval: 1, loader: simple, "
      "threads: 1";
  job.runs_dir = dir / "runs";
  return job;
}

/// `segflow train job.yaml` in `dir` under the venv's torchrun with `nproc` processes on
/// loopback; its output (stdout and stderr).
segflow::testing::CommandResult run_torchrun(const std::filesystem::path& dir, int nproc) {
  namespace st = segflow::testing;
  const auto torchrun = std::filesystem::path(st::python()).parent_path() / "torchrun";
  REQUIRE_MESSAGE(std::filesystem::exists(torchrun), torchrun.string()
                                                         << " is missing: run scripts/setup.sh");
  return st::run_command("cd " + st::shell_quote(dir.string()) + " && OMP_NUM_THREADS=1 " +
                         st::shell_quote(torchrun.string()) + " --nproc-per-node " + std::to_string(nproc) +
                         " --master-addr 127.0.0.1 --master-port " + std::to_string(st::free_port()) +
                         " --no-python " + st::shell_quote(st::segflow_bin()) + " train job.yaml 2>&1");
}

class CountingObserver : public segflow::models::TrainObserver {
 public:
  explicit CountingObserver(std::int64_t stop_after = -1) : stop_after_(stop_after) {}
  void on_step(const segflow::models::StepInfo&) override { ++steps; }
  void on_validation(const segflow::models::ValidationInfo&) override { ++validations; }
  void on_early_stop(const segflow::models::EarlyStopInfo& i) override { early_stops.push_back(i); }
  bool should_stop() override { return stop_after_ >= 0 && steps >= stop_after_; }
  std::int64_t steps = 0, validations = 0;
  std::vector<segflow::models::EarlyStopInfo> early_stops;

 private:
  std::int64_t stop_after_;
};
}  // namespace

TEST_CASE("run_data_parallel trains a real job on 2 CPU ranks; only rank 0 writes the run folder") {
  segflow::testing::TempDir dir("segflow_dp_job");
  REQUIRE_OK_AND_ASSIGN(auto cfg, segflow::models::parse_job_config(tiny_job(dir.path()).yaml(), "job.yaml"));
  CountingObserver obs;
  segflow::actors::DataParallelOptions o;
  o.world_size = 2;
  o.timeout = std::chrono::seconds(120);
  REQUIRE_OK_AND_ASSIGN(auto run, segflow::actors::run_data_parallel(cfg, {}, obs, o));
  CHECK(std::filesystem::exists(run / "last.pt"));
  CHECK(std::filesystem::exists(run / "metrics.jsonl"));
  CHECK(std::filesystem::exists(run / "config.json"));
  CHECK(obs.steps > 0);
  CHECK(obs.validations == 2);
  // One run folder: the other rank wrote nowhere under runs_dir.
  std::int64_t runs = 0;
  for (auto& e : std::filesystem::directory_iterator(dir / "runs")) runs += e.is_directory();
  CHECK(runs == 1);
  REQUIRE_OK_AND_ASSIGN(auto t, segflow::models::load_for_inference(run / "last.pt", "cpu"));
  CHECK(t->state().epoch == 2);
}

TEST_CASE("a stop request on rank 0 stops every rank at the same step (no hang)") {
  segflow::testing::TempDir dir("segflow_dp_job");
  REQUIRE_OK_AND_ASSIGN(auto cfg, segflow::models::parse_job_config(tiny_job(dir.path()).yaml(), "job.yaml"));
  CountingObserver obs(1);
  segflow::actors::DataParallelOptions o;
  o.world_size = 2;
  o.timeout = std::chrono::seconds(60);
  REQUIRE_OK_AND_ASSIGN(auto run, segflow::actors::run_data_parallel(cfg, {}, obs, o));
  CHECK(obs.steps == 1);
  CHECK(std::filesystem::exists(run / "last.pt"));
}

TEST_CASE("early stopping on 2 ranks: the rank that validates stops every rank after the same epoch") {
  // Only rank 0 validates; the decision must reach rank 1 (a rank that trained on would
  // hang in its next all-reduce). SGD at lr 1e-30 with instance norm leaves the model as it
  // was, so the Dice cannot improve and patience 2 ends the run after its third validation.
  segflow::testing::TempDir dir("segflow_dp_early_stop");
  auto job = tiny_job(dir.path());
  job.model = segflow::testing::unet3d(5, "channels: [4, 8], strides: [2], num_res_units: 1, norm: instance");
  job.optimizer = "{name: sgd, lr: 1.0e-30}";
  job.epochs = 10;
  job.train += ", early_stopping: {patience: 2}";
  REQUIRE_OK_AND_ASSIGN(auto cfg, segflow::models::parse_job_config(job.yaml(), "job.yaml"));
  CountingObserver obs;
  segflow::actors::DataParallelOptions o;
  o.world_size = 2;
  o.timeout = std::chrono::seconds(120);
  REQUIRE_OK_AND_ASSIGN(auto run, segflow::actors::run_data_parallel(cfg, {}, obs, o));
  CHECK(obs.validations == 3);
  REQUIRE(obs.early_stops.size() == 1);
  CHECK(obs.early_stops[0].patience == 2);
  REQUIRE_OK_AND_ASSIGN(auto meta, segflow::models::read_checkpoint_meta(run / "last.pt"));
  CHECK(meta["epoch"] == 3);  // of 10
  CHECK(meta["early_stop"]["validations_without_improvement"] == 2);
  std::ifstream f(run / "metrics.jsonl");
  std::int64_t records = 0;
  for (std::string line; std::getline(f, line);) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.value("type", "") == "early_stop") {
      ++records;
      CHECK(j["epoch"] == 2);
    }
  }
  CHECK(records == 1);  // written once, by rank 0
}

TEST_CASE("torchrun starts 2 processes on a fresh data root; one makes the dataset, both train" *
          doctest::test_suite("serial")) {
  namespace st = segflow::testing;
  st::TempDir dir("segflow_torchrun");
  // A data root inside a folder that does not exist yet: the first use of the job.
  const auto root = dir.path() / "fresh";
  // Cases big enough that making them takes a while: both ranks are in ensure_dataset at once.
  auto job = tiny_job(root);
  job.synth = "{cases: 5, size: 96, format: nifti, seed: 9}";
  st::write_file(dir / "job.yaml", job.yaml());
  auto r = run_torchrun(dir.path(), 2);
  INFO(r.out.substr(r.out.size() > 4000 ? r.out.size() - 4000 : 0));
  REQUIRE(r.exit_code == 0);
  // One dataset, complete, and nothing half-made left behind.
  auto scan =
      segflow::pipeline::scan_dataset(root / "data", segflow::pipeline::ScanOptions{.validate = false});
  REQUIRE_OK(scan);
  REQUIRE(scan->cases.size() == 5);
  REQUIRE_OK_AND_ASSIGN(auto first, segflow::pipeline::read_image(scan->cases[0].images.at(0)));
  CHECK(first.size()[0] == 96);  // the big cases of the job, not the tiny job's 24^3
  CHECK(first.size()[1] == 96);
  CHECK_FALSE(std::filesystem::exists(root / "data.partial"));
  // One run folder, written by rank 0, holding the whole 2-epoch run.
  std::vector<std::filesystem::path> runs;
  for (auto& e : std::filesystem::directory_iterator(root / "runs")) runs.push_back(e.path());
  REQUIRE(runs.size() == 1);
  CHECK(std::filesystem::exists(runs[0] / "last.pt"));
  std::ifstream metrics(runs[0] / "metrics.jsonl");
  int epochs = 0;
  for (std::string line; std::getline(metrics, line);)
    if (nlohmann::json::parse(line).value("type", "") == "epoch") ++epochs;
  CHECK(epochs == 2);
}

TEST_CASE("torchrun with one process makes a process group of one rank and trains through it" *
          doctest::test_suite("serial")) {
  namespace st = segflow::testing;
  st::TempDir dir("segflow_torchrun_ws1");
  auto job = tiny_job(dir.path() / "root");
  st::write_file(dir / "job.yaml", job.yaml());
  auto r = run_torchrun(dir.path(), 1);
  INFO(r.out.substr(r.out.size() > 4000 ? r.out.size() - 4000 : 0));
  REQUIRE(r.exit_code == 0);
  // The distributed path ran (not the single-process trainer), with one rank.
  CHECK(st::contains(r.out, "distributed run"));
  CHECK(st::contains(r.out, ": 1 ranks"));
  std::vector<std::filesystem::path> runs;
  for (auto& e : std::filesystem::directory_iterator(dir.path() / "root" / "runs")) runs.push_back(e.path());
  REQUIRE(runs.size() == 1);
  CHECK(std::filesystem::exists(runs[0] / "last.pt"));
  std::ifstream metrics(runs[0] / "metrics.jsonl");
  int epochs = 0;
  for (std::string line; std::getline(metrics, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.value("type", "") != "epoch") continue;
    ++epochs;
    CHECK(std::isfinite(j.at("loss").get<double>()));
  }
  CHECK(epochs == 2);
}

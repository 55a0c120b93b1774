// The models suite's CUDA cases (run by scripts/gpu-check.sh; skipped with a message here,
// failed when SEGFLOW_REQUIRE_CUDA is set): bf16 and fp16 training with a forced overflow,
// checkpoints CPU <-> CUDA, sliding-window inference on CUDA against the CPU, SAM under
// autocast, and a training step that makes no host sync between log steps.
#include <doctest/doctest.h>
#include <torch/torch.h>

#include <c10/cuda/CUDAFunctions.h>

#include <cmath>

#include "models/training/optim.hpp"
#include "models/training/trainer.hpp"
#include "test_util.hpp"
#include "train_helpers.hpp"

using namespace segflow;
using namespace segflow::models;
using namespace segflow::testing::train;
using segflow::testing::cuda_or_skip;
using segflow::testing::TempDir;

namespace {

const c10::Device kCuda(c10::kCUDA, 0);
const c10::Device kCpu(c10::kCPU);
const char* kUnet3d =
    "{name: unet, spatial_dims: 3, in_channels: 1, out_channels: 3, channels: [8, 16, 32], strides: [2, 2], "
    "num_res_units: 2, norm: batch}";

Batch on(const Batch& b, const c10::Device& d) {
  Batch out = b;
  for (auto& [k, t] : out.tensors) t = t.to(d);
  return out;
}

std::vector<at::Tensor> all_tensors(Trainer& t) {
  std::vector<at::Tensor> out;
  for (const auto& p : t.model().module().parameters()) out.push_back(p);
  for (const auto& b : t.model().module().buffers()) out.push_back(b);
  return out;
}

void check_same_state(Trainer& a, Trainer& b) {
  const auto ta = all_tensors(a), tb = all_tensors(b);
  REQUIRE(ta.size() == tb.size());
  for (std::size_t i = 0; i < ta.size(); ++i) {
    CAPTURE(i);
    CHECK((tb[i].device() == b.device()));
    CHECK(torch::equal(ta[i].to(kCpu), tb[i].to(kCpu)));
  }
  const TensorMap sa = a.optimizer().state(), sb = b.optimizer().state();
  REQUIRE(sa.size() == sb.size());
  for (const auto& [k, v] : sb) {
    const auto& key = k;  // clang 14 cannot capture a structured binding
    CAPTURE(key);
    CHECK((v.device() == b.device()));
    CHECK(torch::equal(v.to(kCpu), sa.at(k).to(kCpu)));
  }
}

/// Under `amp` fp16, after `first` (an epoch of `steps` steps from a new trainer): the loss
/// scale starts at 2^16 (GradScaler's default), so the first steps may overflow and be skipped,
/// each halving the scale; then the skips stop and the scale settles (it grows again only after
/// growth_interval good steps). Trains 4 more steps to show it; returns their losses (none
/// under another amp, where no step may be skipped).
std::vector<double> check_scale_settles(const char* amp, Trainer& t, const Batch& b, const EpochInfo& first,
                                        std::int64_t steps) {
  if (std::string(amp) != "fp16") {
    CHECK(first.skipped_steps == 0);
    return {};
  }
  CHECK(first.skipped_steps < steps);
  const double settled = t.scaler().scale_value();
  CHECK(settled == std::ldexp(65536.0, -static_cast<int>(first.skipped_steps)));
  EpochInfo more;
  auto losses = train_steps(t, b, 4, &more);
  CHECK(more.skipped_steps == 0);
  CHECK(t.scaler().scale_value() == settled);
  return losses;
}

}  // namespace

TEST_CASE("CUDA: bf16 and fp16 training steps run, and a forced fp16 overflow skips the step and backs off") {
  if (!cuda_or_skip()) return;
  const Batch b = on(segmentation_batch({16, 16, 16}), kCuda);
  for (const char* amp : {"bf16", "fp16"}) {
    CAPTURE(amp);
    REQUIRE_OK_AND_ASSIGN(
        auto t, Trainer::create(
                    job(kUnet3d, kDiceCe, amp, "{name: sgd, lr: 0.05, momentum: 0.9}", 1, "cuda:0"), kCuda));
    EpochInfo ep;
    auto losses = train_steps(*t, b, 6, &ep);
    for (double l : losses) CHECK(std::isfinite(l));
    const auto later = check_scale_settles(amp, *t, b, ep, 6);
    losses.insert(losses.end(), later.begin(), later.end());
    CHECK(losses.back() < losses.front());
    for (const auto& p : t->parameters()) CHECK(p.is_cuda());
  }
  // fp16: a scale of 2^100 (finite in float32) overflows the fp16 gradients of the autocast
  // region for certain.
  REQUIRE_OK_AND_ASSIGN(
      auto t, Trainer::create(job(kUnet3d, kDiceCe, "fp16", "{name: adamw, lr: 0.001}", 1, "cuda:0"), kCuda));
  train_steps(*t, b, 1);
  CHECK(t->scaler().scale_value() == 65536.0);
  t->scaler().load(std::ldexp(1.0, 100), 0, 0);
  std::vector<at::Tensor> before;
  for (const auto& p : t->parameters()) before.push_back(p.detach().clone());
  const TensorMap state_before = [&] {
    TensorMap m;
    for (const auto& [k, v] : t->optimizer().state()) m.emplace(k, v.clone());
    return m;
  }();
  EpochInfo ep;
  train_steps(*t, b, 1, &ep);
  CHECK(ep.skipped_steps == 1);
  CHECK(t->scaler().scale_value() == std::ldexp(1.0, 99));
  for (std::size_t i = 0; i < before.size(); ++i) CHECK(torch::equal(t->parameters()[i], before[i]));
  for (const auto& [k, v] : t->optimizer().state()) {
    const auto& key = k;  // clang 14 cannot capture a structured binding
    CAPTURE(key);
    CHECK(torch::equal(v, state_before.at(k)));
  }
  // From a scale that fits, training goes on and the scale grows back by itself only after
  // growth_interval good steps: here it stays.
  t->scaler().load(1024.0, 0, 1);
  EpochInfo more;
  auto losses = train_steps(*t, b, 5, &more);
  for (double l : losses) CHECK(std::isfinite(l));
  CHECK(more.skipped_steps == 0);
  CHECK(t->scaler().scale_value() == 1024.0);
  CHECK(t->scaler().growth_tracker_value() == 5);
  CHECK_FALSE(torch::equal(t->parameters()[0], before[0]));
}

TEST_CASE("CUDA: a checkpoint goes CPU -> CUDA -> CPU with equal weights, optimizer state and loss scale") {
  if (!cuda_or_skip()) return;
  TempDir dir("cuda_ckpt");
  const std::string opt = "{name: adamw, lr: 0.01}";
  REQUIRE_OK_AND_ASSIGN(auto cpu, Trainer::create(job(kUnet3d, kDiceCe, "none", opt, 1, "cpu"), kCpu));
  train_steps(*cpu, segmentation_batch({16, 16, 16}), 2);
  REQUIRE_OK(cpu->save_checkpoint(dir / "cpu.pt"));

  auto cfg = job(kUnet3d, kDiceCe, "fp16", opt, 1, "cuda:0");
  cfg.train.channels_last = true;
  REQUIRE_OK_AND_ASSIGN(auto gpu, Trainer::create(cfg, kCuda));
  auto st = gpu->load_checkpoint(dir / "cpu.pt");
  REQUIRE_OK(st);
  check_same_state(*cpu, *gpu);
  for (const auto& p : gpu->parameters())
    if (p.dim() == 5) CHECK(p.is_contiguous(at::MemoryFormat::ChannelsLast3d));
  train_steps(*gpu, on(segmentation_batch({16, 16, 16}), kCuda), 2);
  gpu->scaler().load(1024.0, 5, 1);
  REQUIRE_OK(gpu->save_checkpoint(dir / "cuda.pt"));

  REQUIRE_OK_AND_ASSIGN(auto back, Trainer::create(job(kUnet3d, kDiceCe, "none", opt, 1, "cpu"), kCpu));
  st = back->load_checkpoint(dir / "cuda.pt");
  REQUIRE_OK(st);
  check_same_state(*gpu, *back);
  CHECK(back->state().step == 4);
  CHECK(back->state().skipped_steps == 1);
  REQUIRE_OK_AND_ASSIGN(auto gpu2, Trainer::create(cfg, kCuda));
  REQUIRE_OK(gpu2->load_checkpoint(dir / "cuda.pt"));
  CHECK(gpu2->scaler().scale_value() == 1024.0);
  CHECK(gpu2->scaler().growth_tracker_value() == 5);
  // Inference from the CUDA checkpoint on a CPU-only code path.
  REQUIRE_OK_AND_ASSIGN(auto inf, load_for_inference(dir / "cuda.pt", "cpu"));
  CHECK(inf->device().is_cpu());
}

TEST_CASE("CUDA: sliding-window inference on CUDA equals the CPU's within tolerance") {
  if (!cuda_or_skip()) return;
  TempDir dir("cuda_sw");
  auto cfg_cpu = job(kUnet3d, kDiceCe, "none", "{name: adam, lr: 0.01}", 1, "cpu");
  cfg_cpu.validation.roi_size = {16, 16, 16};
  cfg_cpu.validation.overlap = 0.5;
  cfg_cpu.validation.sw_batch_size = 3;
  REQUIRE_OK_AND_ASSIGN(auto cpu, Trainer::create(cfg_cpu, kCpu));
  train_steps(*cpu, segmentation_batch({16, 16, 16}), 3);
  REQUIRE_OK(cpu->save_checkpoint(dir / "w.pt"));
  auto cfg_gpu = cfg_cpu;
  cfg_gpu.train.device = "cuda:0";
  REQUIRE_OK_AND_ASSIGN(auto gpu, Trainer::create(cfg_gpu, kCuda));
  REQUIRE_OK(gpu->load_checkpoint(dir / "w.pt"));
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  at::Tensor volume = at::rand({1, 28, 30, 26}, gen, at::TensorOptions());
  at::Tensor a = cpu->predict(volume);
  auto compare = [&](double rel_tolerance, double min_agreement) {
    at::Tensor b = gpu->predict(volume);
    REQUIRE(b.is_cuda());
    b = b.to(kCpu);
    REQUIRE(a.sizes() == b.sizes());
    const double scale = a.abs().max().item<double>();
    const double diff = (a - b).abs().max().item<double>();
    const double tolerance = rel_tolerance * scale + 1e-5;
    // The argmax is compared only where the CPU's margin between its two largest logits
    // exceeds twice the tolerance: there no difference within the tolerance can flip it, while
    // near-ties (common after a few steps on noise) may flip under TF32.
    const at::Tensor top2 = std::get<0>(a.topk(2, 0));
    const at::Tensor decided = (top2[0] - top2[1]) > 2 * tolerance;
    const double n_decided = decided.sum().item<double>();
    const double agree =
        n_decided > 0 ? ((a.argmax(0) == b.argmax(0)) & decided).sum().item<double>() / n_decided : 1.0;
    INFO("max |logit| ", scale, ", max |CPU - CUDA| ", diff, ", argmax agreement ", agree, " over ",
         n_decided, " of ", decided.numel(), " voxels with a margin over ", 2 * tolerance);
    CHECK(diff <= tolerance);
    CHECK(agree >= min_agreement);
  };
  // As the trainer runs: TF32 ("high") matmuls and cuDNN convolutions, 10-bit mantissas.
  CHECK((at::globalContext().float32MatmulPrecision() == at::Float32MatmulPrecision::HIGH));
  compare(2e-2, 1.0);
  // Strict float32 on the GPU: only summation order may differ from the CPU.
  at::globalContext().setFloat32MatmulPrecision("highest");
  at::globalContext().setAllowTF32CuDNN(false);
  compare(1e-4, 1.0);
  at::globalContext().setFloat32MatmulPrecision("high");
  at::globalContext().setAllowTF32CuDNN(true);
}

TEST_CASE("CUDA: SAM trains under bf16 and fp16 autocast with a falling loss") {
  if (!cuda_or_skip()) return;
  for (const char* amp : {"bf16", "fp16"}) {
    CAPTURE(amp);
    auto cfg = job(
        "{name: sam, preset: tiny, img_size: 32, patch_size: 4, embed_dim: 32, spatial_dims: 2, in_channels: "
        "3, "
        "out_channels: 1}",
        "{name: dice_bce, sigmoid: true, to_onehot_y: false}", amp, "{name: adamw, lr: 0.002}", 1, "cuda:0");
    REQUIRE_OK_AND_ASSIGN(auto t, Trainer::create(cfg, kCuda));
    EpochInfo ep;
    const Batch b = on(sam_batch(32), kCuda);
    auto losses = train_steps(*t, b, 12, &ep);
    const auto later = check_scale_settles(amp, *t, b, ep, 12);
    losses.insert(losses.end(), later.begin(), later.end());
    for (double l : losses) CHECK(std::isfinite(l));
    const std::size_t n = losses.size();
    CHECK((losses[n - 2] + losses[n - 1]) / 2 < 0.9 * losses.front());
    for (const auto& p : t->parameters()) CHECK(torch::isfinite(p).all().item<bool>());
  }
}

namespace {
/// Turns CUDA's sync debug mode to "error" for the steps it watches and off again before
/// the epoch's closing read: any synchronising CUDA call (item(), a blocking copy to the
/// host, a stream or device synchronise) inside those steps throws.
struct NoSyncWatch : TrainObserver {
  std::int64_t last_step_in_epoch = 0;
  std::int64_t steps = 0;
  void on_step(const StepInfo& i) override {
    ++steps;
    if (i.step_in_epoch >= last_step_in_epoch)
      c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_DISABLED);
  }
};
}  // namespace

TEST_CASE("CUDA: training steps launch no host synchronisation between log steps") {
  if (!cuda_or_skip()) return;
  for (const char* amp : {"bf16", "fp16"}) {
    CAPTURE(amp);
    auto cfg =
        job(kUnet3d, kDiceCe, amp, "{name: sgd, lr: 0.05, momentum: 0.9}", /*log_every=*/1000, "cuda:0");
    cfg.train.grad_clip = 1.0;  // the clip stays on the device too
    REQUIRE_OK_AND_ASSIGN(auto t, Trainer::create(cfg, kCuda));
    const Batch b = on(segmentation_batch({16, 16, 16}), kCuda);
    train_steps(*t, b, 2);  // warm-up: cuDNN autotuning, allocator growth
    pipeline::StagedBatchSource src({b}, 5);
    NoSyncWatch watch;
    watch.last_step_in_epoch = 5;
    const auto reads = t->host_reads();
    c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_ERROR);
    auto ep = t->train_epoch(src, 5, watch);
    c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_DISABLED);
    REQUIRE_OK(ep);
    CHECK(watch.steps == 5);
    CHECK(t->host_reads() == reads + 1);  // the epoch's closing read only
    CHECK(std::isfinite(ep->loss));
  }
}

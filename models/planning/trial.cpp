#include "models/planning/trial.hpp"

#include <torch/torch.h>

#include <ATen/autocast_mode.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <fstream>

#include "models/nets/registry.hpp"
#include "models/training/device_memory.hpp"
#include "models/training/losses.hpp"

namespace segflow::models::planning {

namespace {

/// Autocast on `type` with `dtype` while alive (the previous state restored after).
class TrialAutocast {
 public:
  TrialAutocast(at::DeviceType type, const std::string& amp) : type_(type) {
    if (amp == "none") return;
    on_ = true;
    was_enabled_ = at::autocast::is_autocast_enabled(type);
    was_dtype_ = at::autocast::get_autocast_dtype(type);
    at::autocast::set_autocast_enabled(type, true);
    at::autocast::set_autocast_dtype(type, amp == "fp16" ? at::kHalf : at::kBFloat16);
    at::autocast::increment_nesting();
  }
  ~TrialAutocast() {
    if (!on_) return;
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_autocast_enabled(type_, was_enabled_);
    at::autocast::set_autocast_dtype(type_, was_dtype_);
  }
  TrialAutocast(const TrialAutocast&) = delete;
  TrialAutocast& operator=(const TrialAutocast&) = delete;

 private:
  at::DeviceType type_;
  bool on_ = false, was_enabled_ = false;
  at::ScalarType was_dtype_ = at::kBFloat16;
};

/// VmRSS of this process, MiB.
double resident_mb() {
  std::ifstream f("/proc/self/status");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("VmRSS:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  return 0.0;
}

/// Resets VmHWM to the current RSS (Linux clear_refs 5); false where it cannot.
bool reset_host_peak() {
  std::ofstream f("/proc/self/clear_refs");
  f << "5";
  return static_cast<bool>(f);
}

void synchronize(const c10::Device& d) {
  if (d.is_cuda()) torch::cuda::synchronize(d.index());
}

/// One SGD step of nnU-Net's loss on (x, y).
void train_step(ModelHandle& net, torch::optim::Optimizer& opt, const DeepSupervisionLoss& loss,
                const at::Tensor& x, const at::Tensor& y, const c10::Device& device, const std::string& amp) {
  opt.zero_grad();
  at::Tensor l;
  {
    TrialAutocast ac(device.type(), amp);
    l = loss(net.forward(x), y);
  }
  l.backward();
  opt.step();
}

}  // namespace

Result<std::string> resolve_trial_amp(const std::string& setting, const std::string& device) {
  const bool cuda = device.rfind("cuda", 0) == 0;
  if (setting == "auto") return std::string(cuda ? "bf16" : "none");
  if (setting == "none" || setting == "bf16") return setting;
  if (setting == "fp16") {
    if (!cuda) return invalid_argument("--amp: fp16 needs a CUDA device, got --device " + device);
    return setting;
  }
  return invalid_argument("--amp: expected none, bf16, fp16 or auto, got '" + setting + "'");
}

Result<TrialMeasurement> run_trial(const TrialSpec& spec) {
  SEGFLOW_ASSIGN_OR_RETURN(ModelOptions mo, parse_model_options(spec.model, "model"));
  TrialMeasurement m;
  try {
    const c10::Device device(spec.device);
    // CPU: the growth of the resident set from here (weights, optimizer state, activations).
    double before = 0;
    if (!device.is_cuda() && reset_host_peak()) before = resident_mb();
    SEGFLOW_ASSIGN_OR_RETURN(ModelHandle net, create_model(mo));
    net.module().to(device);
    net.module().train();
    torch::optim::SGD opt(net.trainable_parameters(),
                          torch::optim::SGDOptions(0.01).momentum(0.99).nesterov(true).weight_decay(3e-5));
    SEGFLOW_ASSIGN_OR_RETURN(LossFn base, make_loss(LossOptions{}));
    const DeepSupervisionLoss loss(base, /*zero_lowest=*/true);
    std::vector<std::int64_t> shape{spec.batch, spec.in_channels};
    shape.insert(shape.end(), spec.spatial.begin(), spec.spatial.end());
    const at::Tensor x = torch::randn(shape, torch::TensorOptions().device(device));
    shape[1] = 1;
    const at::Tensor y =
        torch::randint(0, spec.num_classes, shape, torch::TensorOptions().dtype(torch::kLong).device(device));
    synchronize(device);
    if (device.is_cuda())
      c10::cuda::CUDACachingAllocator::resetPeakStats(device.has_index() ? device.index() : 0);
    train_step(net, opt, loss, x, y, device, spec.amp);  // warm-up (allocator, cuDNN choices)
    std::vector<double> times;
    for (std::int64_t s = 0; s < std::max<std::int64_t>(1, spec.steps); ++s) {
      synchronize(device);
      const auto t0 = std::chrono::steady_clock::now();
      train_step(net, opt, loss, x, y, device, spec.amp);
      synchronize(device);
      times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(times.begin(), times.end());
    m.step_s = times[times.size() / 2];
    m.peak_mb =
        device.is_cuda() ? peak_device_memory_mb(device) : std::max(0.0, peak_host_memory_mb() - before);
  } catch (const c10::OutOfMemoryError&) {
    m.out_of_memory = true;
  } catch (const std::bad_alloc&) {
    m.out_of_memory = true;
  } catch (const std::exception& e) {
    return internal_error("trial step: " + first_line(e));
  }
  return m;
}

}  // namespace segflow::models::planning

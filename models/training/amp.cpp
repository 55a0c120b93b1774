#include "models/training/amp.hpp"

#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include <cpuid.h>

#if SEGFLOW_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif

namespace segflow::models {

namespace {

CpuBf16Support read_cpuid() {
  CpuBf16Support s;
#if defined(__x86_64__) || defined(__i386__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_max(0, nullptr) >= 7) {
    // Leaf 7 sub-leaf 0: EDX bit 22 AMX-BF16; sub-leaf 1: EAX bit 5 AVX512_BF16.
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) s.amx_bf16 = (d >> 22) & 1u;
    if (__get_cpuid_count(7, 1, &a, &b, &c, &d)) s.avx512_bf16 = (a >> 5) & 1u;
  }
#endif
  return s;
}

}  // namespace

const CpuBf16Support& cpu_bf16_support() {
  static const CpuBf16Support s = read_cpuid();
  return s;
}

Result<AmpChoice> resolve_amp(const std::string& setting, const c10::Device& device) {
  if (setting == "none" || setting == "bf16") return AmpChoice{setting, "train.amp " + setting};
  if (setting == "fp16") {
    if (!device.is_cuda())
      return invalid_config("train.amp: fp16 needs a CUDA device (use bf16 or auto on the CPU), got device " +
                            device.str());
    return AmpChoice{"fp16", "train.amp fp16"};
  }
  if (setting != "auto")
    return invalid_config("train.amp: expected none, bf16, fp16 or auto, got " + setting);
  if (device.is_cuda()) {
#if SEGFLOW_WITH_CUDA
    const auto* p = at::cuda::getDeviceProperties(device.has_index() ? device.index() : 0);
    const std::string cc = std::to_string(p->major) + "." + std::to_string(p->minor);
    if (p->major >= 8)
      return AmpChoice{"bf16", "auto: " + std::string(p->name) + " (compute " + cc + ") has bf16"};
    return AmpChoice{"fp16", "auto: " + std::string(p->name) + " (compute " + cc +
                                 ") has no bf16: fp16 with loss scaling"};
#else
    return AmpChoice{"fp16", "auto: CUDA device of unknown capability: fp16 with loss scaling"};
#endif
  }
  const CpuBf16Support& cpu = cpu_bf16_support();
  if (cpu.fast()) return AmpChoice{"bf16", "auto: CPU with AMX-BF16"};
  return AmpChoice{"none", cpu.avx512_bf16
                               ? "auto: CPU with AVX512-BF16 but no AMX: float32 (bf16 measured slower)"
                               : "auto: CPU without bf16 instructions: float32 (bf16 would be emulated)"};
}

AutocastGuard::AutocastGuard(const c10::Device& device, const std::string& amp) {
  if (amp == "none") return;
  TORCH_CHECK(amp == "bf16" || amp == "fp16", "amp: expected none, bf16 or fp16, got ", amp);
  TORCH_CHECK(amp != "fp16" || device.is_cuda(), "amp fp16 needs a CUDA device, got ", device.str());
  type_ = device.type();
  TORCH_CHECK(at::autocast::is_autocast_available(type_), "autocast is not available on ", device.str());
  prev_enabled_ = at::autocast::is_autocast_enabled(type_);
  prev_dtype_ = at::autocast::get_autocast_dtype(type_);
  at::autocast::set_autocast_enabled(type_, true);
  at::autocast::set_autocast_dtype(type_, amp == "fp16" ? at::kHalf : at::kBFloat16);
  at::autocast::increment_nesting();
  active_ = true;
}

AutocastGuard::~AutocastGuard() {
  if (!active_) return;
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  at::autocast::set_autocast_enabled(type_, prev_enabled_);
  at::autocast::set_autocast_dtype(type_, prev_dtype_);
}

}  // namespace segflow::models

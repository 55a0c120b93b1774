#pragma once
// Mixed precision: which one a job runs (train.amp, resolved per device) and the autocast
// scope that applies it.
//
//   train.amp   none | bf16 | fp16 | auto
//   auto        bf16 on a CUDA device that supports it (compute capability 8.0+) and on a
//               CPU with AMX-BF16 tiles (read from CPUID at run time), where oneDNN's bf16
//               convolutions beat float32 (quickstart UNet: 61 against 36 samples/s on a
//               2-core Xeon); fp16 with loss scaling on an older GPU; float32 on any other
//               CPU: without bf16 instructions it is emulated, and with AVX512-BF16 alone
//               (a 2-core AMD EPYC) a bf16 step still took 2 to 6 times as long as float32.
// The choice is logged and recorded in the run (metrics.jsonl "run" record).

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <string>

#include "messages/status.hpp"

namespace segflow::models {

/// What a CPU offers for bf16 arithmetic (CPUID).
struct CpuBf16Support {
  bool avx512_bf16 = false;  ///< AVX512_BF16 (Cooper Lake, Sapphire Rapids, Zen 4, ...)
  bool amx_bf16 = false;     ///< AMX-BF16 tiles (Sapphire Rapids and later)
  /// bf16 faster than float32 for segflow's convolutions: AMX-BF16 (see auto above).
  bool fast() const { return amx_bf16; }
};

/// This machine's CPU, read once.
const CpuBf16Support& cpu_bf16_support();

/// The mixed precision a job runs and why.
struct AmpChoice {
  std::string mode;    ///< none | bf16 | fp16
  std::string reason;  ///< e.g. "auto: CPU with AMX-BF16"
};

/// Resolves a train.amp setting for `device`: none/bf16/fp16 are kept (fp16 on a CPU is an
/// invalid_config error naming train.amp), auto is chosen as above; another text is an error.
Result<AmpChoice> resolve_amp(const std::string& setting, const c10::Device& device);

/// Autocast for the current thread and `device`'s type while it lives: `amp` "bf16" (CPU,
/// CUDA) or "fp16" (CUDA) turns it on with that dtype, "none" does nothing; the previous
/// state is restored and, leaving the outermost guard, the cast-weight cache is cleared.
/// Ops on autocast's lists run in the lower precision (convolutions, matmuls, PReLU, ...),
/// the rest in the dtype they get. Throws for another `amp` or fp16 on a CPU.
class AutocastGuard {
 public:
  AutocastGuard(const c10::Device& device, const std::string& amp);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  bool active_ = false;
  c10::DeviceType type_ = c10::DeviceType::CPU;
  bool prev_enabled_ = false;
  c10::ScalarType prev_dtype_ = c10::ScalarType::BFloat16;
};

}  // namespace segflow::models

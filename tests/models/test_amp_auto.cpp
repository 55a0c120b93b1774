// train.amp: auto: the mixed precision chosen for the device from what it has natively,
// checked against this machine's CPU flags read independently from /proc/cpuinfo.
#include <doctest/doctest.h>
#include <torch/torch.h>

#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "models/training/amp.hpp"
#include "models/training/job_config.hpp"
#include "models/training/trainer.hpp"
#include "test_util.hpp"
#include "train_helpers.hpp"

using namespace segflow;
using namespace segflow::models;

namespace {

/// The flags of the first processor in /proc/cpuinfo.
std::set<std::string> cpuinfo_flags() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    std::istringstream words(line.substr(line.find(':') + 1));
    std::set<std::string> out;
    for (std::string w; words >> w;) out.insert(w);
    return out;
  }
  return {};
}

}  // namespace

TEST_CASE("amp auto on the CPU is bf16 exactly when the CPU has AMX-BF16, float32 otherwise") {
  const auto flags = cpuinfo_flags();
  REQUIRE_MESSAGE(!flags.empty(), "/proc/cpuinfo has no flags line");
  const bool amx = flags.count("amx_bf16") > 0;
  CHECK(cpu_bf16_support().avx512_bf16 == (flags.count("avx512_bf16") > 0));
  CHECK(cpu_bf16_support().amx_bf16 == (flags.count("amx_bf16") > 0));
  REQUIRE_OK_AND_ASSIGN(AmpChoice c, resolve_amp("auto", c10::Device(c10::kCPU)));
  CHECK(c.mode == (amx ? "bf16" : "none"));
  CHECK(c.reason.rfind("auto: CPU", 0) == 0);
  MESSAGE("this CPU: " << c.reason);
}

TEST_CASE("explicit amp settings are kept, fp16 on a CPU and unknown settings are refused naming train.amp") {
  for (const char* s : {"none", "bf16"}) {
    REQUIRE_OK_AND_ASSIGN(AmpChoice c, resolve_amp(s, c10::Device(c10::kCPU)));
    CHECK(c.mode == s);
  }
  auto fp16 = resolve_amp("fp16", c10::Device(c10::kCPU));
  REQUIRE_FALSE(fp16.is_ok());
  CHECK(fp16.status().code() == ErrorCode::invalid_config);
  CHECK(fp16.status().message().find("train.amp: fp16 needs a CUDA device") != std::string::npos);
  auto odd = resolve_amp("fp8", c10::Device(c10::kCPU));
  REQUIRE_FALSE(odd.is_ok());
  CHECK(odd.status().message().find("expected none, bf16, fp16 or auto, got fp8") != std::string::npos);
  // CUDA: auto never becomes "none" there (bf16, or fp16 with loss scaling on an old GPU).
  if (torch::cuda::is_available()) {
    REQUIRE_OK_AND_ASSIGN(AmpChoice g, resolve_amp("auto", c10::Device(c10::kCUDA, 0)));
    CHECK((g.mode == "bf16" || g.mode == "fp16"));
  }
}

TEST_CASE("a trainer built with amp auto runs the resolved mode and says why; the config keeps auto") {
  using segflow::testing::train::job;
  using segflow::testing::train::kDiceCe;
  const std::string model = segflow::testing::unet3d(3, "channels: [4, 8], strides: [2], num_res_units: 0");
  auto cfg = job(model, kDiceCe, "auto");
  REQUIRE(cfg.train.amp == "auto");
  REQUIRE_OK_AND_ASSIGN(auto t, Trainer::create(cfg, c10::Device(c10::kCPU)));
  REQUIRE_OK_AND_ASSIGN(AmpChoice expect, resolve_amp("auto", c10::Device(c10::kCPU)));
  CHECK(t->config().train.amp == expect.mode);
  CHECK(t->amp_reason() == expect.reason);
  CHECK(t->config().resolved["train"]["amp"] == "auto");  // what a checkpoint records
  // fp16 asked for on the CPU: refused when the trainer is built, naming the key.
  auto bad = Trainer::create(job(model, kDiceCe, "fp16", "{name: adam, lr: 0.01}", 1, "auto"),
                             c10::Device(c10::kCPU));
  REQUIRE_FALSE(bad.is_ok());
  CHECK(bad.status().message().find("train.amp: fp16") != std::string::npos);
}

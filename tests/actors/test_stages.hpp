#pragma once
// Test stages and a tiny dataset for the data-path tests. A case is one small text file:
//   "ok N"        -> image (1, S, S, S) float32 filled from N, label (1, S, S, S) uint8
//   "bad"         -> the reader returns corrupt_data (a bad file)
//   "throw"       -> the reader throws std::runtime_error (a LibTorch-like failure)
//   "throw_int"   -> the reader throws an int (escapes every handler: the decoder dies)
// The source counts its reads (decodes) in a global atomic counter.

#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "pipeline/io/dataset.hpp"
#include "pipeline/pipeline_spec.hpp"
#include "pipeline/stage.hpp"
#include "pipeline/transforms/detail/tensor_util.hpp"

namespace segflow::testing {

/// Reads of TestSource since the start of the process.
inline std::atomic<int>& decode_count() {
  static std::atomic<int> n{0};
  return n;
}

/// "load"-like source stage that fabricates tensors from the case file's content.
class TestSource final : public pipeline::SourceStage {
 public:
  explicit TestSource(int size = 8, int sleep_ms = 0)
      : SourceStage("test_source", {{"size", size}, {"sleep_ms", sleep_ms}}, {"image", "label"}),
        size_(size),
        sleep_ms_(sleep_ms) {}
  bool deterministic() const override { return true; }
  Status apply_sample(Sample&, pipeline::Rng&) const override { return Status::ok(); }

  Result<Sample> read(const pipeline::CaseEntry& e) const override {
    ++decode_count();
    if (sleep_ms_ > 0) std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms_));
    std::ifstream f(e.images.at(0));
    if (!f) return not_found("test_source: cannot open " + e.images.at(0).string());
    std::string word;
    double n = 0;
    f >> word >> n;
    if (word == "bad") return corrupt_data("test_source: " + e.images[0].string() + ": bad content");
    if (word == "throw") throw std::runtime_error("test_source: simulated library failure");
    if (word == "throw_int") throw 42;
    Sample s;
    s.id = e.id;
    const std::int64_t S = size_;
    at::Tensor img = torch::arange(S * S * S, torch::kFloat32).reshape({1, S, S, S}) * 0.01 + n;
    s.tensors["image"] = img;
    s.tensors["label"] = (img.remainder(1.0) > 0.5).to(torch::kUInt8);
    s.geometry.spacing = {1.0, 1.0, 1.0 + 0.1 * n};
    return s;
  }

 private:
  int size_;
  int sleep_ms_;
};

/// Deterministic stage that sleeps (a slow decode) and scales the image.
class TestSlowScale final : public pipeline::MapStage {
 public:
  explicit TestSlowScale(int sleep_ms)
      : MapStage("test_slow_scale", {{"sleep_ms", sleep_ms}}, {"image"}), ms_(sleep_ms) {}
  bool deterministic() const override { return true; }
  Status apply_sample(Sample& s, pipeline::Rng&) const override {
    if (ms_ > 0) std::this_thread::sleep_for(std::chrono::milliseconds(ms_));
    s.at("image") = s.at("image") * 2.0;
    return Status::ok();
  }

 private:
  int ms_;
};

/// Random 1 -> 1 stage: random flip, random scale and tensor noise from the Rng.
class TestJitter final : public pipeline::MapStage {
 public:
  TestJitter() : MapStage("test_jitter", nlohmann::json::object(), {"image", "label"}) {}
  bool deterministic() const override { return false; }
  Status apply_sample(Sample& s, pipeline::Rng& rng) const override {
    if (rng.bernoulli(0.5)) {
      s.at("image") = s.at("image").flip({3});
      s.at("label") = s.at("label").flip({3});
    }
    const double scale = rng.uniform(0.5, 1.5);
    at::Generator g = pipeline::detail::make_generator(rng, s.at("image").device());
    at::Tensor noise = at::randn(s.at("image").sizes(), g, s.at("image").options());
    s.at("image") = s.at("image") * scale + 0.01 * noise;
    return Status::ok();
  }
};

/// Random 1 -> 2 stage: two random crops of half the size, ids "<id>#0", "<id>#1".
class TestCrops final : public pipeline::Stage {
 public:
  TestCrops() : Stage("test_crops", nlohmann::json::object(), {"image", "label"}) {}
  bool deterministic() const override { return false; }
  Status apply(std::vector<Sample>& samples, pipeline::Rng& rng) const override {
    std::vector<Sample> out;
    for (const Sample& s : samples) {
      const std::int64_t S = s.at("image").size(1), h = S / 2;
      for (int k = 0; k < 2; ++k) {
        Sample c;
        c.id = s.id + "#" + std::to_string(k);
        c.geometry = s.geometry;
        const std::int64_t z = rng.integer(0, S - h), y = rng.integer(0, S - h), x = rng.integer(0, S - h);
        for (const auto& key : keys())
          c.tensors[key] = s.at(key).slice(1, z, z + h).slice(2, y, y + h).slice(3, x, x + h).contiguous();
        out.push_back(std::move(c));
      }
    }
    samples = std::move(out);
    return Status::ok();
  }
};

/// Random stage that fails for one case id (an error) and throws for another.
class TestFailRandom final : public pipeline::MapStage {
 public:
  TestFailRandom(std::string error_id, std::string throw_id)
      : MapStage("test_fail_random", {{"error_id", error_id}, {"throw_id", throw_id}}, {"image"}),
        error_id_(std::move(error_id)),
        throw_id_(std::move(throw_id)) {}
  bool deterministic() const override { return false; }
  Status apply_sample(Sample& s, pipeline::Rng& rng) const override {
    (void)rng.next_u64();
    if (s.id == error_id_) return invalid_argument("test_fail_random: refusing sample '" + s.id + "'");
    if (s.id == throw_id_) throw std::runtime_error("test_fail_random: simulated kernel failure");
    return Status::ok();
  }

 private:
  std::string error_id_, throw_id_;
};

/// A pipeline from stages.
template <class... Stages>
pipeline::Pipeline make_pipeline(std::unique_ptr<Stages>... stages) {
  std::vector<std::unique_ptr<pipeline::Stage>> v;
  (v.push_back(std::move(stages)), ...);
  return pipeline::Pipeline(std::move(v));
}

/// Writes one case file per entry of `contents` under `dir` ("case_000.txt", ...).
inline std::vector<pipeline::CaseEntry> write_cases(const std::filesystem::path& dir,
                                                    const std::vector<std::string>& contents) {
  std::vector<pipeline::CaseEntry> cases;
  for (std::size_t i = 0; i < contents.size(); ++i) {
    char name[32];
    std::snprintf(name, sizeof name, "case_%03zu", i);
    const auto p = dir / (std::string(name) + ".txt");
    std::ofstream(p) << contents[i] << "\n";
    cases.push_back({name, {p}, std::nullopt});
  }
  return cases;
}

/// n good cases "ok 0", "ok 1", ...
inline std::vector<std::string> good_contents(int n) {
  std::vector<std::string> v;
  for (int i = 0; i < n; ++i) v.push_back("ok " + std::to_string(i));
  return v;
}

}  // namespace segflow::testing

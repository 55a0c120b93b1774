#pragma once
// The stage interface of segflow's data pipeline, and the random number source it draws
// from. A stage is a thin wrapper (name, options, keys) around a free tensor function in
// pipeline/transforms/. Stages are built once per job by a StageRegistry factory and are
// then shared, read-only, by every decode and augment thread.
//
// Everything in this header is inline on purpose: plugins (pipeline/plugin.hpp) derive from
// these classes without linking segflow's static libraries.

#include <nlohmann/json.hpp>

#include <c10/core/Device.h>

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "messages/sample.hpp"
#include "messages/status.hpp"
#include "pipeline/fwd.hpp"

namespace segflow::pipeline {

/// splitmix64 finaliser: a bijective 64-bit mix used to derive seeds.
inline std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/// Mixes several numbers into one seed; order matters ({1, 2} != {2, 1}).
inline std::uint64_t mix_seed(std::initializer_list<std::uint64_t> parts) {
  std::uint64_t h = 0x6A09E667F3BCC908ull;
  for (std::uint64_t p : parts) h = splitmix64(h ^ splitmix64(p));
  return h;
}

/// A reproducible stream of random numbers for one sample.
///
/// Seeding: the augmenter makes one Rng per sample with
/// `Rng::for_sample(job_seed, rank, epoch, sample_index)`, so what a random stage draws for
/// a sample depends only on those four numbers: not on the thread that runs it, nor on the
/// order in which samples are processed, nor on other samples. Stages draw from it in a
/// fixed order (stage by stage, sample by sample within a stage), so a pipeline run twice
/// with the same seeds gives the same outputs. Tensor draws (noise) use a torch generator
/// seeded from this stream (see transforms/detail/tensor_util.hpp).
///
/// The engine is std::mt19937_64 (its output is fixed by the C++ standard) and the
/// distributions are implemented here, not with <random>'s (whose output varies between
/// standard libraries). Not thread-safe: one Rng belongs to one sample at a time.
class Rng {
 public:
  /// A stream seeded with `seed` (any value; 0 is fine).
  explicit Rng(std::uint64_t seed = 0) : seed_(seed), engine_(splitmix64(seed)) {}

  /// The stream of one sample: seeded from (job seed, rank, epoch, sample index).
  static Rng for_sample(std::uint64_t job_seed, std::uint64_t rank, std::uint64_t epoch,
                        std::uint64_t sample_index) {
    return Rng(mix_seed({job_seed, rank, epoch, sample_index}));
  }

  /// The seed this stream was made from.
  std::uint64_t seed() const { return seed_; }
  /// 64 random bits.
  std::uint64_t next_u64() { return engine_(); }
  /// Uniform in [0, 1), 53 bits.
  double uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }
  /// Uniform in [lo, hi); exactly lo when lo == hi.
  double uniform(double lo, double hi) { return lo == hi ? lo : lo + (hi - lo) * uniform(); }
  /// Uniform integer in [lo, hi], both inclusive (lo <= hi). Unbiased (rejection).
  std::int64_t integer(std::int64_t lo, std::int64_t hi) {
    const std::uint64_t n = static_cast<std::uint64_t>(hi) - static_cast<std::uint64_t>(lo) + 1;
    if (n == 0) return static_cast<std::int64_t>(next_u64());  // the full 64-bit range
    const std::uint64_t limit = (0 - n) % n;                   // 2^64 mod n
    std::uint64_t r;
    do r = next_u64();
    while (r < limit);
    return lo + static_cast<std::int64_t>(r % n);
  }
  /// True with probability p (always one draw, whatever p is).
  bool bernoulli(double p) { return uniform() < p; }
  /// Normal(mean, stddev) by Box-Muller (two draws).
  double normal(double mean = 0.0, double stddev = 1.0) {
    const double u1 = 1.0 - uniform();  // (0, 1]
    const double u2 = uniform();
    return mean + stddev * std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }

 private:
  std::uint64_t seed_;
  std::mt19937_64 engine_;
};

/// A pipeline stage. Built by a StageRegistry factory from validated options, then used
/// read-only: `apply` is const and may run concurrently on several threads (one Rng each).
///
/// Rules every stage follows:
/// - It works on the tensors named by `keys()` (MONAI MapTransform style) and leaves the
///   other tensors of a sample alone, except that spatial stages drop the precomputed
///   "fg_indices"/"bg_indices" they would make stale.
/// - It never writes into its input tensors (they may be shared with the cache); it
///   replaces them with new tensors.
/// - It runs on the device its input tensors are on (pure torch ops), unless
///   `supports_device` says otherwise.
/// - A deterministic stage draws nothing from the Rng; its output depends on its input
///   and options only, so it may run once and be cached.
class Stage {
 public:
  /// `name` is the registry name; `options` the resolved options (defaults filled in).
  Stage(std::string name, nlohmann::json options, std::vector<std::string> keys)
      : name_(std::move(name)), options_(std::move(options)), keys_(std::move(keys)) {}
  virtual ~Stage() = default;
  Stage(const Stage&) = delete;
  Stage& operator=(const Stage&) = delete;

  /// Registry name ("resample").
  const std::string& name() const { return name_; }
  /// Resolved options as JSON, every option present (defaults included).
  const nlohmann::json& options() const { return options_; }
  /// Names of the tensors the stage reads and writes.
  const std::vector<std::string>& keys() const { return keys_; }

  /// True when the output depends on the input only (no Rng draws): cacheable.
  virtual bool deterministic() const = 0;
  /// True when the stage can run on tensors on `device`.
  virtual bool supports_device(const c10::Device& device) const { return true; }

  /// Transforms `samples` in place. A 1 -> 1 stage transforms each sample; a 1 -> N stage
  /// (random crops) replaces each sample by its N outputs, in order. Errors name the stage
  /// and the sample. May throw c10::Error; Pipeline turns that into a Status.
  virtual Status apply(std::vector<Sample>& samples, Rng& rng) const = 0;

 private:
  std::string name_;
  nlohmann::json options_;
  std::vector<std::string> keys_;
};

/// A stage that maps one sample to one sample. Implement `apply_sample`.
class MapStage : public Stage {
 public:
  using Stage::Stage;
  /// Transforms one sample in place.
  virtual Status apply_sample(Sample& sample, Rng& rng) const = 0;

  Status apply(std::vector<Sample>& samples, Rng& rng) const final {
    for (Sample& s : samples) SEGFLOW_RETURN_IF_ERROR(apply_sample(s, rng));
    return Status::ok();
  }
};

/// A stage that makes samples from a dataset case (the "load" stage). A pipeline may have
/// one, first; Pipeline::run_deterministic(const CaseEntry&) starts with it.
class SourceStage : public MapStage {
 public:
  using MapStage::MapStage;
  /// Reads a case into a new sample.
  virtual Result<Sample> read(const CaseEntry& entry) const = 0;
};

/// Runs a stage that must give exactly one sample for one (every MapStage does).
Result<Sample> apply_one(const Stage& stage, Sample sample, Rng& rng);

}  // namespace segflow::pipeline

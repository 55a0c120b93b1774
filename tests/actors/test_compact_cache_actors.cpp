// The compact cache in the actor pipeline: the same batches as SimpleLoader on the
// float32/int64 cache, its figures (bytes per cached voxel, decode time), and the CUDA
// cache (cache_device cuda) read by an augmenter on the GPU.
#include <doctest/doctest.h>
#include <torch/torch.h>
#include <yaml-cpp/yaml.h>

#include <caf/all.hpp>

#include <filesystem>

#include "actors/actor_batch_source.hpp"
#include "messages/caf_types.hpp"
#include "pipeline/io/dataset.hpp"
#include "pipeline/pipeline_spec.hpp"
#include "pipeline/simple_loader.hpp"
#include "pipeline/stage_registry.hpp"
#include "pipeline/synth.hpp"
#include "test_util.hpp"

using namespace segflow;
using segflow::testing::TempDir;

namespace {

pipeline::Pipeline window_crop_pipeline() {
  static const pipeline::StageRegistry reg = pipeline::builtin_registry();
  REQUIRE_OK_AND_ASSIGN(
      auto p,
      pipeline::build_pipeline(
          YAML::Load(
              "[{name: load}, {name: scale_intensity_range, options: {a_min: -200, a_max: 300, b_min: 0.0,"
              " b_max: 1.0, clip: true}}, {name: fg_bg_indices},"
              " {name: rand_crop_pos_neg, options: {spatial_size: [12, 12, 12], num_samples: 2}},"
              " {name: rand_flip, options: {prob: 0.5, spatial_axis: [0]}}]"),
          reg, "test.yaml"));
  return p;
}

std::vector<pipeline::CaseEntry> phantoms(const std::filesystem::path& root, int cases) {
  pipeline::SynthOptions so;
  so.cases = cases;
  so.size = 32;
  so.out = root;
  so.seed = 9;
  Status st = pipeline::synthesize_dataset(so);
  REQUIRE_OK(st);
  REQUIRE_OK_AND_ASSIGN(auto idx, pipeline::scan_dataset(root));
  return idx.cases;
}

std::vector<Batch> epoch(pipeline::BatchSource& src, std::int64_t e) {
  REQUIRE_OK(src.start_epoch(e));
  std::vector<Batch> out;
  while (true) {
    REQUIRE_OK_AND_ASSIGN(auto b, src.next());
    if (!b) break;
    out.push_back(std::move(*b));
  }
  CHECK(src.take_failures().empty());
  return out;
}

void check_same(const std::vector<Batch>& a, const std::vector<Batch>& b) {
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    CHECK(a[i].ids == b[i].ids);
    REQUIRE(a[i].tensors.size() == b[i].tensors.size());
    for (const auto& [k, t] : a[i].tensors) {
      const auto& key = k;  // clang 14 cannot capture a structured binding
      CAPTURE(key);
      const at::Tensor u = b[i].tensors.at(k).cpu();
      CHECK((t.scalar_type() == u.scalar_type()));
      REQUIRE((t.sizes() == u.sizes()));
      CHECK(torch::equal(t.cpu(), u));
    }
  }
}

}  // namespace

TEST_CASE(
    "the actor pipeline on the compact cache gives the batches of SimpleLoader on the float32/int64 cache") {
  TempDir dir("segflow_compact_actors");
  const auto cases = phantoms(dir / "data", 5);
  const pipeline::Pipeline p = window_crop_pipeline();
  pipeline::LoaderOptions o;
  o.cases = cases;
  o.pipeline = &p;
  o.batch_size = 3;
  o.seed = 4;
  o.decode_workers = 2;
  o.cache_dtype = "none";
  REQUIRE_OK_AND_ASSIGN(auto ref, pipeline::SimpleLoader::make(o));
  o.cache_dtype = "exact";
  REQUIRE_OK_AND_ASSIGN(auto act, actors::ActorBatchSource::make(o));
  for (std::int64_t e : {0, 1}) {
    CAPTURE(e);
    check_same(epoch(*ref, e), epoch(*act, e));
  }
  REQUIRE_OK_AND_ASSIGN(auto st, act->stats());
  CHECK(st.cache.entries == 5);
  CHECK(st.cache.hits == 5);  // the second epoch
  CHECK(st.cache.decode_seconds > 0);
  REQUIRE(st.cache.voxels > 0);
  const double bpv = static_cast<double>(st.cache.bytes) / static_cast<double>(st.cache.voxels);
  const auto rs = ref->stats();
  const double ref_bpv = static_cast<double>(rs.cache_bytes) / static_cast<double>(rs.cache_voxels);
  MESSAGE("bytes per cached voxel: actors (exact) " << bpv << ", simple (none) " << ref_bpv);
  CHECK(st.cache.voxels == rs.cache_voxels);
  CHECK(bpv <= 4.0);  // palette codes (501 window values) 2 + uint8 label 1 + packed sets
  CHECK(ref_bpv == doctest::Approx(13.0).epsilon(0.001));
}

TEST_CASE(
    "with cache_device cuda the actor pipeline serves crops from GPU memory equal to the host path (CUDA)") {
  if (!segflow::testing::cuda_or_skip()) return;
  TempDir dir("segflow_compact_actors");
  const auto cases = phantoms(dir / "data", 5);
  const pipeline::Pipeline p = window_crop_pipeline();
  pipeline::LoaderOptions o;
  o.cases = cases;
  o.pipeline = &p;
  o.batch_size = 3;
  o.seed = 4;
  o.decode_workers = 2;
  o.cache_dtype = "none";
  REQUIRE_OK_AND_ASSIGN(auto ref, pipeline::SimpleLoader::make(o));
  o.cache_dtype = "exact";
  o.device = "cuda:0";
  o.cache_device = "cuda";
  REQUIRE_OK_AND_ASSIGN(auto act, actors::ActorBatchSource::make(o));
  for (std::int64_t e : {0, 1, 2}) {
    CAPTURE(e);
    const auto b = epoch(*act, e);
    REQUIRE(!b.empty());
    CHECK(b.front().tensors.at("image").is_cuda());
    check_same(epoch(*ref, e), b);
  }
  REQUIRE_OK_AND_ASSIGN(auto st, act->stats());
  CHECK(st.cache.entries == 5);
  CHECK(st.cache.hits == 10);
  CHECK(st.cache.bytes <= o.cache_bytes);
}

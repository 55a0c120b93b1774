// nnU-Net's class-balanced foreground oversampling: fg_bg_indices per_class and
// rand_crop_pos_neg class_balanced.
#include "pipeline/cache/compact.hpp"
#include "pipeline/collate.hpp"
#include "pipeline/transforms/crop.hpp"
#include "stage_test_util.hpp"

using namespace segflow;
using namespace segflow::pipeline;
using namespace segflow::testing;
using torch::indexing::Slice;

namespace {

/// 20^3: class 1 a 6 x 10 x 10 block (600 voxels), class 7 a 3^3 cube, class 2 two voxels.
Sample three_classes() {
  auto label = torch::zeros({1, 20, 20, 20}, torch::kUInt8);
  label.index_put_({0, Slice(2, 8), Slice(2, 12), Slice(2, 12)}, 1);
  label.index_put_({0, Slice(12, 15), Slice(12, 15), Slice(12, 15)}, 7);
  label.index_put_({0, 17, 17, Slice(16, 18)}, 2);
  torch::manual_seed(3);
  return make_sample(torch::rand({1, 20, 20, 20}) + 1.0f, label, "three");
}

std::vector<Sample> crops_of(const Stage& st, Sample s, std::uint64_t seed) {
  Rng rng(seed);
  std::vector<Sample> v{std::move(s)};
  Status e = st.apply(v, rng);
  REQUIRE_OK(e);
  return v;
}

/// Label value at the centre voxel of each 1-voxel crop, counted over `seeds` runs.
std::map<int, int> centre_classes(const Stage& st, const Sample& s, int seeds) {
  std::map<int, int> n;
  for (int seed = 0; seed < seeds; ++seed)
    for (const Sample& c : crops_of(st, s, seed)) ++n[c.at("label").flatten()[0].item<int>()];
  return n;
}

at::Tensor voxels_of(const Sample& s, int value) {
  return s.at("label").flatten().eq(value).nonzero().flatten();
}

}  // namespace

TEST_CASE("fg_bg_indices per_class stores the voxels of each label value present") {
  Sample s = three_classes();
  Sample out = run1(*make_stage("fg_bg_indices", {{"per_class", true}}), s);
  for (int v : {1, 2, 7}) {
    INFO(v);
    REQUIRE(out.has("fg_indices_" + std::to_string(v)));
    CHECK(torch::equal(out.at("fg_indices_" + std::to_string(v)), voxels_of(s, v)));
  }
  CHECK_FALSE(out.has("fg_indices_3"));
  CHECK(out.at("fg_indices").numel() == 600 + 27 + 2);  // the union is still there
  // max_per_class thins each list (even stride); a smaller class keeps all its voxels.
  Sample capped = run1(*make_stage("fg_bg_indices", {{"per_class", true}, {"max_per_class", 5}}), s);
  CHECK(capped.at("fg_indices_1").numel() == 5);
  CHECK(capped.at("fg_indices_2").numel() == 2);
  // With format packed the per-class lists stay int64 lists (the cache compacts them).
  Sample packed = run1(*make_stage("fg_bg_indices", {{"per_class", true}, {"format", "packed"}}), s);
  CHECK(is_packed_index_set(packed, "fg_indices"));
  CHECK(torch::equal(packed.at("fg_indices_7"), voxels_of(s, 7)));
  // Running it again without per_class removes the lists it made before; spatial stages drop them.
  CHECK_FALSE(run1(*make_stage("fg_bg_indices"), out).has("fg_indices_1"));
  Sample flipped = run1(*make_stage("rand_flip", {{"prob", 1.0}}), out);
  for (const auto& [k, t] : flipped.tensors) CHECK_FALSE(is_crop_index_key(k));
}

TEST_CASE("per-class index keys are recognised, host-resident and left out of batches") {
  CHECK(class_of_indices_key("fg_indices_12") == std::optional<std::int64_t>(12));
  for (const char* k :
       {"fg_indices", "fg_indices_", "fg_indices_x", "fg_indices_-1", "fg_indices_+1", "fg_indices_1a"})
    CHECK_FALSE(class_of_indices_key(k).has_value());
  CHECK(is_crop_index_key("fg_indices_3"));
  CHECK(is_crop_index_key("bg_indices"));
  CHECK_FALSE(is_crop_index_key("label"));
  CHECK(host_resident_key("fg_indices_3"));
  // Two samples with lists of different lengths still collate (the lists are skipped).
  Sample a = make_sample(torch::zeros({1, 2, 2, 2}), {}, "a"),
         b = make_sample(torch::ones({1, 2, 2, 2}), {}, "b");
  a.tensors["fg_indices_1"] = torch::arange(3);
  b.tensors["fg_indices_1"] = torch::arange(5);
  REQUIRE_OK_AND_ASSIGN(Batch batch, collate({a, b}));
  CHECK(batch.tensors.count("fg_indices_1") == 0);
  CHECK(batch.tensors.count("image") == 1);
}

TEST_CASE("fg_bg_indices per_class refuses multi-channel and non-integer label maps, naming the sample") {
  Sample two = three_classes();
  two.at("label") = torch::cat({two.at("label"), two.at("label")}, 0);
  CHECK(run_error(*make_stage("fg_bg_indices", {{"per_class", true}}), two) ==
        "fg_bg_indices: sample 'three': 'label': per-class indices need a 1-channel label map (1, ...), got "
        "shape (2, 20, 20, 20) (option per_class)");
  Sample half = three_classes();
  half.at("label") = half.at("label").to(torch::kFloat32) * 0.5f;
  CHECK(
      run_error(*make_stage("fg_bg_indices", {{"per_class", true}}), half) ==
      "fg_bg_indices: sample 'three': 'label': per-class indices need integer label values, got non-integer "
      "ones in a Float label map (option per_class)");
  // The same rule when rand_crop_pos_neg computes them itself.
  auto st = make_stage("rand_crop_pos_neg", {{"class_balanced", true}, {"spatial_size", 4}});
  CHECK(contains(run_error(*st, two),
                 "rand_crop_pos_neg: sample 'three': 'label': per-class indices need a "
                 "1-channel label map"));
}

TEST_CASE("class_balanced crops centre positive crops on each present class equally often") {
  Sample s = run1(*make_stage("fg_bg_indices", {{"per_class", true}}), three_classes());
  auto balanced = make_stage(
      "rand_crop_pos_neg",
      {{"spatial_size", 1}, {"pos", 1}, {"neg", 0}, {"num_samples", 100}, {"class_balanced", true}});
  auto plain =
      make_stage("rand_crop_pos_neg", {{"spatial_size", 1}, {"pos", 1}, {"neg", 0}, {"num_samples", 100}});
  const int seeds = 15, n = 100 * seeds;
  auto b = centre_classes(*balanced, s, seeds);
  for (int v : {1, 2, 7}) CHECK(b[v] == doctest::Approx(n / 3.0).epsilon(0.15));  // sd ~18 of 500
  CHECK(b[0] == 0);
  auto p = centre_classes(*plain, s, seeds);  // by voxel count: class 2 is 2 of 629
  CHECK(p[1] > 20 * (p[2] + p[7]) / 2);
  CHECK(p[2] < 30);
  // nnU-Net's oversample_foreground_percent 0.33 is pos 1, neg 2.
  auto third = make_stage(
      "rand_crop_pos_neg",
      {{"spatial_size", 1}, {"pos", 1}, {"neg", 2}, {"num_samples", 100}, {"class_balanced", true}});
  auto t = centre_classes(*third, s, seeds);
  CHECK((n - t[0]) / double(n) == doctest::Approx(1.0 / 3).epsilon(0.1));  // sd 0.012
}

TEST_CASE("class_balanced crops are the same from stored, computed, compacted and packed indices") {
  Sample raw = three_classes();
  Sample stored = run1(*make_stage("fg_bg_indices", {{"per_class", true}}), raw);
  Sample union_only = run1(*make_stage("fg_bg_indices"), raw);  // computed in the crop
  REQUIRE_OK_AND_ASSIGN(Sample compact, compact_sample(stored, CacheDtype::exact));
  CHECK(is_compact(compact));
  Sample packed = run1(*make_stage("fg_bg_indices", {{"per_class", true}, {"format", "packed"}}), raw);
  REQUIRE_OK_AND_ASSIGN(Sample packed_compact, compact_sample(packed, CacheDtype::exact));
  auto st = make_stage(
      "rand_crop_pos_neg",
      {{"spatial_size", 5}, {"pos", 2}, {"neg", 1}, {"num_samples", 12}, {"class_balanced", true}});
  for (std::uint64_t seed : {1u, 2u, 3u}) {
    auto want = crops_of(*st, stored, seed);
    for (const Sample* in : {&raw, &union_only, &compact, &packed, &packed_compact}) {
      auto got = crops_of(*st, *in, seed);
      REQUIRE(got.size() == want.size());
      for (std::size_t i = 0; i < got.size(); ++i) {
        CHECK(torch::equal(got[i].at("image"), want[i].at("image")));
        CHECK(torch::equal(got[i].at("label"), want[i].at("label")));
        for (const auto& [k, t] : got[i].tensors) CHECK_FALSE(is_crop_index_key(k));
      }
    }
  }
  // Without class_balanced the draws are those of before (no class draw).
  auto off =
      make_stage("rand_crop_pos_neg", {{"spatial_size", 5}, {"pos", 2}, {"neg", 1}, {"num_samples", 12}});
  auto a = crops_of(*off, stored, 4), b = crops_of(*off, union_only, 4);
  for (std::size_t i = 0; i < a.size(); ++i) CHECK(torch::equal(a[i].at("image"), b[i].at("image")));
  // A case without foreground gives background crops, with or without stored lists.
  Sample empty = make_sample(torch::rand({1, 8, 8, 8}), torch::zeros({1, 8, 8, 8}, torch::kUInt8));
  CHECK(crops_of(*st, run1(*make_stage("fg_bg_indices", {{"per_class", true}}), empty), 1).size() == 12);
  CHECK(crops_of(*st, empty, 1).size() == 12);
}

TEST_CASE("class_balanced refuses per-class lists that do not fit the label grid") {
  Sample s = run1(*make_stage("fg_bg_indices", {{"per_class", true}}), three_classes());
  s.tensors["fg_indices_9"] = torch::tensor({7999 + 100}, torch::kLong);  // past the 20^3 grid
  auto st = make_stage("rand_crop_pos_neg", {{"class_balanced", true}, {"spatial_size", 4}});
  CHECK(run_error(*st, s) ==
        "rand_crop_pos_neg: sample 'three': fg_indices_9 does not fit the label grid (1, 20, 20, 20) (a "
        "spatial "
        "stage ran after fg_bg_indices?)");
}

TEST_CASE("class_balanced crops of CUDA tensors with host indices equal the CPU's") {
  if (!cuda_or_skip()) return;
  Sample s = run1(*make_stage("fg_bg_indices", {{"per_class", true}}), three_classes());
  REQUIRE_OK_AND_ASSIGN(Sample compact, compact_sample(s, CacheDtype::exact));
  Sample gpu = compact;
  for (auto& [k, t] : gpu.tensors)
    if (!host_resident_key(k)) t = t.to(torch::kCUDA);
  auto st =
      make_stage("rand_crop_pos_neg",
                 {{"spatial_size", 6}, {"pos", 1}, {"neg", 1}, {"num_samples", 8}, {"class_balanced", true}});
  auto a = crops_of(*st, s, 5), b = crops_of(*st, gpu, 5);
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    CHECK(b[i].at("image").is_cuda());
    CHECK(torch::equal(a[i].at("image"), b[i].at("image").cpu()));
    CHECK(torch::equal(a[i].at("label"), b[i].at("label").cpu()));
  }
}

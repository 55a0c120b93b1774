// Whole pipelines: load from files, the deterministic/random split, seeds, devices.
#include <thread>

#include "pipeline/collate.hpp"
#include "pipeline/io/dataset.hpp"
#include "pipeline/io/nifti.hpp"
#include "stage_test_util.hpp"
#include "test_util.hpp"

using namespace segflow;
using namespace segflow::pipeline;
using namespace segflow::testing;

namespace {
Pipeline build(const std::string& yaml) {
  REQUIRE_OK_AND_ASSIGN(auto p, build_pipeline(YAML::Load(yaml), registry(), "job.yaml"));
  return p;
}
const char* kTrain = R"(
- load
- {name: reorient, options: {axcodes: LPS}}
- {name: resample, options: {spacing: [2.0, 2.0, 2.0]}}
- {name: scale_intensity_range, options: {a_min: -100, a_max: 200}}
- {name: crop_foreground, options: {source_key: label, margin: 2}}
- fg_bg_indices
- {name: rand_crop_pos_neg, options: {spatial_size: [8, 8, 6], num_samples: 3}}
- {name: rand_flip, options: {prob: 0.5}}
- {name: rand_affine, options: {prob: 0.5, rotate_range: 0.2, scale_range: 0.1}}
- {name: rand_gaussian_noise, options: {prob: 0.5}}
)";
}  // namespace

TEST_CASE("the load stage reads a NIfTI case and the pipeline runs its deterministic and random parts") {
  TempDir dir("segflow_stages");
  Image img, lab;
  img.voxels = (torch::arange(20 * 24 * 28, torch::kFloat32).reshape({1, 20, 24, 28}).remainder(300) - 100);
  img.geometry.spacing = {1.0, 1.0, 1.0};
  img.geometry.origin = {-10, 5, 3};
  lab.voxels = torch::zeros({1, 20, 24, 28}, torch::kUInt8);
  lab.voxels.index_put_(
      {0, torch::indexing::Slice(6, 14), torch::indexing::Slice(8, 16), torch::indexing::Slice(9, 19)}, 2);
  lab.geometry = img.geometry;
  REQUIRE_OK(write_nifti(dir / "img.nii.gz", img));
  REQUIRE_OK(write_nifti(dir / "lab.nii.gz", lab));
  CaseEntry entry{"case_007", {dir / "img.nii.gz"}, dir / "lab.nii.gz"};

  Pipeline p = build(kTrain);
  CHECK(p.cache_boundary() == 6);
  REQUIRE_OK_AND_ASSIGN(auto cached, p.run_deterministic(entry));
  const Sample& c = cached;
  CHECK(c.id == "case_007");
  CHECK((c.at("image").scalar_type() == torch::kFloat32));
  CHECK((c.at("label").scalar_type() == torch::kUInt8));
  CHECK(c.geometry.spacing == std::array<double, 3>{2.0, 2.0, 2.0});
  // Resampled to 10x12x14 (z, y, x), then cropped to the label box (4x4x5) plus 2.
  CHECK(c.at("label").sizes() == torch::IntArrayRef({1, 8, 8, 9}));
  CHECK(c.at("image").min().item<float>() >= 0.0f);
  CHECK(c.at("image").max().item<float>() <= 1.0f);
  CHECK(c.has("fg_indices"));

  const auto before = c.at("image").clone();
  auto run = [&](std::uint64_t seed, std::uint64_t epoch) {
    std::vector<Sample> v{c};
    Rng rng = Rng::for_sample(seed, 0, epoch, 7);
    Status st = p.run_random(v, rng);
    REQUIRE_OK(st);
    return v;
  };
  auto a = run(1, 0), b = run(1, 0), d = run(2, 0), e = run(1, 1);
  REQUIRE(a.size() == 3);
  CHECK(torch::equal(c.at("image"), before));  // the cached sample is untouched
  bool differ_seed = false, differ_epoch = false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    CHECK(a[i].at("image").sizes() == torch::IntArrayRef({1, 6, 8, 8}));
    CHECK(torch::equal(a[i].at("image"), b[i].at("image")));
    CHECK(torch::equal(a[i].at("label"), b[i].at("label")));
    CHECK(subset(values_of(a[i].at("label")), {0, 2}));
    differ_seed = differ_seed || !torch::equal(a[i].at("image"), d[i].at("image"));
    differ_epoch = differ_epoch || !torch::equal(a[i].at("image"), e[i].at("image"));
  }
  CHECK(differ_seed);
  CHECK(differ_epoch);
  REQUIRE_OK_AND_ASSIGN(auto batch, collate(a));
  CHECK(batch.tensors.at("image").sizes() == torch::IntArrayRef({3, 1, 6, 8, 8}));
  CHECK(batch.tensors.count("fg_indices") == 0);
}

TEST_CASE("random stages give the same results whatever the thread order") {
  Pipeline p = build(kTrain);
  std::vector<Sample> cached;
  for (int i = 0; i < 4; ++i) {
    Sample s = blob_sample(12, 16, 20);
    s.id = "c0";
    s.id.back() = static_cast<char>('0' + i);
    REQUIRE_OK_AND_ASSIGN(auto r, p.run_deterministic(s));
    cached.push_back(std::move(r));
  }
  // Sample i always uses Rng::for_sample(seed, rank, epoch, i): run them in order, then
  // all at once on threads (in whatever order the scheduler picks), and compare.
  auto one = [&](int i, std::vector<Sample>& out) {
    out = {cached[i]};
    Rng rng = Rng::for_sample(9, 0, 0, i);
    return p.run_random(out, rng);
  };
  std::vector<std::vector<Sample>> sequential(4), threaded(4);
  for (int i = 0; i < 4; ++i) REQUIRE_OK(one(i, sequential[i]));
  std::vector<Status> st(4);
  std::vector<std::thread> threads;
  for (int i = 3; i >= 0; --i) threads.emplace_back([&, i] { st[i] = one(i, threaded[i]); });
  for (auto& t : threads) t.join();
  for (int i = 0; i < 4; ++i) {
    REQUIRE_OK(st[i]);
    REQUIRE(threaded[i].size() == sequential[i].size());
    for (std::size_t k = 0; k < sequential[i].size(); ++k) {
      CHECK(torch::equal(sequential[i][k].at("image"), threaded[i][k].at("image")));
      CHECK(torch::equal(sequential[i][k].at("label"), threaded[i][k].at("label")));
    }
  }
}

TEST_CASE("every shipped config's stage list builds with the built-in stages") {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(source_path("configs"))) {
    if (e.path().extension() != ".yaml") continue;
    YAML::Node doc = YAML::LoadFile(e.path().string());
    if (!doc["stages"]) continue;
    INFO(e.path().string());
    auto p = build_pipeline(doc["stages"], registry(), e.path().string());
    CHECK_OK(p);
    ++n;
  }
  CHECK(n > 0);
}

TEST_CASE("a stage error during a run names the stage index, the stage and the sample") {
  Pipeline p = build("[resample, rand_flip]");
  auto r = p.run_deterministic(make_sample(torch::zeros({1, 4, 4, 4}), {}, "lonely"));
  REQUIRE_FALSE(r.is_ok());
  CHECK(r.status().message() ==
        "stages[0] (resample): resample: sample 'lonely' has no 'label' (it has: image)");
  Pipeline load = build("[load]");
  auto l = load.run_deterministic(CaseEntry{"nothing", {"/nonexistent/img.nii.gz"}, std::nullopt});
  REQUIRE_FALSE(l.is_ok());
  CHECK(l.status().message().find("/nonexistent/img.nii.gz") != std::string::npos);
}

TEST_CASE("random transforms run on CUDA tensors when a GPU is present") {
  if (!segflow::testing::cuda_or_skip()) return;
  Pipeline p = build(kTrain);
  REQUIRE_OK_AND_ASSIGN(auto cached, p.run_deterministic(blob_sample(12, 16, 20)));
  Sample cpu = cached;
  Sample gpu = cpu;
  for (auto& [k, t] : gpu.tensors) t = t.to(torch::kCUDA);
  std::vector<Sample> vc{cpu}, vg{gpu};
  Rng r1(5), r2(5);
  REQUIRE_OK(p.run_random(vc, r1));
  Status st = p.run_random(vg, r2);
  REQUIRE_OK(st);
  REQUIRE(vc.size() == vg.size());
  for (std::size_t i = 0; i < vc.size(); ++i) {
    CHECK(vg[i].at("image").is_cuda());
    CHECK(vg[i].at("label").is_cuda());
    CHECK(vc[i].at("image").sizes() == vg[i].at("image").sizes());
    CHECK(subset(values_of(vg[i].at("label")), values_of(cpu.at("label"))));
  }
  // Every random stage accepts CUDA input.
  for (const char* name :
       {"rand_flip", "rand_rotate90", "rand_affine", "rand_shift_intensity", "rand_scale_intensity",
        "rand_gamma", "rand_gaussian_noise", "medsam_box", "rand_crop_pos_neg"}) {
    INFO(name);
    const std::string n = name;
    nlohmann::json opts = n == "rand_crop_pos_neg" ? nlohmann::json{{"spatial_size", 6}}
                          : n == "medsam_box"      ? nlohmann::json{{"image_size", 32}}
                          : n == "rand_affine"     ? nlohmann::json{{"prob", 1.0}, {"rotate_range", 0.3}}
                                                   : nlohmann::json{{"prob", 1.0}};
    auto st2 = make_stage(name, opts);
    std::vector<Sample> v{gpu};
    Rng rng(3);
    Status e = st2->apply(v, rng);
    REQUIRE_OK(e);
    CHECK(v.front().at("image").is_cuda());
  }
}

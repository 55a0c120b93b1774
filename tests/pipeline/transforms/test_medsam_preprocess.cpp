// MedSAM's preprocessing stages against a numpy / cc3d reference (tests/tools/
// medsam_preprocess_ref.py) computed on the same real volumes: TotalSegmentator's example CT
// and MR and its label map (scripts/fetch-test-data.sh).
#include <map>

#include "pipeline/io/npy.hpp"
#include "pipeline/transforms/medsam.hpp"
#include "stage_test_util.hpp"

using namespace segflow;
using namespace segflow::pipeline;
using namespace segflow::testing;

namespace {

/// The reference arrays by name, computed once per process.
const std::map<std::string, at::Tensor>& medsam_ref() {
  static const std::map<std::string, at::Tensor> ref = [] {
    static TempDir dir("medsam_ref");
    const auto ts = testdata_path("totalsegmentator");
    auto r = run_command(
        shell_quote(python()) + " " + shell_quote(source_path("tests/tools/medsam_preprocess_ref.py")) + " " +
        shell_quote(dir.path()) + " " + shell_quote(ts / "example_ct_sm.nii.gz") + " " +
        shell_quote(ts / "example_mr_sm.nii.gz") + " " + shell_quote(ts / "example_seg.nii.gz") + " 2>&1");
    INFO(r.out);
    REQUIRE(r.exit_code == 0);
    MESSAGE(r.out);
    std::map<std::string, at::Tensor> m;
    for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
      auto t = read_npy(e.path());
      REQUIRE(t.is_ok());
      m[e.path().stem().string()] = *t;
    }
    return m;
  }();
  return ref;
}

/// The message of options a stage refuses.
std::string medsam_option_error(const std::string& name, const nlohmann::json& options) {
  auto r = registry().make(name, options, "test");
  REQUIRE_FALSE(r.is_ok());
  return r.status().message();
}

double medsam_max_diff(const at::Tensor& a, const at::Tensor& b) {
  REQUIRE(a.sizes() == b.sizes());
  return (a.to(torch::kDouble) - b.to(torch::kDouble)).abs().max().item<double>();
}

}  // namespace

TEST_CASE(
    "medsam_normalize equals MedSAM's pre_CT_MR.py on the real CT (window) and MR (non-zero percentiles)") {
  const auto& ref = medsam_ref();
  Sample ct = run1(*make_stage("medsam_normalize"), make_sample(ref.at("ct")));
  CHECK((ct.at("image").scalar_type() == torch::kFloat32));
  CHECK(medsam_max_diff(ct.at("image"), ref.at("ct_norm")) == 0.0);
  Sample mr = run1(*make_stage("medsam_normalize", {{"modality", "mr"}}), make_sample(ref.at("mr")));
  const auto differ = (mr.at("image") != ref.at("mr_norm")).sum().item<int64_t>();
  MESSAGE("MR voxels that differ by one grey level (rounding at an integer): " << differ << " of "
                                                                               << mr.at("image").numel());
  CHECK(medsam_max_diff(mr.at("image"), ref.at("mr_norm")) <= 1.0);
  CHECK(differ * 10000 <= mr.at("image").numel());
  CHECK(mr.at("image").masked_select(ref.at("mr") == 0).abs().max().item<double>() == 0.0);
  // Without quantize the values are the unrounded ones.
  Sample raw = run1(*make_stage("medsam_normalize", {{"quantize", false}}), make_sample(ref.at("ct")));
  CHECK(medsam_max_diff(raw.at("image").floor(), ref.at("ct_norm")) == 0.0);
  CHECK(medsam_option_error("medsam_normalize", {{"modality", "pet"}}).find("modality") != std::string::npos);
  CHECK(medsam_option_error("medsam_normalize", {{"lower", 90}, {"upper", 10}}).find("upper") !=
        std::string::npos);
}

TEST_CASE("minmax_slices scales every slice to [0, 1] as MedSAM; repeat_channels makes three channels") {
  const auto& ref = medsam_ref();
  Sample s = run1(*make_stage("minmax_slices"), make_sample(ref.at("ct_norm")));
  CHECK(medsam_max_diff(s.at("image"), ref.at("minmax")) < 1e-6);
  Sample rgb = run1(*make_stage("repeat_channels"), s);
  REQUIRE(rgb.at("image").size(0) == 3);
  CHECK(torch::equal(rgb.at("image")[2], s.at("image")[0]));
  // A 3-channel slice is scaled over its channels together.
  Sample two_d = run1(*make_stage("minmax_slices"),
                      make_sample(torch::stack({ref.at("ct_norm")[0][3] * 0.5, ref.at("ct_norm")[0][3]})));
  CHECK(two_d.at("image").max().item<double>() == doctest::Approx(1.0));
  CHECK(two_d.at("image")[0].max().item<double>() == doctest::Approx(0.5));
  CHECK(run_error(*make_stage("repeat_channels"), make_sample(torch::zeros({2, 4, 4})))
            .find("1 or 3 channels") != std::string::npos);
}

TEST_CASE(
    "resize_longest_side maps image (bilinear), label (nearest) and box as LiteMedSAM, padded to S x S") {
  const auto& ref = medsam_ref();
  for (int size : {1024, 64}) {
    CAPTURE(size);
    Sample s = make_sample(ref.at("slice"), ref.at("slice_label"));
    s.tensors["box"] = ref.at("box");
    s.geometry.spacing = {1.5, 1.5, 3.0};
    Sample o = run1(*make_stage("resize_longest_side", {{"size", size}}), s);
    const auto sfx = std::to_string(size);
    CHECK(medsam_max_diff(o.at("image"), ref.at("resized_" + sfx)) < 1e-5);
    CHECK((o.at("label").scalar_type() == torch::kUInt8));
    CHECK(torch::equal(o.at("label"), ref.at("resized_label_" + sfx)));
    CHECK(medsam_max_diff(o.at("box"), ref.at("box_" + sfx)) < 1e-4);
    const auto [nh, nw] = longest_side_shape(ref.at("slice").size(1), ref.at("slice").size(2), size);
    CHECK(o.geometry.spacing[0] == doctest::Approx(1.5 * static_cast<double>(ref.at("slice").size(2)) / nw));
    CHECK(o.geometry.spacing[1] == doctest::Approx(1.5 * static_cast<double>(ref.at("slice").size(1)) / nh));
  }
  // A volume: every slice alike, z untouched.
  Sample v = run1(*make_stage("resize_longest_side", {{"size", 64}}),
                  make_sample(ref.at("minmax"), ref.at("label")));
  REQUIRE(v.at("image").sizes() == at::IntArrayRef({1, ref.at("minmax").size(1), 64, 64}));
  Sample one = run1(*make_stage("resize_longest_side", {{"size", 64}}),
                    make_sample(ref.at("minmax")[0][5].unsqueeze(0)));
  CHECK(medsam_max_diff(v.at("image")[0][5], one.at("image")[0]) < 1e-6);
  // Without pad: the resized shape.
  Sample np =
      run1(*make_stage("resize_longest_side", {{"size", 64}, {"pad", false}}), make_sample(ref.at("slice")));
  CHECK(np.at("image").size(2) == 64);
  CHECK(np.at("image").size(1) < 64);
}

TEST_CASE("remove_small_objects equals cc3d.dust in 3D then per slice (MedSAM) on the real label map") {
  const auto& ref = medsam_ref();
  Sample d = run1(*make_stage("remove_small_objects"), make_sample(ref.at("ct"), ref.at("label")));
  CHECK((d.at("label").scalar_type() == torch::kUInt8));
  CHECK(torch::equal(d.at("label"), ref.at("dust_default")));
  Sample s = run1(
      *make_stage("remove_small_objects",
                  {{"min_size_3d", 50}, {"connectivity_3d", 6}, {"min_size_2d", 10}, {"connectivity_2d", 4}}),
      make_sample(ref.at("ct"), ref.at("label")));
  CHECK(torch::equal(s.at("label"), ref.at("dust_small")));
  CHECK_FALSE(torch::equal(s.at("label"), ref.at("label")));
  Sample off = run1(*make_stage("remove_small_objects", {{"min_size_3d", 0}, {"min_size_2d", 0}}),
                    make_sample(ref.at("ct"), ref.at("label")));
  CHECK(torch::equal(off.at("label"), ref.at("label")));
  CHECK(medsam_option_error("remove_small_objects", {{"connectivity_2d", 6}}).find("connectivity_2d") !=
        std::string::npos);
  CHECK(run_error(*make_stage("remove_small_objects"), make_sample(ref.at("ct"), ref.at("ct")))
            .find("integer label map") != std::string::npos);
}

TEST_CASE("medsam_box with image_size 0 keeps the slice's size; resize_longest_side then maps its box") {
  const auto& ref = medsam_ref();
  Sample vol = make_sample(ref.at("minmax"), ref.at("label"));
  Sample b = run1(*make_stage("medsam_box", {{"image_size", 0}, {"bbox_shift", 0}, {"label", 5}}), vol, 3);
  REQUIRE(b.at("image").sizes() == at::IntArrayRef({3, ref.at("minmax").size(2), ref.at("minmax").size(3)}));
  Sample r = run1(*make_stage("resize_longest_side", {{"size", 256}}), b);
  REQUIRE(r.at("image").sizes() == at::IntArrayRef({3, 256, 256}));
  const auto m = r.at("label")[0] > 0;
  const auto cols = m.any(0).nonzero().flatten(), rows = m.any(1).nonzero().flatten();
  const auto box = r.at("box");
  // The mapped box holds the resized mask within a pixel of scaling.
  CHECK(box[0].item<double>() <= cols.min().item<double>() + 1.0);
  CHECK(box[2].item<double>() >= cols.max().item<double>() - 2.0);
  CHECK(box[1].item<double>() <= rows.min().item<double>() + 1.0);
  CHECK(box[3].item<double>() >= rows.max().item<double>() - 2.0);
  CHECK(medsam_option_error("medsam_box", {{"image_size", 8}}).find("image_size") != std::string::npos);
}

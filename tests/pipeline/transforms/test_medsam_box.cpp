// medsam_box: MedSAM-style box-prompted 2-D samples.
#include "pipeline/transforms/medsam.hpp"
#include "stage_test_util.hpp"

using namespace segflow;
using namespace segflow::pipeline;
using namespace segflow::testing;
using torch::indexing::Slice;

TEST_CASE("medsam box transform makes a 3-channel slice, a binary mask and a box that contains it") {
  auto label = torch::zeros({1, 6, 40, 50}, torch::kUInt8);
  label.index_put_({0, 2, Slice(10, 20), Slice(5, 15)}, 1);   // label 1 on slice 2
  label.index_put_({0, 4, Slice(25, 35), Slice(30, 45)}, 2);  // label 2 on slice 4
  Sample s = make_sample(torch::rand({1, 6, 40, 50}), label, "ct");
  const std::int64_t shift = 5;
  auto st = make_stage("medsam_box", {{"image_size", 64}, {"bbox_shift", shift}});
  std::set<std::string> ids;
  for (std::uint64_t seed = 0; seed < 40; ++seed) {
    Sample o = run1(*st, s, seed);
    ids.insert(o.id);
    REQUIRE(o.at("image").sizes() == torch::IntArrayRef({3, 64, 64}));
    REQUIRE(o.at("label").sizes() == torch::IntArrayRef({1, 64, 64}));
    REQUIRE(o.at("box").sizes() == torch::IntArrayRef({4}));
    CHECK((o.at("image").scalar_type() == torch::kFloat32));
    CHECK(torch::equal(o.at("image")[0], o.at("image")[1]));
    CHECK(subset(values_of(o.at("label")), {0, 1}));
    CHECK_FALSE(o.has("fg_indices"));
    // The mask's own bbox, and the box around it within the jitter.
    auto m = o.at("label")[0] > 0;
    auto rows = m.any(1).nonzero().flatten(), cols = m.any(0).nonzero().flatten();
    REQUIRE(rows.numel() > 0);
    const float mx0 = cols.min().item<float>(), mx1 = cols.max().item<float>();
    const float my0 = rows.min().item<float>(), my1 = rows.max().item<float>();
    auto b = o.at("box");
    const float x0 = b[0].item<float>(), y0 = b[1].item<float>(), x1 = b[2].item<float>(),
                y1 = b[3].item<float>();
    CHECK(x0 <= mx0);
    CHECK(y0 <= my0);
    CHECK(x1 >= mx1);
    CHECK(y1 >= my1);
    CHECK(mx0 - x0 <= shift);
    CHECK(my0 - y0 <= shift);
    CHECK(x1 - mx1 <= shift);
    CHECK(y1 - my1 <= shift);
    CHECK(x0 >= 0);
    CHECK(y0 >= 0);
    CHECK(x1 <= 63);
    CHECK(y1 <= 63);
    // Reproducible.
    Sample again = run1(*st, s, seed);
    CHECK(torch::equal(again.at("box"), o.at("box")));
    CHECK(again.id == o.id);
  }
  CHECK(ids == std::set<std::string>{"ct#z2", "ct#z4"});  // both slices/labels get picked
  // A configured label only picks its slice.
  auto two = make_stage("medsam_box", {{"image_size", 32}, {"label", 2}});
  for (std::uint64_t seed = 0; seed < 5; ++seed) CHECK(run1(*two, s, seed).id == "ct#z4");
  auto missing = make_stage("medsam_box", {{"label", 9}});
  CHECK(run_error(*missing, s) == "medsam_box: sample 'ct' has no voxel of label 9");
}

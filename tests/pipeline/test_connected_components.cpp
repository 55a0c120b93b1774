// Connected components (pipeline/connected_components.hpp) against scipy.ndimage.label:
// the same number of components and the same partition of the voxels, on random masks of
// several densities for every connectivity in 2D and 3D, and on TotalSegmentator's real
// 117-class label map; keep-largest and remove-small against the same labels' sizes; bad
// input refused with the field named.
#include <doctest/doctest.h>
#include <torch/torch.h>

#include <cstdint>
#include <fstream>
#include <map>
#include <sstream>

#include "pipeline/connected_components.hpp"
#include "pipeline/io/nifti.hpp"
#include "test_util.hpp"

namespace fs = std::filesystem;
using segflow::pipeline::label_components;

namespace cc_test {

/// Reads each "<in> <out> <k> <d0,d1[,d2]>" job: labels the uint8 mask in raw file `in`
/// with generate_binary_structure(rank, k) and writes the int32 labels to `out`.
constexpr const char* kScipyLabel = R"(
import sys, numpy as np
from scipy import ndimage
for job in sys.argv[1:]:
    src, dst, k, shape = job.split(" ")
    shape = tuple(int(s) for s in shape.split(","))
    m = np.fromfile(src, dtype=np.uint8).reshape(shape)
    lab, n = ndimage.label(m, structure=ndimage.generate_binary_structure(len(shape), int(k)))
    lab.astype(np.int32).tofile(dst)
    print(n)
)";

struct CcJob {
  at::Tensor mask;  // uint8
  int connectivity = 0;
};

/// scipy's generate_binary_structure(rank, k) k of a connectivity.
int scipy_rank_k(int connectivity) {
  switch (connectivity) {
    case 26:
      return 3;
    case 18:
    case 8:
      return 2;
    default:
      return 1;
  }
}

void write_raw(const fs::path& p, const at::Tensor& t) {
  at::Tensor c = t.contiguous();
  std::ofstream f(p, std::ios::binary);
  f.write(static_cast<const char*>(c.data_ptr()), static_cast<std::streamsize>(c.numel() * c.element_size()));
}

/// scipy's labels of every job, in one Python run.
std::vector<at::Tensor> scipy_labels(const fs::path& dir, const std::vector<CcJob>& jobs) {
  std::vector<std::string> args;
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    const auto in = dir / ("m" + std::to_string(i) + ".raw"), out = dir / ("l" + std::to_string(i) + ".raw");
    write_raw(in, jobs[i].mask);
    std::string shape;
    for (auto s : jobs[i].mask.sizes()) shape += (shape.empty() ? "" : ",") + std::to_string(s);
    args.push_back(in.string() + " " + out.string() + " " +
                   std::to_string(scipy_rank_k(jobs[i].connectivity)) + " " + shape);
  }
  segflow::testing::run_python(kScipyLabel, args);
  std::vector<at::Tensor> out;
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    at::Tensor l = torch::empty(jobs[i].mask.sizes(), torch::kInt);
    std::ifstream f(dir / ("l" + std::to_string(i) + ".raw"), std::ios::binary);
    f.read(static_cast<char*>(l.data_ptr()), static_cast<std::streamsize>(l.numel() * 4));
    REQUIRE(f.good());
    out.push_back(l);
  }
  return out;
}

/// True when `a` and `b` split the voxels the same way (a bijection between their labels,
/// background to background).
bool same_partition(const at::Tensor& a, const at::Tensor& b) {
  const auto* p = a.data_ptr<std::int32_t>();
  const auto* q = b.data_ptr<std::int32_t>();
  std::map<std::int32_t, std::int32_t> ab, ba;
  for (std::int64_t i = 0; i < a.numel(); ++i) {
    if ((p[i] == 0) != (q[i] == 0)) return false;
    if (p[i] == 0) continue;
    auto [x, fresh_x] = ab.emplace(p[i], q[i]);
    auto [y, fresh_y] = ba.emplace(q[i], p[i]);
    if (x->second != q[i] || y->second != p[i]) return false;
  }
  return true;
}

void check_against_scipy(const fs::path& dir, const std::vector<CcJob>& jobs) {
  const auto ref = scipy_labels(dir, jobs);
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    CAPTURE(i);
    CAPTURE(jobs[i].connectivity);
    const std::string shape = jobs[i].mask.sizes().vec().size() == 3 ? "3D" : "2D";
    CAPTURE(shape);
    REQUIRE_OK_AND_ASSIGN(auto c, label_components(jobs[i].mask, jobs[i].connectivity));
    CHECK(c.count() == ref[i].max().item<std::int32_t>());
    CHECK(same_partition(c.labels, ref[i]));
    CHECK(torch::equal(c.labels, ref[i]));  // scipy numbers components in raster order too
    std::int64_t total = 0;
    for (auto s : c.sizes) total += s;
    CHECK(total == jobs[i].mask.ne(0).sum().item<std::int64_t>());
  }
}

}  // namespace cc_test

using namespace cc_test;

TEST_CASE("connected components equal scipy.ndimage.label on random masks for every connectivity") {
  segflow::testing::TempDir dir("cc_random");
  torch::manual_seed(7);
  std::vector<CcJob> jobs;
  for (double density : {0.2, 0.35, 0.5, 0.7}) {
    at::Tensor m3 = (torch::rand({13, 37, 29}) < density).to(torch::kByte);
    at::Tensor m2 = (torch::rand({61, 43}) < density).to(torch::kByte);
    for (int c : {6, 18, 26}) jobs.push_back({m3, c});
    for (int c : {4, 8}) jobs.push_back({m2, c});
  }
  // Long runs along X (rows wider than a word) and blobs: smoothed noise thresholded.
  at::Tensor smooth = torch::avg_pool3d(torch::rand({1, 1, 24, 40, 90}), 5, 1, 2).squeeze();
  for (int c : {6, 18, 26}) jobs.push_back({(smooth > 0.5).to(torch::kByte), c});
  jobs.push_back({torch::zeros({4, 5, 6}, torch::kByte), 26});
  jobs.push_back({torch::ones({4, 5, 17}, torch::kByte), 6});
  check_against_scipy(dir.path(), jobs);
}

TEST_CASE("connected components equal scipy.ndimage.label on TotalSegmentator's real label map") {
  segflow::testing::TempDir dir("cc_real");
  REQUIRE_OK_AND_ASSIGN(
      auto seg,
      segflow::pipeline::read_nifti(segflow::testing::testdata_path("totalsegmentator/example_seg.nii.gz")));
  const at::Tensor labels = seg.voxels[0].to(torch::kLong);
  std::vector<CcJob> jobs;
  for (int c : {6, 18, 26}) jobs.push_back({labels.gt(0).to(torch::kByte), c});
  // The classes with the most voxels, one at a time, and the 2D slices through the middle.
  auto [counts, values] = torch::sort(torch::bincount(labels.flatten()), /*dim=*/0, /*descending=*/true);
  for (int i = 1; i <= 4; ++i)
    for (int c : {6, 26}) jobs.push_back({labels.eq(values[i].item<std::int64_t>()).to(torch::kByte), c});
  for (int c : {4, 8}) jobs.push_back({labels[labels.size(0) / 2].gt(0).to(torch::kByte), c});
  check_against_scipy(dir.path(), jobs);
}

TEST_CASE("keep-largest and remove-small keep the components scipy's sizes say") {
  torch::manual_seed(3);
  const at::Tensor m = (torch::rand({9, 21, 33}) < 0.3);
  REQUIRE_OK_AND_ASSIGN(auto c, label_components(m, 6));
  REQUIRE(c.count() > 10);
  const auto best = std::max_element(c.sizes.begin(), c.sizes.end()) - c.sizes.begin();
  REQUIRE_OK_AND_ASSIGN(auto largest, segflow::pipeline::keep_largest_component(m, 6));
  CHECK((largest.scalar_type() == torch::kBool));
  CHECK(torch::equal(largest, c.labels.eq(static_cast<int>(best + 1))));
  REQUIRE_OK_AND_ASSIGN(auto kept, segflow::pipeline::remove_small_components(m, 5, 6));
  at::Tensor expect = torch::zeros_like(m);
  for (std::size_t i = 0; i < c.sizes.size(); ++i)
    if (c.sizes[i] >= 5) expect |= c.labels.eq(static_cast<int>(i + 1));
  CHECK(torch::equal(kept, expect));
  REQUIRE_OK_AND_ASSIGN(auto all, segflow::pipeline::remove_small_components(m, 0, 6));
  CHECK(torch::equal(all, m));
  REQUIRE_OK_AND_ASSIGN(auto none,
                        segflow::pipeline::keep_largest_component(torch::zeros({3, 4}, torch::kByte), 8));
  CHECK(none.sum().item<std::int64_t>() == 0);
}

TEST_CASE("connected components refuse a bad rank, dtype, connectivity or size with the field named") {
  using segflow::testing::contains;
  auto a = label_components(torch::zeros({2, 3, 4, 5}, torch::kByte), 26);
  REQUIRE_FALSE(a.is_ok());
  CHECK(contains(a.status().message(), "mask: expected a (Y, X) or (Z, Y, X) tensor, got 4 dimensions"));
  auto b = label_components(torch::zeros({3, 4}, torch::kFloat), 8);
  REQUIRE_FALSE(b.is_ok());
  CHECK(contains(b.status().message(), "expected a bool or integer dtype, got Float"));
  auto c = label_components(torch::zeros({3, 4, 5}, torch::kByte), 8);
  REQUIRE_FALSE(c.is_ok());
  CHECK(contains(c.status().message(), "connectivity: expected 6, 18 or 26 for a 3D mask, got 8"));
  auto d = label_components(torch::zeros({3, 4}, torch::kByte), 6);
  REQUIRE_FALSE(d.is_ok());
  CHECK(contains(d.status().message(), "expected 4 or 8 for a 2D mask, got 6"));
  auto e = segflow::pipeline::remove_small_components(torch::zeros({3, 4}, torch::kByte), -1, 8);
  REQUIRE_FALSE(e.is_ok());
  CHECK(contains(e.status().message(), "min_voxels: expected >= 0, got -1"));
}

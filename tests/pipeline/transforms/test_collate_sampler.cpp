// collate and the epoch sampler.
#include "pipeline/collate.hpp"
#include "pipeline/sampler.hpp"
#include "stage_test_util.hpp"

using namespace segflow;
using namespace segflow::pipeline;
using namespace segflow::testing;

TEST_CASE("collate stacks every key and names the key and shapes when they differ") {
  std::vector<Sample> v;
  const char* ids[] = {"s0", "s1", "s2"};
  for (int i = 0; i < 3; ++i) {
    Sample s =
        make_sample(torch::full({1, 4, 5, 6}, float(i)), torch::full({1, 4, 5, 6}, i, torch::kUInt8), ids[i]);
    s.tensors["fg_indices"] = torch::arange(i + 1);
    v.push_back(s);
  }
  REQUIRE_OK_AND_ASSIGN(auto b, collate(v));
  CHECK(b.ids == std::vector<std::string>{"s0", "s1", "s2"});
  CHECK(b.tensors.size() == 2);
  CHECK(b.tensors.at("image").sizes() == torch::IntArrayRef({3, 1, 4, 5, 6}));
  CHECK(b.tensors.at("label")[2].max().item<int>() == 2);
  v[1].at("image") = torch::zeros({1, 4, 5, 7});
  auto e = collate(v);
  REQUIRE_FALSE(e.is_ok());
  CHECK(e.status().message() ==
        "collate: 'image' shapes differ: sample 's0' is (1, 4, 5, 6), sample 's1' is (1, 4, 5, 7)");
  v[1].at("image") = torch::zeros({1, 4, 5, 6}, torch::kDouble);
  CHECK(collate(v).status().message() ==
        "collate: 'image' dtypes differ: sample 's0' is Float, sample 's1' is Double");
  v[1].tensors.erase("image");
  CHECK(collate(v).status().message() == "collate: sample 's1' has no 'image' (sample 's0' has)");
  CHECK(collate({}).status().message() == "collate: no samples");
}

TEST_CASE("sampler shards are disjoint, cover the dataset and are deterministic per seed and epoch") {
  for (std::int64_t n : {1, 7, 12, 13}) {
    for (std::int64_t w : {1, 2, 3, 4}) {
      INFO("n=" << n << " w=" << w);
      std::vector<std::int64_t> all;
      std::int64_t count = -1;
      for (std::int64_t r = 0; r < w; ++r) {
        REQUIRE_OK_AND_ASSIGN(auto s, EpochSampler::make({n, r, w, 42}));
        auto idx = s.indices(3);
        if (count < 0) count = std::int64_t(idx.size());
        CHECK(std::int64_t(idx.size()) == count);  // same count on every rank
        CHECK(std::int64_t(idx.size()) == s.num_samples());
        all.insert(all.end(), idx.begin(), idx.end());
      }
      std::set<std::int64_t> seen(all.begin(), all.end());
      CHECK(std::int64_t(seen.size()) == n);  // covers the dataset
      CHECK(*seen.begin() == 0);
      CHECK(*seen.rbegin() == n - 1);
      // Only the padding repeats: n + pad in total, pad < w.
      CHECK(std::int64_t(all.size()) == (n + w - 1) / w * w);
      if (n % w == 0) CHECK(all.size() == seen.size());  // disjoint
    }
  }
  auto a = EpochSampler::make({20, 1, 2, 7}), b = EpochSampler::make({20, 1, 2, 7}),
       c = EpochSampler::make({20, 1, 2, 8});
  CHECK(a->indices(0) == b->indices(0));
  CHECK(a->indices(0) != a->indices(1));
  CHECK(a->indices(0) != c->indices(0));
  SamplerOptions ordered{10, 0, 3, 0, false, true};
  CHECK(EpochSampler::make(ordered)->indices(5) == std::vector<std::int64_t>{0, 3, 6});
  CHECK(EpochSampler::make({10, 3, 3, 0}).status().message() ==
        "sampler: rank: expected an integer in [0, 2], got 3");
  CHECK(EpochSampler::make({0, 0, 1, 0}).status().message() ==
        "sampler: dataset_size: expected an integer >= 1, got 0");
}

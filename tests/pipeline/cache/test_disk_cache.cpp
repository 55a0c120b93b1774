// The persistent disk cache (keys, file format, corruption) and the shared memory-cache rules.
#include <doctest/doctest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>

#include "pipeline/cache/disk_cache.hpp"
#include "pipeline/cache/sample_cache.hpp"
#include "pipeline/pipeline_spec.hpp"
#include "test_util.hpp"

using namespace segflow;
using namespace segflow::pipeline;
using segflow::testing::TempDir;

namespace {

Sample make_sample() {
  torch::manual_seed(3);
  Sample s;
  s.id = "case_007";
  s.tensors["image"] = torch::randn({1, 4, 5, 6});
  s.tensors["label"] = torch::randint(0, 5, {1, 4, 5, 6}).to(torch::kUInt8);
  s.tensors["box"] = torch::tensor({1.5f, 2.0f, 7.0f, 9.25f});
  s.tensors["fg_indices"] = torch::arange(17, torch::kLong);
  s.tensors["mask"] = torch::rand({3, 3}) > 0.5;
  s.tensors["half"] = torch::randn({2, 3}).to(torch::kHalf);
  s.tensors["empty"] = torch::zeros({0, 4});
  s.tensors["strided"] = torch::randn({6, 5}).t();  // not contiguous
  s.geometry.spacing = {0.7, 0.8, 2.5};
  s.geometry.origin = {-120.25, 33.0, 1.0 / 3.0};
  s.geometry.direction = {0, 1, 0, 1, 0, 0, 0, 0, -1};
  return s;
}

void check_equal(const Sample& a, const Sample& b) {
  CHECK(a.id == b.id);
  CHECK(a.geometry.spacing == b.geometry.spacing);
  CHECK(a.geometry.origin == b.geometry.origin);
  CHECK(a.geometry.direction == b.geometry.direction);
  REQUIRE(a.tensors.size() == b.tensors.size());
  for (const auto& [k, t] : a.tensors) {
    const auto& key = k;  // clang 14 cannot capture a structured binding
    CAPTURE(key);
    REQUIRE(b.tensors.count(k) == 1);
    const at::Tensor& u = b.tensors.at(k);
    CHECK((t.scalar_type() == u.scalar_type()));
    CHECK((t.sizes() == u.sizes()));
    CHECK(torch::equal(t, u));
  }
}

std::shared_ptr<DiskCache> open_cache(const std::filesystem::path& dir) {
  DiskCacheOptions o;
  o.dir = dir;
  REQUIRE_OK_AND_ASSIGN(auto c, DiskCache::open(o));
  return c;
}

std::vector<std::string> file_names_in(const std::filesystem::path& dir) {
  std::vector<std::string> v;
  for (const auto& e : std::filesystem::directory_iterator(dir)) v.push_back(e.path().filename().string());
  return v;
}

class Passthrough final : public MapStage {
 public:
  Passthrough(std::string name, bool det, double factor)
      : MapStage(std::move(name), {{"factor", factor}}, {"image"}), det_(det) {}
  bool deterministic() const override { return det_; }
  Status apply_sample(Sample&, Rng&) const override { return Status::ok(); }

 private:
  bool det_;
};

}  // namespace

TEST_CASE("a sample round-trips through the disk cache, its tensors mapped from the file") {
  TempDir dir("segflow_cache");
  const Sample s = make_sample();
  Sample loaded;
  {
    auto cache = open_cache(dir / "c");
    REQUIRE_OK(cache->store("k1", s));
    CHECK(file_names_in(dir / "c") == std::vector<std::string>{"k1.sfc"});  // no temporary left
    REQUIRE_OK_AND_ASSIGN(auto r, cache->load("k1"));
    REQUIRE(r.has_value());
    loaded = std::move(*r);
    CHECK(cache->stats().hits == 1);
    CHECK(cache->stats().writes == 1);
  }
  // The cache object is gone; the mapping lives as long as the tensors.
  check_equal(s, loaded);
  CHECK(loaded.at("strided").is_contiguous());
  // Writing into a loaded tensor stays private to this process: the file is unchanged.
  loaded.at("image").fill_(0);
  REQUIRE_OK_AND_ASSIGN(auto again, open_cache(dir / "c")->load("k1"));
  REQUIRE(again.has_value());
  check_equal(s, *again);
}

TEST_CASE("a missing entry is a miss and a dtype the cache cannot store is an error") {
  TempDir dir("segflow_cache");
  auto cache = open_cache(dir.path());
  REQUIRE_OK_AND_ASSIGN(auto r, cache->load("nothing"));
  CHECK(!r.has_value());
  CHECK(cache->stats().misses == 1);
  Sample s;
  s.id = "c";
  s.tensors["z"] = torch::zeros({2}, torch::kComplexFloat);
  const Status st = cache->store("c", s);
  CHECK(st.code() == ErrorCode::unsupported);
  CHECK(st.message().find("'z'") != std::string::npos);
  CHECK(file_names_in(dir.path()).empty());
}

TEST_CASE("a corrupt cache file is detected, removed and read as a miss") {
  TempDir dir("segflow_cache");
  auto cache = open_cache(dir.path());
  const Sample s = make_sample();
  const auto path = cache->path_of("k");
  auto expect_miss = [&](const std::string& what, const std::function<void(std::string&)>& damage) {
    CAPTURE(what);
    REQUIRE_OK(cache->store("k", s));
    std::string bytes = testing::read_file(path);
    damage(bytes);
    testing::write_file(path, bytes);
    const auto before = cache->stats().corrupt;
    REQUIRE_OK_AND_ASSIGN(auto r, cache->load("k"));
    CHECK(!r.has_value());
    CHECK(cache->stats().corrupt == before + 1);
    CHECK(!std::filesystem::exists(path));
  };
  expect_miss("truncated", [](std::string& b) { b.resize(b.size() - 10); });
  expect_miss("one byte longer", [](std::string& b) { b.push_back('x'); });
  expect_miss("bad magic", [](std::string& b) { b[0] = 'X'; });
  expect_miss("header byte flipped", [](std::string& b) { b[60] = static_cast<char>(b[60] ^ 0x20); });
  expect_miss("payload byte flipped",
              [](std::string& b) { b[b.size() - 70] = static_cast<char>(b[b.size() - 70] ^ 1); });
  expect_miss("shorter than a header", [](std::string& b) { b = "SFCACHE1"; });
  expect_miss("empty", [](std::string& b) { b.clear(); });
  // And a good file after all that still loads.
  REQUIRE_OK(cache->store("k", s));
  REQUIRE_OK_AND_ASSIGN(auto r, cache->load("k"));
  REQUIRE(r.has_value());
  check_equal(s, *r);
}

TEST_CASE("the key follows the files' contents and times, the case and the deterministic spec") {
  TempDir dir("segflow_cache");
  auto cache = open_cache(dir / "c");
  const auto img = dir / "img.bin";
  const auto lab = dir / "lab.bin";
  testing::write_file(img, std::string(3 << 20, 'a'));  // larger than head + tail
  testing::write_file(lab, "label");
  const CaseEntry e{"case_0", {img}, lab};
  const nlohmann::json spec = nlohmann::json::parse(R"([{"name": "load", "options": {}}])");
  auto key = [&](const CaseEntry& c, const nlohmann::json& sp) {
    REQUIRE_OK_AND_ASSIGN(auto k, cache->key_for(c, sp));
    CHECK(k.size() == 32);
    return k;
  };
  const std::string k0 = key(e, spec);
  CHECK(key(e, spec) == k0);
  CHECK(key(CaseEntry{"case_1", {img}, lab}, spec) != k0);
  CHECK(key(CaseEntry{"case_0", {img}, std::nullopt}, spec) != k0);
  CHECK(key(e, nlohmann::json::parse(R"([{"name": "load", "options": {"label_dtype": "int64"}}])")) != k0);

  // Same size, same modification time, other content at the head: detected.
  const auto mtime = std::filesystem::last_write_time(img);
  {
    std::string b(3 << 20, 'a');
    b[10] = 'b';
    testing::write_file(img, b);
    std::filesystem::last_write_time(img, mtime);
  }
  const std::string k1 = key(e, spec);
  CHECK(k1 != k0);
  // Only the modification time changes: detected.
  std::filesystem::last_write_time(img, mtime + std::chrono::seconds(5));
  CHECK(key(e, spec) != k1);

  // A folder (a DICOM series) hashes the files below it.
  std::filesystem::create_directories(dir / "series");
  testing::write_file(dir / "series" / "1.dcm", "one");
  const CaseEntry series{"s", {dir / "series"}, std::nullopt};
  const std::string ks = key(series, spec);
  testing::write_file(dir / "series" / "2.dcm", "two");
  CHECK(key(series, spec) != ks);

  auto missing = cache->key_for(CaseEntry{"m", {dir / "nope.nii"}, std::nullopt}, spec);
  CHECK(missing.status().code() == ErrorCode::not_found);
}

TEST_CASE("the deterministic spec holds the stages before the cache boundary only") {
  std::vector<std::unique_ptr<Stage>> v;
  v.push_back(std::make_unique<Passthrough>("a", true, 1.0));
  v.push_back(std::make_unique<Passthrough>("b", true, 2.0));
  v.push_back(std::make_unique<Passthrough>("r", false, 3.0));
  v.push_back(std::make_unique<Passthrough>("c", true, 4.0));
  const Pipeline p(std::move(v));
  const auto spec = deterministic_spec(p);
  REQUIRE(spec.size() == 2);
  CHECK(spec[0]["name"] == "a");
  CHECK(spec[1]["name"] == "b");
  CHECK(spec[1]["options"]["factor"] == 2.0);
}

TEST_CASE("the memory cache admits cacheable samples while the budget lasts and never more") {
  CHECK(cacheable_cases(10, 1.0) == 10);
  CHECK(cacheable_cases(10, 0.0) == 0);
  CHECK(cacheable_cases(10, 0.55) == 5);
  CHECK(cacheable_cases(3, 0.34) == 1);
  Sample s;
  s.id = "x";
  s.tensors["image"] = torch::zeros({1, 10, 10}, torch::kFloat32);  // 400 bytes
  CHECK(sample_bytes(s) == 400);
  MemoryCache m(3, 1000);
  CHECK(m.offer(0, s));
  CHECK(!m.offer(0, s));  // already there
  CHECK(!m.offer(3, s));  // not cacheable
  CHECK(m.offer(1, s));
  CHECK(!m.offer(2, s));  // 1200 > 1000
  CHECK(m.not_admitted() == 1);
  CHECK(m.bytes() == 800);
  CHECK(m.entries() == 2);
  REQUIRE(m.find(1) != nullptr);
  CHECK(m.find(2) == nullptr);
  // A view of a larger storage is compacted, so the counted bytes are the held bytes.
  Sample big;
  big.id = "v";
  big.tensors["image"] = torch::zeros({100, 100}).slice(0, 0, 1);
  MemoryCache m2(1, 1000);
  REQUIRE(m2.offer(0, big));
  CHECK(m2.find(0)->at("image").storage().nbytes() == 400);
}

TEST_CASE("the checksum hash is stable and sensitive to every byte") {
  const std::string a(1000, 'q');
  std::string b = a;
  b[999] = 'r';
  CHECK(hash_bytes(a.data(), a.size()) == hash_bytes(a.data(), a.size()));
  CHECK(hash_bytes(a.data(), a.size()) != hash_bytes(b.data(), b.size()));
  CHECK(hash_bytes(a.data(), a.size(), 1) != hash_bytes(a.data(), a.size(), 2));
  CHECK(hash_bytes(a.data(), 999) != hash_bytes(a.data(), 1000));
  CHECK(hash_bytes(nullptr, 0) == hash_bytes(nullptr, 0));
}

// The compact cache (pipeline/cache/compact.hpp): exact forms restore bit for bit, the
// loader gives the same crops as the float32/int64 path, float16/bfloat16 stay within the
// documented tolerance, bytes per cached voxel, the byte budget with spilling to disk, and
// a CUDA cache that crops without host syncs.
#include <doctest/doctest.h>
#include <torch/torch.h>
#include <yaml-cpp/yaml.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#if __has_include(<c10/cuda/CUDAFunctions.h>) && __has_include(<cuda_runtime_api.h>)
#include <c10/cuda/CUDAFunctions.h>
#define SEGFLOW_TEST_HAVE_CUDA_HEADERS 1
#else
#define SEGFLOW_TEST_HAVE_CUDA_HEADERS 0
#endif

#include "pipeline/cache/compact.hpp"
#include "pipeline/cache/disk_cache.hpp"
#include "pipeline/cache/sample_cache.hpp"
#include "pipeline/io/dataset.hpp"
#include "pipeline/io/nifti.hpp"
#include "pipeline/pipeline_spec.hpp"
#include "pipeline/simple_loader.hpp"
#include "pipeline/stage_registry.hpp"
#include "pipeline/synth.hpp"
#include "pipeline/transforms/crop.hpp"
#include "test_util.hpp"

using namespace segflow;
using namespace segflow::pipeline;
using segflow::testing::TempDir;

/// True in a build under AddressSanitizer (the asan preset): its allocator keeps freed memory
/// in quarantine and adds red zones, so resident-set figures say nothing about segflow's own
/// memory there; the RSS bounds below are checked only when this is false.
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SEGFLOW_TEST_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(SEGFLOW_TEST_ASAN)
constexpr bool kAddressSanitizer = true;
#else
constexpr bool kAddressSanitizer = false;
#endif

namespace {

const StageRegistry& reg() {
  static const StageRegistry r = builtin_registry();
  return r;
}

Pipeline pipeline_of(const std::string& yaml) {
  REQUIRE_OK_AND_ASSIGN(auto p, build_pipeline(YAML::Load(yaml), reg(), "test.yaml"));
  return p;
}

/// A small synthetic CT dataset (integer HU images, uint8 labels), made once per folder.
std::vector<CaseEntry> phantoms(const std::filesystem::path& root, int cases, int size) {
  SynthOptions so;
  so.cases = cases;
  so.size = size;
  so.format = "nifti";
  so.out = root;
  so.seed = 5;
  Status st = synthesize_dataset(so);
  REQUIRE_OK(st);
  REQUIRE_OK_AND_ASSIGN(auto idx, scan_dataset(root));
  REQUIRE(idx.cases.size() == static_cast<std::size_t>(cases));
  return idx.cases;
}

LoaderOptions loader_options(const std::vector<CaseEntry>& cases, const Pipeline& p,
                             const std::string& dtype) {
  LoaderOptions o;
  o.cases = cases;
  o.pipeline = &p;
  o.batch_size = 3;
  o.seed = 11;
  o.cache_dtype = dtype;
  return o;
}

std::unique_ptr<SimpleLoader> loader(const LoaderOptions& o) {
  REQUIRE_OK_AND_ASSIGN(auto l, SimpleLoader::make(o));
  return l;
}

std::vector<Batch> epoch(SimpleLoader& l, std::int64_t e) {
  REQUIRE_OK(l.start_epoch(e));
  std::vector<Batch> out;
  while (true) {
    REQUIRE_OK_AND_ASSIGN(auto b, l.next());
    if (!b) break;
    out.push_back(std::move(*b));
  }
  CHECK(l.take_failures().empty());
  return out;
}

/// Same ids, keys, dtypes, shapes and values (bit for bit).
void check_same(const std::vector<Batch>& a, const std::vector<Batch>& b) {
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    CHECK(a[i].ids == b[i].ids);
    REQUIRE(a[i].tensors.size() == b[i].tensors.size());
    for (const auto& [k, t] : a[i].tensors) {
      const std::string& key = k;  // clang 14 cannot capture a structured binding
      CAPTURE(key);
      REQUIRE(b[i].tensors.count(k) == 1);
      const at::Tensor u = b[i].tensors.at(k).cpu();
      CHECK((t.scalar_type() == u.scalar_type()));
      REQUIRE((t.sizes() == u.sizes()));
      CHECK(torch::equal(t.cpu(), u));
    }
  }
}

double bytes_per_voxel(const SimpleLoaderStats& s) {
  REQUIRE(s.cache_voxels > 0);
  return static_cast<double>(s.cache_bytes) / static_cast<double>(s.cache_voxels);
}

/// The random stages of the loader tests (a flow-sequence tail).
const char* kCropTail =
    ", {name: rand_crop_pos_neg, options: {spatial_size: [12, 12, 12], pos: 1, neg: 1, num_samples: 3}},"
    " {name: rand_flip, options: {prob: 0.5, spatial_axis: [0, 1]}}";

}  // namespace

TEST_CASE("a packed index set picks the same k-th index as the int64 list it was made from") {
  torch::manual_seed(1);
  for (std::int64_t extent : {0, 1, 63, 64, 65, 511, 512, 513, 4096 + 77, 100000}) {
    for (double p : {0.0, 0.003, 0.5, 1.0}) {
      CAPTURE(extent);
      CAPTURE(p);
      const at::Tensor mask = torch::rand({extent}) < p;
      const at::Tensor list = mask.nonzero().flatten();
      for (const at::Tensor& packed : {pack_index_mask(mask), pack_index_list(list, extent)}) {
        REQUIRE_OK_AND_ASSIGN(auto set, PackedIndexSet::view(packed, "test"));
        CHECK(set.size() == list.numel());
        CHECK(set.extent() == extent);
        CHECK(torch::equal(set.to_list(), list));
        const auto* l = list.data_ptr<std::int64_t>();
        bool all = true;
        for (std::int64_t k = 0; k < list.numel(); ++k) all = all && set.select(k) == l[k];
        CHECK(all);
      }
    }
  }
  // A tensor that is not a packed set is refused with a reason, not read.
  auto bad = PackedIndexSet::view(torch::arange(9, torch::kLong), "'fg_indices' of 'x'");
  REQUIRE_FALSE(bad.is_ok());
  CHECK(bad.status().message() == "packed index set 'fg_indices' of 'x': bad magic");
}

TEST_CASE("compact samples restore bit for bit: narrow integer casts, palettes and packed index sets") {
  torch::manual_seed(2);
  Sample s;
  s.id = "c";
  const at::Tensor hu = torch::randint(-1024, 1500, {1, 20, 30, 40}).to(torch::kFloat);
  s.tensors["image"] = hu;                                                            // integer HU in float32
  s.tensors["window"] = (hu.clamp(-200, 300) + 200) / 500.0f;                         // 501 values in [0, 1]
  s.tensors["few"] = torch::randint(0, 7, {1, 20, 30, 40}).to(torch::kFloat) * 0.1f;  // 7 values
  s.tensors["label"] = torch::randint(0, 5, {1, 20, 30, 40}).to(torch::kLong);
  s.tensors["noise"] = torch::randn({1, 20, 30, 40});          // continuous: kept
  s.tensors["negzero"] = torch::zeros({1, 20, 30, 40}).neg();  // -0.0 everywhere
  s.tensors["box"] = torch::tensor({1.0f, 2.0f, 3.0f, 4.0f});  // 1-D: kept
  auto [fg, bg] = fg_bg_indices(s.at("label"), {}, 0.0, 0);
  s.tensors["fg_indices"] = fg;
  s.tensors["bg_indices"] = bg;
  REQUIRE_OK_AND_ASSIGN(auto c, compact_sample(s, CacheDtype::exact));
  CHECK(is_compact(c));
  CHECK_FALSE(is_compact(s));
  CHECK((c.at("image").scalar_type() == torch::kInt16));
  CHECK((c.at("window").scalar_type() == torch::kInt16));  // 501 values: int16 codes + table
  CHECK(c.at("~t:window").numel() == 501);
  CHECK((c.at("few").scalar_type() == torch::kUInt8));  // 7 values: uint8 codes
  CHECK((c.at("label").scalar_type() == torch::kUInt8));
  CHECK((c.at("noise").scalar_type() == torch::kFloat));
  CHECK_FALSE(c.has("~c:noise"));
  CHECK((c.at("negzero").scalar_type() == torch::kUInt8));  // a one-value palette keeps the sign
  CHECK(is_packed_index_set(c, "fg_indices"));
  CHECK(is_packed_index_set(c, "bg_indices"));
  CHECK(sample_bytes(c) < sample_bytes(s) / 2);
  CHECK(sample_voxels(c) == 20 * 30 * 40);

  REQUIRE_OK_AND_ASSIGN(auto e, expand_sample(c));
  CHECK_FALSE(is_compact(e));
  REQUIRE(e.tensors.size() == s.tensors.size());
  for (const auto& [k, t] : s.tensors) {
    const std::string& key = k;  // clang 14 cannot capture a structured binding
    CAPTURE(key);
    const at::Tensor& u = e.at(k);
    CHECK((u.scalar_type() == t.scalar_type()));
    CHECK((u.sizes() == t.sizes()));
    CHECK(torch::equal(u, t));
  }
  CHECK(torch::signbit(e.at("negzero")).all().item<bool>());
  // The float32/int64 path leaves a sample as it is.
  REQUIRE_OK_AND_ASSIGN(auto n, compact_sample(s, CacheDtype::none));
  CHECK_FALSE(is_compact(n));
  CHECK(sample_bytes(n) == sample_bytes(s));
}

TEST_CASE(
    "degenerate tensors (empty, one voxel, no channel, empty index lists) compact and restore unchanged") {
  Sample s;
  s.id = "d";
  s.tensors["empty"] = torch::zeros({0, 4, 4}, torch::kFloat);
  s.tensors["empty_space"] = torch::zeros({1, 0, 3}, torch::kFloat);
  s.tensors["one"] = torch::full({1, 1, 1}, 7.0f);
  s.tensors["wide"] = torch::tensor({70000.0f, -3.0f}).view({1, 2});  // needs int32: no gain
  s.tensors["fg_indices"] = torch::zeros({0}, torch::kLong);
  s.tensors["bg_indices"] = torch::arange(5, torch::kLong);
  // (bfloat16 would round "wide"; float16 keeps a tensor beyond its range whole.)
  for (CacheDtype d : {CacheDtype::exact, CacheDtype::float16}) {
    CAPTURE(std::string(cache_dtype_name(d)));
    REQUIRE_OK_AND_ASSIGN(auto c, compact_sample(s, d));
    CHECK(sample_voxels(c) == 2);
    REQUIRE_OK_AND_ASSIGN(auto e, expand_sample(c));
    REQUIRE(e.tensors.size() == s.tensors.size());
    for (const auto& [k, t] : s.tensors) {
      const std::string& key = k;  // clang 14 cannot capture a structured binding
      CAPTURE(key);
      CHECK((e.at(k).scalar_type() == t.scalar_type()));
      CHECK((e.at(k).sizes() == t.sizes()));
      CHECK(torch::equal(e.at(k), t));
    }
  }
  // A cache of samples without spatial voxels counts none (no division by zero anywhere).
  MemoryCache m(1, 1 << 20);
  Sample flat;
  flat.id = "f";
  flat.tensors["box"] = torch::ones({4});
  REQUIRE(m.offer(0, flat));
  CHECK(m.voxels() == 0);
}

TEST_CASE("the compact cache gives the same crops as the float32/int64 path for integer-valued images") {
  TempDir dir("segflow_compact");
  const auto cases = phantoms(dir / "data", 4, 32);
  // quickstart-like (window without resampling: palette), raw HU (int16 cast), and packed
  // indices from the stage with a random stage before the crop (augment_case expands).
  const std::string window =
      "[{name: load}, {name: scale_intensity_range, options: {a_min: -200, a_max: 300, b_min: 0.0, b_max: "
      "1.0,"
      " clip: true}}, {name: fg_bg_indices}" +
      std::string(kCropTail) + "]";
  const std::string raw = "[{name: load}, {name: fg_bg_indices}" + std::string(kCropTail) + "]";
  const std::string packed_first_random =
      "[{name: load}, {name: fg_bg_indices, options: {format: packed}},"
      " {name: rand_shift_intensity, options: {offsets: 20, prob: 1.0}}" +
      std::string(kCropTail) + "]";
  const std::string int64_first_random =
      "[{name: load}, {name: fg_bg_indices},"
      " {name: rand_shift_intensity, options: {offsets: 20, prob: 1.0}}" +
      std::string(kCropTail) + "]";
  struct Pair {
    std::string compact, reference;
  };
  for (const Pair& pr :
       {Pair{window, window}, Pair{raw, raw}, Pair{packed_first_random, int64_first_random}}) {
    CAPTURE(pr.compact);
    const Pipeline pc = pipeline_of(pr.compact), pr_ = pipeline_of(pr.reference);
    auto ref = loader(loader_options(cases, pr_, "none"));
    auto cmp = loader(loader_options(cases, pc, "exact"));
    for (std::int64_t e : {0, 1}) {
      CAPTURE(e);
      const auto a = epoch(*ref, e), b = epoch(*cmp, e);
      REQUIRE(!a.empty());
      check_same(a, b);
    }
    CHECK(cmp->stats().memory_hits == 4);  // the second epoch came from the compact cache
    CHECK(cmp->stats().cache_bytes * 3 < ref->stats().cache_bytes);
  }
}

TEST_CASE(
    "the default compact cache (exact) holds at most 4 bytes per cached voxel, cache_dtype none about 13") {
  TempDir dir("segflow_compact");
  const auto cases = phantoms(dir / "data", 3, 40);
  const Pipeline p = pipeline_of("[{name: load}, {name: fg_bg_indices}" + std::string(kCropTail) + "]");
  auto ref = loader(loader_options(cases, p, "none"));
  auto cmp = loader(loader_options(cases, p, "exact"));
  epoch(*ref, 0);
  epoch(*cmp, 0);
  const double before = bytes_per_voxel(ref->stats()), after = bytes_per_voxel(cmp->stats());
  MESSAGE("bytes per cached voxel: float32/int64 " << before << ", compact " << after);
  // float32 image 4 + uint8 label 1 + int64 indices 8 (every voxel is fg or bg).
  CHECK(before == doctest::Approx(13.0).epsilon(0.001));
  // int16 image 2 + uint8 label 1 + packed fg/bg sets (2 bits + 2 x 8 bytes per 512 voxels).
  CHECK(after <= 4.0);
  CHECK(after == doctest::Approx(3.0 + 0.25 + 16.0 / 512).epsilon(0.01));
}

TEST_CASE("float16 and bfloat16 caches give crops within the documented tolerance of the float32 path") {
  TempDir dir("segflow_compact");
  const auto cases = phantoms(dir / "data", 3, 40);
  // Resampling makes a continuous image: the exact cache keeps it float32 (same crops), the
  // lossy ones round it.
  const Pipeline p = pipeline_of(
      "[{name: load}, {name: resample, options: {spacing: [1.7, 1.7, 1.9]}},"
      " {name: scale_intensity_range, options: {a_min: -57, a_max: 164, b_min: 0.0, b_max: 1.0, clip: true}},"
      " {name: fg_bg_indices}" +
      std::string(kCropTail) + "]");
  auto ref = loader(loader_options(cases, p, "none"));
  const auto a = epoch(*ref, 0);
  auto exact = loader(loader_options(cases, p, "exact"));
  check_same(a, epoch(*exact, 0));
  MESSAGE("exact: bytes per cached voxel " << bytes_per_voxel(exact->stats()));
  CHECK(bytes_per_voxel(exact->stats()) <= 4 + 1 + 0.3);  // at most a float32 image, uint8 label, sets
  struct Lossy {
    const char* name;
    double rel, abs;
  };
  for (const Lossy& l : {Lossy{"float16", std::ldexp(1.0, -11), std::ldexp(1.0, -25)},
                         Lossy{"bfloat16", std::ldexp(1.0, -8), 0.0}}) {
    CAPTURE(std::string(l.name));
    auto lo = loader(loader_options(cases, p, l.name));
    const auto b = epoch(*lo, 0);
    REQUIRE(a.size() == b.size());
    double worst = 0, max_diff = 0;
    for (std::size_t i = 0; i < a.size(); ++i) {
      CHECK(a[i].ids == b[i].ids);
      CHECK(torch::equal(a[i].tensors.at("label"), b[i].tensors.at("label")));
      const at::Tensor x = a[i].tensors.at("image").to(torch::kDouble), v = b[i].tensors.at("image");
      CHECK((v.scalar_type() == torch::kFloat));
      const at::Tensor diff = (v.to(torch::kDouble) - x).abs();
      worst = std::max(worst, (diff - (x.abs() * l.rel + l.abs)).max().item<double>());
      max_diff = std::max(max_diff, diff.max().item<double>());
    }
    MESSAGE(std::string(l.name) << ": largest difference " << max_diff << ", bytes per cached voxel "
                                << bytes_per_voxel(lo->stats()));
    CHECK(worst <= 0.0);    // every voxel within rel * |x| + abs
    CHECK(max_diff > 0.0);  // and the image was really rounded
    CHECK(bytes_per_voxel(lo->stats()) <= 4.0);
  }
}

TEST_CASE("bad cache options are refused with the field named") {
  TempDir dir("segflow_compact");
  const Pipeline p = pipeline_of("[{name: load}, {name: fg_bg_indices}" + std::string(kCropTail) + "]");
  std::vector<CaseEntry> cases{CaseEntry{"a", {dir / "a.nii"}, std::nullopt}};
  LoaderOptions o = loader_options(cases, p, "fp8");
  Status st = validate_loader_options(o);
  CHECK(st.message() == "loader: cache_dtype: expected exact, float16, bfloat16 or none, got \"fp8\"");
  o.cache_dtype = "exact";
  o.cache_device = "gpu";
  CHECK(validate_loader_options(o).message() == "loader: cache_device: expected cpu or cuda, got 'gpu'");
  o.cache_device = "cuda";
  CHECK(validate_loader_options(o).message() ==
        "loader: cache_device: cuda keeps the cache on the training device, which is cpu; expected a CUDA "
        "device or cache_device cpu");
  auto stage = reg().make("fg_bg_indices", nlohmann::json{{"format", "int32"}}, "test.yaml: stages[1]");
  REQUIRE_FALSE(stage.is_ok());
  CHECK(stage.status().message().find("format") != std::string::npos);
  CHECK(stage.status().message().find("int32") != std::string::npos);
}

namespace {

/// Resident set size now (VmRSS), MiB.
double rss_mb() {
  std::ifstream f("/proc/self/status");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("VmRSS:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  return 0.0;
}

/// Child: three epochs of a SimpleLoader over $SEGFLOW_SPILL_ROOT with a byte budget of
/// $SEGFLOW_SPILL_BUDGET and, when $SEGFLOW_SPILL_DISK is 1, a disk cache; prints one JSON
/// line of figures.
int spill_child() {
  torch::set_num_threads(1);  // no thread pool appearing in the middle of the measurement
  const std::filesystem::path root = std::getenv("SEGFLOW_SPILL_ROOT");
  const std::int64_t budget = std::stoll(std::getenv("SEGFLOW_SPILL_BUDGET"));
  auto idx = scan_dataset(root / "data");
  if (!idx.is_ok()) return 2;
  auto p = build_pipeline(YAML::Load("[{name: load}, {name: fg_bg_indices},"
                                     " {name: rand_crop_pos_neg, options: {spatial_size: [16, 16, 16]}}]"),
                          builtin_registry(), "spill");
  if (!p.is_ok()) return 3;
  LoaderOptions o;
  o.cases = idx->cases;
  o.pipeline = &p.value();
  o.batch_size = 4;
  o.cache_bytes = budget;
  if (const char* d = std::getenv("SEGFLOW_SPILL_DISK"); d && std::string(d) == "1")
    o.disk_cache_dir = (root / "cache").string();
  auto l = SimpleLoader::make(o);
  if (!l.is_ok()) return 4;
  const double base = rss_mb();
  nlohmann::json after = nlohmann::json::array();
  for (std::int64_t e = 0; e < 3; ++e) {
    if (!(*l)->start_epoch(e).is_ok()) return 5;
    while (true) {
      auto b = (*l)->next();
      if (!b.is_ok()) return 6;
      if (!b.value()) break;
    }
    after.push_back(rss_mb() - base);
  }
  const auto s = (*l)->stats();
  std::cout << nlohmann::json{{"growth_mb", after},         {"cache_bytes", s.cache_bytes},
                              {"entries", s.cache_entries}, {"not_admitted", s.not_admitted},
                              {"disk_hits", s.disk_hits},   {"decodes", s.decodes}}
                   .dump()
            << std::endl;
  return 0;
}

const segflow::testing::ChildEntry kSpillChild("compact_cache_spill", spill_child);

nlohmann::json run_spill_child(const std::filesystem::path& root, std::int64_t budget, bool disk = true) {
  // A fixed mmap threshold: glibc then returns every freed volume to the system at once,
  // so the resident set shows what is held, not what malloc keeps for later.
  auto child = segflow::testing::start_child_entry(
      "compact_cache_spill",
      {"MALLOC_MMAP_THRESHOLD_=131072", "SEGFLOW_SPILL_ROOT=" + root.string(),
       "SEGFLOW_SPILL_BUDGET=" + std::to_string(budget),
       std::string("SEGFLOW_SPILL_DISK=") + (disk ? "1" : "0")},
      segflow::testing::ChildOutput::pipe);
  const std::string out = child.read_stdout();
  REQUIRE_MESSAGE(child.wait_exit() == 0, out);
  const auto nl = out.rfind('{');
  REQUIRE(nl != std::string::npos);
  return nlohmann::json::parse(out.substr(nl));
}

}  // namespace

TEST_CASE(
    "a dataset several times the cache budget keeps RSS near the budget, with or without a disk cache") {
  TempDir dir("segflow_spill");
  // Eight cases of 160 x 160 x 96 voxels, integer HU: ~8.1 MB each in the compact cache,
  // ~65 MB in all; the budget holds two.
  std::filesystem::create_directories(dir / "data" / "imagesTr");
  std::filesystem::create_directories(dir / "data" / "labelsTr");
  torch::manual_seed(4);
  for (int i = 0; i < 8; ++i) {
    Image img, lab;
    img.voxels = torch::randint(-1000, 1000, {1, 96, 160, 160}).to(torch::kInt16);
    at::Tensor l = torch::zeros({1, 96, 160, 160}, torch::kUInt8);
    l.slice(1, 30, 60).slice(2, 40 + i, 90).slice(3, 50, 100).fill_(1);
    lab.voxels = l;
    img.geometry.spacing = lab.geometry.spacing = {1.0, 1.0, 2.0};
    char name[32];
    std::snprintf(name, sizeof name, "case_%03d", i);
    REQUIRE_OK(write_nifti(dir / "data" / "imagesTr" / (std::string(name) + "_0000.nii"), img));
    REQUIRE_OK(write_nifti(dir / "data" / "labelsTr" / (std::string(name) + ".nii"), lab));
  }
  {
    nlohmann::json ds = {{"name", "spill"},
                         {"labels", {{"0", "background"}, {"1", "blob"}}},
                         {"modality", {{"0", "CT"}}},
                         {"file_ending", ".nii"},
                         {"training", nlohmann::json::array()}};
    for (int i = 0; i < 8; ++i) {
      char name[32];
      std::snprintf(name, sizeof name, "case_%03d", i);
      ds["training"].push_back({{"image", "./imagesTr/" + std::string(name) + "_0000.nii"},
                                {"label", "./labelsTr/" + std::string(name) + ".nii"}});
    }
    std::ofstream(dir / "data" / "dataset.json") << ds.dump(2);
  }
  const double per_case_mb = 160.0 * 160 * 96 * (2 + 1 + 0.25 + 16.0 / 512) / (1 << 20);
  const std::int64_t budget = static_cast<std::int64_t>(2.5 * per_case_mb * (1 << 20));

  const nlohmann::json spill = run_spill_child(dir.path(), budget);
  MESSAGE("budget " << budget / (1 << 20) << " MiB, dataset ~" << 8 * per_case_mb
                    << " MiB: " << spill.dump());
  CHECK(spill["entries"] == 2);
  CHECK(spill["cache_bytes"].get<std::int64_t>() <= budget);
  CHECK(spill["not_admitted"].get<std::int64_t>() >= 6);
  CHECK(spill["disk_hits"].get<std::int64_t>() >= 12);  // epochs 2 and 3 read the rest from disk
  CHECK(spill["decodes"] == 8);
  // Resident-set growth bounded by the budget (not measurable under ASan's allocator).
  const auto check_growth = [&](const nlohmann::json& run) {
    if (kAddressSanitizer) {
      MESSAGE("ASan build: RSS growth not checked");
      return;
    }
    for (const auto& g : run["growth_mb"]) CHECK(g.get<double>() <= budget / double(1 << 20) + 8.0);
  };
  check_growth(spill);

  // The memory cache alone: the cases past the budget are decoded again every epoch, and
  // the resident set stays as near the budget.
  std::filesystem::remove_all(dir / "cache");
  const nlohmann::json memory = run_spill_child(dir.path(), budget, /*disk=*/false);
  MESSAGE("memory cache only: " << memory.dump());
  CHECK(memory["entries"] == 2);
  CHECK(memory["cache_bytes"].get<std::int64_t>() <= budget);
  CHECK(memory["disk_hits"] == 0);
  CHECK(memory["decodes"] == 8 + 2 * 6);  // epochs 2 and 3 decode the six uncached cases again
  check_growth(memory);

  // The same run with room for everything: the measurement sees what is cached.
  std::filesystem::remove_all(dir / "cache");
  const nlohmann::json all = run_spill_child(dir.path(), std::int64_t{8} << 30);
  MESSAGE("without a binding budget: " << all.dump());
  CHECK(all["entries"] == 8);
  CHECK(all["growth_mb"].back().get<double>() >= 0.8 * 8 * per_case_mb);
}

TEST_CASE(
    "with cache_device cuda the cache lives in GPU memory and crops read it without host syncs (CUDA)") {
  if (!segflow::testing::cuda_or_skip()) return;
  TempDir dir("segflow_compact");
  const auto cases = phantoms(dir / "data", 3, 32);
  const Pipeline p = pipeline_of(
      "[{name: load}, {name: scale_intensity_range, options: {a_min: -200, a_max: 300, b_min: 0.0, b_max: "
      "1.0,"
      " clip: true}}, {name: fg_bg_indices}" +
      std::string(kCropTail) + "]");
  auto ref = loader(loader_options(cases, p, "none"));  // host, float32/int64
  LoaderOptions go = loader_options(cases, p, "exact");
  go.device = "cuda:0";
  go.cache_device = "cuda";
  auto gpu = loader(go);
  for (std::int64_t e : {0, 1}) {
    const auto a = epoch(*ref, e), b = epoch(*gpu, e);
    REQUIRE(!b.empty());
    CHECK(b.front().tensors.at("image").is_cuda());
    check_same(a, b);
  }
  CHECK(gpu->stats().memory_hits == 3);

  // The cache's tensors: image and label on the GPU, crop-centre sets and markers on the host.
  REQUIRE_OK_AND_ASSIGN(auto d, decode_case(cases[0], p, nullptr, deterministic_spec(p), CacheDtype::exact));
  MemoryCache m(1, std::int64_t{1} << 30, c10::Device("cuda:0"));
  REQUIRE(m.offer(0, d.sample));
  const Sample& cached = *m.find(0);
  CHECK(cached.at("image").is_cuda());
  CHECK(cached.at("label").is_cuda());
  CHECK(cached.at("fg_indices").device().is_cpu());
  CHECK(cached.at("~c:image").device().is_cpu());
#if SEGFLOW_TEST_HAVE_CUDA_HEADERS
  // Every synchronising CUDA call throws while the random stages run on the cached sample.
  torch::cuda::synchronize();
  c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_ERROR);
  Result<std::vector<Sample>> crops = internal_error("not run");
  try {
    crops = augment_case(p, cached, 11, 0, 0, 0, c10::Device("cuda:0"));
  } catch (const c10::Error& e) {
    crops = internal_error(e.what_without_backtrace());
  }
  c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_DISABLED);
  REQUIRE_OK(crops);
  CHECK(crops->size() == 3);
  CHECK(crops->front().at("image").is_cuda());
  CHECK((crops->front().at("image").scalar_type() == torch::kFloat));
#endif
}

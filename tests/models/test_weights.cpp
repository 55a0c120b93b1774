// Tensor archives: round trip, corrupt files, loading into modules, the Python converter.
#include <doctest/doctest.h>
#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <fstream>

#include "model_checks.hpp"
#include "models/nets/sam.hpp"
#include "models/nets/unet.hpp"
#include "models/nets/weights.hpp"
#include "test_util.hpp"

using namespace segflow::models;
using segflow::testing::max_abs_diff;
using segflow::testing::TempDir;

TEST_CASE("a tensor archive round-trips names, dtypes, shapes and values") {
  TempDir dir("sfta");
  TensorMap m;
  m["f32"] = torch::randn({2, 3});
  m["f64"] = torch::randn({4}, torch::kDouble);
  m["f16"] = torch::randn({3, 1}).to(torch::kHalf);
  m["bf16"] = torch::randn({5}).to(torch::kBFloat16);
  m["i64"] = torch::arange(7, torch::kLong);
  m["u8"] = torch::arange(3, torch::kByte);
  m["flag"] = torch::tensor(true);
  m["scalar"] = torch::tensor(3.5);
  m["empty"] = torch::zeros({0, 3});
  m["strided"] = torch::randn({4, 6}).t();  // non-contiguous input
  auto path = dir / "t.sfta";
  REQUIRE_OK(write_tensor_archive(path, m));
  REQUIRE_OK_AND_ASSIGN(auto r, read_tensor_archive(path));
  REQUIRE(r.size() == m.size());
  for (const auto& [name, t] : m) {
    const auto& param = name;  // clang 14 cannot capture a structured binding
    INFO(param);
    REQUIRE(r.count(name));
    const auto& u = r.at(name);
    CHECK((u.scalar_type() == t.scalar_type()));
    CHECK(u.sizes() == t.sizes());
    CHECK(torch::equal(u, t));
  }
}

TEST_CASE("corrupt or truncated tensor archives are reported, not crashed on") {
  TempDir dir("sfta");
  auto path = dir / "t.sfta";
  REQUIRE_OK(write_tensor_archive(path, {{"w", torch::randn({64, 64})}}));
  const auto bytes = segflow::testing::read_file(path);
  segflow::testing::write_file(dir / "short.sfta", bytes.substr(0, bytes.size() - 100));
  auto truncated = read_tensor_archive(dir / "short.sfta");
  CHECK(truncated.status().code() == segflow::ErrorCode::corrupt_data);
  CHECK(truncated.status().message().find("w") != std::string::npos);
  segflow::testing::write_file(dir / "magic.sfta", "NOTANARCHIVE" + bytes.substr(12));
  CHECK(read_tensor_archive(dir / "magic.sfta").status().code() == segflow::ErrorCode::corrupt_data);
  std::string bad_header = bytes;
  bad_header[16] = '[';
  segflow::testing::write_file(dir / "json.sfta", bad_header);
  CHECK(read_tensor_archive(dir / "json.sfta").status().code() == segflow::ErrorCode::corrupt_data);
  CHECK(read_tensor_archive(dir / "missing.sfta").status().code() == segflow::ErrorCode::io_error);
}

TEST_CASE("load_into copies weights and names missing, unexpected and mismatched keys") {
  torch::manual_seed(0);
  UNetOptions o;
  o.channels = {4, 8};
  o.strides = {2};
  o.norm = NormKind::batch;
  UNet a(o), b(o);
  a->eval();
  b->eval();
  auto x = torch::randn({1, 1, 8, 8, 8});
  torch::NoGradGuard no_grad;
  CHECK(max_abs_diff(a->forward(x), b->forward(x)) > 0);
  auto weights = named_tensors(*a);
  CHECK(weights.count("down.0.conv.0.norm.running_mean"));
  REQUIRE_OK(load_into(*b, weights));
  CHECK(max_abs_diff(a->forward(x), b->forward(x)) == 0.0);

  auto missing = weights;
  missing.erase("bottom.conv.0.conv.weight");
  missing["extra.weight"] = torch::zeros({1});
  auto st = load_into(*b, missing, /*strict=*/true);
  CHECK(st.code() == segflow::ErrorCode::invalid_argument);
  CHECK(st.message().find("1 missing key: bottom.conv.0.conv.weight") != std::string::npos);
  CHECK(st.message().find("1 unexpected key: extra.weight") != std::string::npos);
  CHECK_OK(load_into(*b, missing, /*strict=*/false));

  auto wrong = weights;
  wrong["bottom.conv.0.conv.weight"] = torch::zeros({1, 2, 3});
  auto shape = load_into(*b, wrong, /*strict=*/false);
  CHECK(shape.message().find("shape mismatch: bottom.conv.0.conv.weight") != std::string::npos);
}

TEST_CASE("the Python converter turns a PyTorch state dict into an archive that loads into tiny SAM") {
  TempDir dir("convert");
  REQUIRE_OK_AND_ASSIGN(auto opts, SamOptions::preset("tiny"));
  Sam sam(opts);
  // Names and shapes of our model; Python fills them with a deterministic pattern, adds a
  // DDP prefix, a float16 tensor and a key to rename, and saves a torch state dict.
  nlohmann::json spec = nlohmann::json::object();
  for (const auto& [name, t] : named_tensors(*sam)) spec[name] = t.sizes().vec();
  std::ofstream(dir / "spec.json") << spec.dump();
  const std::string script = R"PY(
import json, sys, torch
spec = json.load(open(sys.argv[1]))
sd = {}
for i, (name, shape) in enumerate(sorted(spec.items())):
    n = 1
    for s in shape: n *= s
    t = (torch.arange(n, dtype=torch.float64) * 1e-3 + i).reshape(shape).to(torch.float32)
    if name == "image_encoder.pos_embed": t = t.to(torch.float16)
    if name == "mask_decoder.iou_token.weight": name = "mask_decoder.iou_tok.weight"
    sd["module." + name] = t
sd["module.extra_optimizer_state"] = torch.zeros(3)
torch.save({"model": sd, "epoch": 3}, sys.argv[2])
)PY";
  segflow::testing::write_file(dir / "make.py", script);
  using segflow::testing::shell_quote;
  const auto py = shell_quote(segflow::testing::python());
  auto made = segflow::testing::run_command(py + " " + shell_quote((dir / "make.py").string()) + " " +
                                            shell_quote((dir / "spec.json").string()) + " " +
                                            shell_quote((dir / "ckpt.pth").string()) + " 2>&1");
  REQUIRE_MESSAGE(made.exit_code == 0, made.out);
  auto conv = segflow::testing::run_command(
      py + " " + shell_quote(segflow::testing::source_path("scripts/convert_sam_weights.py").string()) + " " +
      shell_quote((dir / "ckpt.pth").string()) + " " + shell_quote((dir / "tiny.sfta").string()) +
      " --strip-prefix module. --drop extra_optimizer --rename 'iou_tok\\.=iou_token.' 2>&1");
  REQUIRE_MESSAGE(conv.exit_code == 0, conv.out);
  REQUIRE_OK_AND_ASSIGN(auto archive, read_tensor_archive(dir / "tiny.sfta"));
  CHECK((archive.at("image_encoder.pos_embed").scalar_type() == torch::kHalf));
  REQUIRE_OK(load_into(*sam, archive, /*strict=*/true));
  size_t i = 0;
  for (const auto& [name, t] : named_tensors(*sam)) {  // sorted, as Python's enumeration
    const auto& param = name;                          // clang 14 cannot capture a structured binding
    INFO(param);
    auto expected =
        (torch::arange(t.numel(), torch::kDouble) * 1e-3 + static_cast<double>(i++)).reshape(t.sizes());
    expected = expected.to(torch::kFloat);  // the same rounding steps as the Python side
    if (name == "image_encoder.pos_embed") expected = expected.to(torch::kHalf).to(torch::kFloat);
    CHECK(max_abs_diff(t, expected) == 0.0);
  }
  // A bad checkpoint gives a non-zero exit and one message.
  segflow::testing::write_file(dir / "bad.pth", "not a checkpoint");
  auto bad = segflow::testing::run_command(
      py + " " + shell_quote(segflow::testing::source_path("scripts/convert_sam_weights.py").string()) + " " +
      shell_quote((dir / "bad.pth").string()) + " " + shell_quote((dir / "bad.sfta").string()) + " 2>&1");
  CHECK(bad.exit_code != 0);
}

// npy reader/writer: round trips, files numpy writes (every dtype, both byte orders, C and
// Fortran order, format versions 1.0-3.0), numpy reading what segflow writes, bad files.
#include <doctest/doctest.h>
#include <torch/torch.h>

#include <cstring>
#include <random>
#include <sstream>

#include "pipeline/io/npy.hpp"
#include "test_util.hpp"

namespace fs = std::filesystem;
using nlohmann::json;
using segflow::pipeline::read_npy;
using segflow::pipeline::read_npy_image;
using segflow::pipeline::write_npy;
namespace st = segflow::testing;

namespace {

const std::vector<at::ScalarType> kTypes = {at::kBool,   at::kByte, at::kChar,   at::kShort,
                                            at::kUInt16, at::kInt,  at::kUInt32, at::kLong,
                                            at::kUInt64, at::kHalf, at::kFloat,  at::kDouble};
const std::vector<std::vector<std::int64_t>> kShapes = {{},        {5},          {3, 4},
                                                        {2, 3, 4}, {2, 3, 4, 5}, {1, 2, 3, 2, 2}};

at::Tensor random_tensor(at::ScalarType type, const std::vector<std::int64_t>& shape, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  if (type == at::kBool) {
    at::Tensor t = torch::empty(shape, torch::TensorOptions().dtype(at::kBool));
    auto* p = static_cast<unsigned char*>(t.data_ptr());
    for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = rng() & 1;
    return t;
  }
  if (type == at::kHalf || type == at::kFloat || type == at::kDouble) {
    at::Tensor t = torch::empty(shape, torch::TensorOptions().dtype(at::kDouble));
    std::normal_distribution<double> normal(0.0, 100.0);
    for (std::int64_t i = 0; i < t.numel(); ++i) t.data_ptr<double>()[i] = normal(rng);
    return t.to(type);
  }
  at::Tensor t = torch::empty(shape, torch::TensorOptions().dtype(type));
  auto* p = static_cast<unsigned char*>(t.data_ptr());
  for (std::int64_t i = 0; i < t.numel() * static_cast<std::int64_t>(t.element_size()); ++i)
    p[i] = static_cast<unsigned char>(rng());
  return t;
}

/// An .npy file from parts: version, the dict text (padded as given) and the data bytes.
std::string npy_bytes(const std::string& dict, const std::string& data, int major = 1) {
  std::string out("\x93NUMPY", 6);
  out += static_cast<char>(major);
  out += '\0';
  const std::string h = dict + "\n";
  const std::size_t n = h.size();
  out += static_cast<char>(n & 0xff);
  out += static_cast<char>((n >> 8) & 0xff);
  if (major >= 2) {
    out += static_cast<char>((n >> 16) & 0xff);
    out += static_cast<char>((n >> 24) & 0xff);
  }
  return out + h + data;
}

std::string npy_read_error(const st::TempDir& dir, const std::string& name, const std::string& bytes) {
  const auto p = dir / name;
  st::write_file(p, bytes);
  auto r = read_npy(p);
  REQUIRE_FALSE(r.is_ok());
  const std::string msg = r.status().message();
  INFO(msg);
  CHECK(msg.find(p.string()) != std::string::npos);
  return msg;
}

}  // namespace

TEST_CASE("npy round trips keep every dtype and shapes from () to 5-D") {
  st::TempDir dir("npy_rt");
  std::uint64_t seed = 0;
  for (auto type : kTypes)
    for (const auto& shape : kShapes) {
      at::Tensor t = random_tensor(type, shape, ++seed);
      const auto p = dir / std::string("a").append(std::to_string(seed)).append(".npy");
      CAPTURE(p.filename().string());
      REQUIRE_OK(write_npy(p, t));
      CHECK_FALSE(st::has_temporaries(dir.path()));
      REQUIRE_OK_AND_ASSIGN(auto back, read_npy(p));
      CHECK(st::same_bytes(back, t));
      CHECK(back.is_contiguous());
      const std::string bytes = st::read_file(p);
      CHECK(bytes[6] == 1);  // version 1.0
      const std::size_t header_len =
          static_cast<unsigned char>(bytes[8]) | (static_cast<unsigned char>(bytes[9]) << 8);
      CHECK((10 + header_len) % 64 == 0);
    }
  // A non-contiguous view is written in C order.
  at::Tensor base = random_tensor(at::kFloat, {4, 5, 6}, 99);
  at::Tensor view = base.permute({2, 0, 1});
  REQUIRE_OK(write_npy(dir / "view.npy", view));
  REQUIRE_OK_AND_ASSIGN(auto back, read_npy(dir / "view.npy"));
  CHECK(st::same_bytes(back, view.contiguous()));
  // bfloat16 and complex have no descriptor segflow writes.
  CHECK((write_npy(dir / "bf16.npy", torch::zeros({2}, torch::TensorOptions().dtype(at::kBFloat16))).code() ==
         segflow::ErrorCode::unsupported));
}

TEST_CASE(
    "npy files numpy writes in every dtype, both byte orders, C and Fortran order, versions 1-3, read "
    "exactly") {
  st::TempDir dir("npy_numpy");
  const std::string gen = R"PY(
import sys, os, numpy as np
out = sys.argv[1]
rng = np.random.default_rng(3)
dts = ['|b1', '|u1', '|i1', '<i2', '<u2', '<i4', '<u4', '<i8', '<u8', '<f2', '<f4', '<f8']
shapes = [(), (5,), (3, 4), (2, 3, 4), (2, 3, 4, 5), (1, 2, 3, 2, 2)]
fortran = 0
for dt in dts:
    for endian in '<>':
        if endian == '>' and dt[0] == '|':
            continue
        d = np.dtype(dt).newbyteorder(endian) if dt[0] != '|' else np.dtype(dt)
        for si, shape in enumerate(shapes):
            for order in 'CF':
                if dt[1] == 'b':
                    a = rng.integers(0, 2, shape).astype(bool)
                elif dt[1] == 'f':
                    a = rng.normal(0, 100, shape).astype(d)
                else:
                    info = np.iinfo(dt[1:])
                    a = rng.integers(info.min, info.max, shape, dtype=np.dtype(dt[1:]), endpoint=True).astype(d)
                a = np.array(a, order=order)  # (np.ascontiguousarray would make 0-d arrays 1-d)
                version = [(1, 0), (2, 0), (3, 0)][(si + (order == 'F')) % 3]
                name = '%s_%s_%s_%dd.npy' % (dt[1:], 'be' if endian == '>' else 'le', order, len(shape))
                with open(os.path.join(out, name), 'wb') as f:
                    np.lib.format.write_array(f, a, version=version)
                    fortran += bool(a.flags.f_contiguous and not a.flags.c_contiguous)
                np.ascontiguousarray(a).astype(d.newbyteorder('<')).tofile(os.path.join(out, name + '.raw'))
                print(name, ' '.join(str(s) for s in shape))
assert fortran > 50, fortran
np.save(os.path.join(out, 'complex.npy'), np.zeros(3, np.complex64))
np.save(os.path.join(out, 'object.npy'), np.array([None, 1], dtype=object), allow_pickle=True)
)PY";
  std::istringstream lines(st::run_python(gen, {dir.path().string()}));
  int files = 0;
  for (std::string line; std::getline(lines, line);) {
    std::istringstream ls(line);
    std::string name;
    ls >> name;
    if (!name.ends_with(".npy")) continue;
    std::vector<std::int64_t> shape;
    for (std::int64_t d; ls >> d;) shape.push_back(d);
    CAPTURE(name);
    REQUIRE_OK_AND_ASSIGN(auto t, read_npy(dir / name));
    CHECK(t.sizes().vec() == shape);
    CHECK(t.is_contiguous());
    const std::string raw = st::read_file(dir / (name + ".raw"));
    REQUIRE(static_cast<std::size_t>(t.numel() * t.element_size()) == raw.size());
    CHECK(std::memcmp(t.data_ptr(), raw.data(), raw.size()) == 0);
    ++files;
  }
  CHECK(files == 21 * 6 * 2);
  auto c = read_npy(dir / "complex.npy");
  REQUIRE_FALSE(c.is_ok());
  CHECK((c.status().code() == segflow::ErrorCode::unsupported));
  CHECK(c.status().message().find("<c8") != std::string::npos);
  auto o = read_npy(dir / "object.npy");
  REQUIRE_FALSE(o.is_ok());
  CHECK(o.status().message().find("|O") != std::string::npos);
}

TEST_CASE("npy files segflow writes load in numpy with the same dtype, shape and values") {
  st::TempDir dir("npy_ref");
  std::vector<fs::path> paths;
  std::vector<at::Tensor> tensors;
  std::uint64_t seed = 500;
  for (auto type : {at::kBool, at::kByte, at::kShort, at::kUInt16, at::kInt, at::kLong, at::kHalf, at::kFloat,
                    at::kDouble}) {
    at::Tensor t = random_tensor(type, {3, 4, 5}, ++seed);
    const auto p = dir / std::string("t").append(std::to_string(seed)).append(".npy");
    REQUIRE_OK(write_npy(p, t));
    paths.push_back(p);
    tensors.push_back(t);
  }
  std::string cmd = st::shell_quote(st::python()) + " " +
                    st::shell_quote(st::source_path("tests/tools/reference.py").string()) + " many npy";
  for (const auto& p : paths) cmd.append(" ").append(st::shell_quote(p.string()));
  auto r = st::run_command(cmd);
  INFO(r.out);
  REQUIRE(r.exit_code == 0);
  const json ref = json::parse(r.out);
  for (std::size_t i = 0; i < paths.size(); ++i) {
    const json& j = ref[paths[i].string()];
    const at::Tensor& t = tensors[i];
    INFO(j.dump().substr(0, 400));
    REQUIRE_FALSE(j.contains("error"));
    CHECK(j["dtype"].get<std::string>() == segflow::pipeline::dtype_name(t));
    CHECK(j["shape"].get<std::vector<std::int64_t>>() == t.sizes().vec());
    at::Tensor d = t.to(at::kDouble);
    CHECK(j["min"].get<double>() == d.min().item<double>());
    CHECK(j["max"].get<double>() == d.max().item<double>());
    CHECK(std::abs(j["mean"].get<double>() - d.mean().item<double>()) <=
          1e-9 * std::max(1.0, std::abs(d.mean().item<double>())));
    auto acc = d.accessor<double, 3>();
    for (const auto& s : j["voxels"]) {
      const auto i = s["zyx"].get<std::vector<std::int64_t>>();
      CHECK(acc[i[0]][i[1]][i[2]] == s["value"].get<double>());
    }
  }
}

TEST_CASE("bad npy files are errors naming the file and the problem") {
  st::TempDir dir("npy_bad");
  const std::string ok_dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
  const std::string data(24, '\0');
  // The helper's output is a valid file.
  st::write_file(dir / "good.npy", npy_bytes(ok_dict, data));
  REQUIRE_OK(read_npy(dir / "good.npy"));

  CHECK(npy_read_error(dir, "empty.npy", "").find("empty") != std::string::npos);
  CHECK(npy_read_error(dir, "magic.npy", "PK\x03\x04 not npy at all").find("magic") != std::string::npos);
  std::string good = npy_bytes(ok_dict, data);
  CHECK(npy_read_error(dir, "preamble.npy", good.substr(0, 8)).find("truncated") != std::string::npos);
  CHECK(npy_read_error(dir, "header.npy", good.substr(0, 30)).find("header: truncated") != std::string::npos);
  CHECK(npy_read_error(dir, "data.npy", good.substr(0, good.size() - 4)).find("data: expected 24 bytes") !=
        std::string::npos);
  std::string v4 = good;
  v4[6] = 4;
  CHECK(npy_read_error(dir, "v4.npy", v4).find("version") != std::string::npos);
  CHECK(npy_read_error(
            dir, "c8.npy",
            npy_bytes("{'descr': '<c8', 'fortran_order': False, 'shape': (3,), }", std::string(24, '\0')))
            .find("'<c8'") != std::string::npos);
  CHECK(npy_read_error(
            dir, "obj.npy",
            npy_bytes("{'descr': '|O', 'fortran_order': False, 'shape': (3,), }", std::string(24, '\0')))
            .find("'|O'") != std::string::npos);
  CHECK(npy_read_error(dir, "struct.npy",
                       npy_bytes("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (3,), }",
                                 std::string(12, '\0')))
            .find("structured") != std::string::npos);
  CHECK(npy_read_error(dir, "noshape.npy", npy_bytes("{'descr': '<f4', 'fortran_order': False, }", data))
            .find("shape") != std::string::npos);
  CHECK(npy_read_error(dir, "badshape.npy",
                       npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (2, -3), }", data))
            .find("shape") != std::string::npos);
  CHECK(npy_read_error(dir, "badbool.npy",
                       npy_bytes("{'descr': '<f4', 'fortran_order': maybe, 'shape': (2, 3), }", data))
            .find("fortran_order") != std::string::npos);
  CHECK(npy_read_error(dir, "extra.npy",
                       npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), 'x': 1}", data))
            .find("unexpected key") != std::string::npos);
  // Version 2.0 and 3.0 headers, double quotes and Python 2 long integers are accepted.
  st::write_file(dir / "v2.npy",
                 npy_bytes("{\"descr\": \"<f4\", \"fortran_order\": False, \"shape\": (2L, 3L)}", data, 2));
  REQUIRE_OK_AND_ASSIGN(auto v2, read_npy(dir / "v2.npy"));
  CHECK(v2.sizes() == at::IntArrayRef({2, 3}));
  auto missing = read_npy(dir / "missing.npy");
  REQUIRE_FALSE(missing.is_ok());
  CHECK((missing.status().code() == segflow::ErrorCode::not_found));
}

TEST_CASE("read_npy_image maps npy shapes (H, W), (H, W, 3), (Z, Y, X) and (C, Z, Y, X) to (C, Z, Y, X)") {
  st::TempDir dir("npy_img");
  at::Tensor hw = random_tensor(at::kFloat, {4, 5}, 1);
  at::Tensor rgb = random_tensor(at::kByte, {4, 5, 3}, 2);
  at::Tensor zyx = random_tensor(at::kShort, {3, 4, 5}, 3);
  at::Tensor czyx = random_tensor(at::kFloat, {2, 3, 4, 5}, 4);
  REQUIRE_OK(write_npy(dir / "hw.npy", hw));
  REQUIRE_OK(write_npy(dir / "rgb.npy", rgb));
  REQUIRE_OK(write_npy(dir / "zyx.npy", zyx));
  REQUIRE_OK(write_npy(dir / "czyx.npy", czyx));
  REQUIRE_OK(write_npy(dir / "line.npy", hw.flatten()));

  REQUIRE_OK_AND_ASSIGN(auto a, read_npy_image(dir / "hw.npy"));
  CHECK(st::same_bytes(a.voxels, hw.reshape({1, 1, 4, 5})));
  REQUIRE_OK_AND_ASSIGN(auto b, read_npy_image(dir / "rgb.npy"));
  CHECK(st::same_bytes(b.voxels, rgb.permute({2, 0, 1}).unsqueeze(1).contiguous()));
  CHECK(b.channels() == 3);
  REQUIRE_OK_AND_ASSIGN(auto c, read_npy_image(dir / "zyx.npy"));
  CHECK(st::same_bytes(c.voxels, zyx.unsqueeze(0)));
  REQUIRE_OK_AND_ASSIGN(auto d, read_npy_image(dir / "czyx.npy"));
  CHECK(st::same_bytes(d.voxels, czyx));
  CHECK(d.size() == segflow::Size3{5, 4, 3});
  CHECK(segflow::geometry_close(d.geometry, segflow::Geometry{}, 0.0));
  CHECK(d.source == dir / "czyx.npy");
  auto e = read_npy_image(dir / "line.npy");
  REQUIRE_FALSE(e.is_ok());
  CHECK(e.status().message().find("shape") != std::string::npos);
}

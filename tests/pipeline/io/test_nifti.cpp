// NIfTI reader/writer: round trips, agreement with nibabel and SimpleITK on files segflow
// wrote and on files it did not (nibabel's own test data, files nibabel writes), and errors
// for bad input.
#include <doctest/doctest.h>
#include <torch/torch.h>
#include <zlib.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <sstream>

#include "pipeline/io/nifti.hpp"
#include "test_util.hpp"

namespace fs = std::filesystem;
using nlohmann::json;
using segflow::Geometry;
using segflow::pipeline::Image;
using segflow::pipeline::read_nifti;
using segflow::pipeline::write_nifti;
namespace st = segflow::testing;

namespace {

constexpr double kPi = 3.14159265358979323846;

/// Rz(25 deg) * Rx(25 deg), anisotropic spacing, an origin away from 0.
Geometry oblique_geometry() {
  const double a = 25.0 * kPi / 180.0, c = std::cos(a), s = std::sin(a);
  const double rx[9] = {1, 0, 0, 0, c, -s, 0, s, c};
  const double rz[9] = {c, -s, 0, s, c, 0, 0, 0, 1};
  Geometry g;
  for (int r = 0; r < 3; ++r)
    for (int k = 0; k < 3; ++k) {
      double v = 0;
      for (int m = 0; m < 3; ++m) v += rz[r * 3 + m] * rx[m * 3 + k];
      g.direction[r * 3 + k] = v;
    }
  g.spacing = {0.7, 0.9, 2.5};
  g.origin = {-112.5, 85.25, 40.0};
  return g;
}

/// Random voxels: any bit pattern for integers, N(0, 500) for floats.
at::Tensor random_voxels(at::ScalarType type, std::vector<std::int64_t> shape, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  if (type == at::kFloat || type == at::kDouble) {
    at::Tensor t = torch::empty(shape, torch::TensorOptions().dtype(torch::kDouble));
    std::normal_distribution<double> normal(0.0, 500.0);
    auto* p = t.data_ptr<double>();
    for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = normal(rng);
    return t.to(type);
  }
  at::Tensor t = torch::empty(shape, torch::TensorOptions().dtype(type));
  auto* p = static_cast<unsigned char*>(t.data_ptr());
  for (std::int64_t i = 0; i < t.numel() * static_cast<std::int64_t>(t.element_size()); ++i)
    p[i] = static_cast<unsigned char>(rng());
  return t;
}

template <class T>
void patch(std::string& bytes, std::size_t offset, T value) {
  REQUIRE(offset + sizeof(T) <= bytes.size());
  std::memcpy(bytes.data() + offset, &value, sizeof(T));
}

template <class T>
T peek(const std::string& bytes, std::size_t offset) {
  T v;
  std::memcpy(&v, bytes.data() + offset, sizeof(T));
  return v;
}

/// reference.py many READER PATH...: one Python process for several files.
json reference_many(const std::string& reader, const std::vector<fs::path>& paths) {
  std::string cmd = st::shell_quote(st::python()) + " " +
                    st::shell_quote(st::source_path("tests/tools/reference.py").string()) + " many " + reader;
  for (const auto& p : paths) cmd.append(" ").append(st::shell_quote(p.string()));
  // stderr too (ITK's warnings, e.g. "unexpected scales in sform"), so that they show only
  // with a failure; the JSON object is the last line.
  auto r = st::run_command(cmd + " 2>&1");
  INFO(r.out);
  REQUIRE(r.exit_code == 0);
  std::string last = r.out;
  while (!last.empty() && last.back() == '\n') last.pop_back();
  last = last.substr(last.find_last_of('\n') == std::string::npos ? 0 : last.find_last_of('\n') + 1);
  // Python's json writes NaN for NaN voxels (resampled_anat_moved.nii has some); JSON has no
  // NaN, so it becomes null here and check_reference expects NaN where it finds null.
  std::string out;
  for (std::size_t i = 0; i < last.size(); ++i) {
    if (last.compare(i, 3, "NaN") == 0 && i > 0 && (last[i - 1] == ' ' || last[i - 1] == '[')) {
      out += "null";
      i += 2;
    } else {
      out += last[i];
    }
  }
  return json::parse(out);
}

/// nibabel's test data folder, found through the venv's nibabel (asked once per process).
fs::path nibabel_data_dir() {
  static const fs::path dir = [] {
    auto r = st::run_command(st::shell_quote(st::python()) +
                             " -c 'import nibabel, os; print(os.path.dirname(nibabel.__file__))'");
    if (r.exit_code != 0) throw std::runtime_error("cannot import nibabel: " + r.out);
    std::string s = r.out;
    while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
    return fs::path(s) / "tests" / "data";
  }();
  return dir;
}

bool near(double a, double b, double rel) {
  return std::abs(a - b) <= rel * std::max(1.0, std::max(std::abs(a), std::abs(b)));
}

/// `got` agrees with a reference value; null in the reference stands for NaN.
bool near(double got, const json& want, double rel) {
  return want.is_null() ? std::isnan(got) : near(got, want.get<double>(), rel);
}

/// numpy's dtype text ("int16", ">i2", "<f4") as a plain name ("int16", "float32").
std::string plain_dtype(std::string s) {
  if (!s.empty() && (s[0] == '<' || s[0] == '>' || s[0] == '|' || s[0] == '=')) {
    const std::string code = s.substr(1);
    static const std::map<std::string, std::string> names = {
        {"u1", "uint8"},  {"i1", "int8"},  {"i2", "int16"},  {"u2", "uint16"},  {"i4", "int32"},
        {"u4", "uint32"}, {"i8", "int64"}, {"u8", "uint64"}, {"f4", "float32"}, {"f8", "float64"}};
    auto it = names.find(code);
    return it == names.end() ? s : it->second;
  }
  return s;
}

struct Expect {
  bool geometry = true;   ///< compare spacing/origin/direction
  bool dtype = true;      ///< compare the element type
  double geo_tol = 1e-5;  ///< mm / direction cosine
  double value_rel = 1e-6;
  bool nan_as_zero = false;  ///< the reference reads NaN voxels as 0 (SimpleITK does)
};

/// Compares a segflow image with one reference.py object: size, geometry, stats, samples.
/// A 3-entry reference size (nibabel, or sitk on 3D) describes channel 0; a 4-entry one
/// (sitk on 4D) the whole (T, Z, Y, X) volume.
void check_reference(const Image& im, const json& ref, const std::string& what, const Expect& e = {}) {
  INFO(what);
  INFO(ref.dump().substr(0, 600));
  REQUIRE(ref.is_object());
  REQUIRE_FALSE(ref.contains("error"));
  const auto size = im.size();
  const bool four_d = ref["size"].size() == 4;
  for (int i = 0; i < 3; ++i) CHECK(ref["size"][i].get<std::int64_t>() == size[i]);
  if (four_d) CHECK(ref["size"][3].get<std::int64_t>() == im.channels());
  if (e.geometry) {
    for (int i = 0; i < 3; ++i) {
      CHECK(std::abs(ref["spacing"][i].get<double>() - im.geometry.spacing[i]) <= e.geo_tol);
      CHECK(std::abs(ref["origin"][i].get<double>() - im.geometry.origin[i]) <= e.geo_tol);
    }
    if (!four_d)  // reference.py gives no direction for a 4D SimpleITK image
      for (int i = 0; i < 9; ++i)
        CHECK(std::abs(ref["direction"][i].get<double>() - im.geometry.direction[i]) <= e.geo_tol);
  }
  if (e.dtype)
    CHECK(plain_dtype(ref["dtype"].get<std::string>()) == segflow::pipeline::dtype_name(im.voxels));
  at::Tensor v = im.voxels.to(at::kDouble);
  if (e.nan_as_zero) v = torch::nan_to_num(v, 0.0);
  at::Tensor part = four_d ? v : v[0];
  CHECK(near(part.min().item<double>(), ref["min"], e.value_rel));
  CHECK(near(part.max().item<double>(), ref["max"], e.value_rel));
  CHECK(near(part.mean().item<double>(), ref["mean"], std::max(e.value_rel, 1e-9)));
  auto acc = v.accessor<double, 4>();
  for (const auto& s : ref["voxels"]) {
    const auto i = s["zyx"].get<std::vector<std::int64_t>>();
    const double got = i.size() == 4 ? acc[i[0]][i[1]][i[2]][i[3]] : acc[0][i[0]][i[1]][i[2]];
    CHECK(near(got, s["value"], e.value_rel));
  }
}

Image make_image(at::ScalarType type, std::int64_t channels, std::uint64_t seed) {
  Image im;
  im.voxels = random_voxels(type, {channels, 5, 6, 7}, seed);
  im.geometry = oblique_geometry();
  return im;
}

/// A small int16 volume written by segflow, returned as file bytes.
std::string valid_file_bytes(const st::TempDir& dir) {
  Image im = make_image(at::kShort, 1, 3);
  const auto p = dir / "valid.nii";
  REQUIRE_OK(write_nifti(p, im));
  return st::read_file(p);
}

/// Writes `bytes` to `name` in `dir`, reads it, and returns the error message (REQUIREs failure).
std::string nifti_read_error(const st::TempDir& dir, const std::string& name, const std::string& bytes) {
  const auto p = dir / name;
  st::write_file(p, bytes);
  auto r = read_nifti(p);
  REQUIRE_FALSE(r.is_ok());
  const std::string msg = r.status().message();
  INFO(msg);
  CHECK(msg.find(p.string()) != std::string::npos);
  return msg;
}

}  // namespace

TEST_CASE(
    "NIfTI round trips keep every dtype's values and an oblique geometry, 3D and 4D, .nii and .nii.gz") {
  st::TempDir dir("nifti_rt");
  const at::ScalarType types[] = {at::kByte,   at::kChar, at::kShort,  at::kUInt16, at::kInt,
                                  at::kUInt32, at::kLong, at::kUInt64, at::kFloat,  at::kDouble};
  std::uint64_t seed = 1;
  for (auto type : types)
    for (std::int64_t channels : {1, 3})
      for (const char* ext : {".nii", ".nii.gz"}) {
        const std::string name =
            segflow::pipeline::dtype_name(torch::empty({0}, torch::TensorOptions().dtype(type))) + "_c" +
            std::to_string(channels) + ext;
        CAPTURE(name);
        Image im = make_image(type, channels, ++seed);
        const auto p = dir / name;
        REQUIRE_OK(write_nifti(p, im));
        CHECK_FALSE(segflow::testing::has_temporaries(dir.path()));
        REQUIRE_OK_AND_ASSIGN(auto back, read_nifti(p));
        CHECK((back.voxels.scalar_type() == type));
        CHECK(st::same_bytes(back.voxels, im.voxels));
        CHECK(segflow::geometry_close(back.geometry, im.geometry, 1e-5));
        CHECK(back.source == p);
        const std::string bytes = st::read_file(p);
        const bool gz = bytes.size() > 2 && static_cast<unsigned char>(bytes[0]) == 0x1f &&
                        static_cast<unsigned char>(bytes[1]) == 0x8b;
        CHECK(gz == std::string(ext).ends_with(".gz"));
      }
}

TEST_CASE("NIfTI files written by segflow read the same in nibabel and SimpleITK") {
  st::TempDir dir("nifti_ref");
  struct W {
    std::string name;
    at::ScalarType type;
    std::int64_t channels;
  };
  const std::vector<W> files = {{"ct_int16.nii.gz", at::kShort, 1},
                                {"mr_float32.nii", at::kFloat, 1},
                                {"labels_uint8.nii.gz", at::kByte, 1},
                                {"mr_uint16.nii", at::kUInt16, 1},
                                {"dwi_float64_4d.nii.gz", at::kDouble, 3}};
  std::vector<fs::path> paths;
  std::vector<Image> images;
  std::uint64_t seed = 100;
  for (const auto& f : files) {
    Image im = make_image(f.type, f.channels, ++seed);
    if (f.type == at::kByte) im.voxels = im.voxels.remainder(5);  // a label map: 0..4
    const auto p = dir / f.name;
    REQUIRE_OK(write_nifti(p, im));
    paths.push_back(p);
    images.push_back(im);
  }
  const json nib = reference_many("nibabel", paths);
  const json itk = reference_many("sitk", paths);
  for (std::size_t i = 0; i < paths.size(); ++i) {
    check_reference(images[i], nib[paths[i].string()], "nibabel: " + files[i].name);
    check_reference(images[i], itk[paths[i].string()], "sitk: " + files[i].name);
  }
}

namespace {

/// The files of nibabel's test data compared with reference readers; `itk`: SimpleITK 2.5
/// reads it too (it reads no NIfTI-2).
struct DataFile {
  const char* name;
  bool itk;
};
const DataFile kNibabelData[] = {
    {"anatomical.nii", true},          // big endian int16, sform = qform (code 2)
    {"example4d.nii.gz", true},        // 4D, oblique, an extension before vox_offset 416
    {"example_nifti2.nii.gz", false},  // NIfTI-2, 4D
    {"functional.nii", true},          // 4D int16 with scl_slope 0.0754, scl_inter 3100.8
    {"reoriented_anat_moved.nii", true},
    {"resampled_anat_moved.nii", true},  // big endian float32 with NaN voxels
    {"standard.nii.gz", true},           // sform only (qform_code 0)
};

void check_nibabel_data(const std::string& reader) {
  const fs::path data = nibabel_data_dir();
  std::vector<fs::path> paths;
  for (const auto& f : kNibabelData)
    if (reader == "nibabel" || f.itk) paths.push_back(data / f.name);
  const json ref = reference_many(reader, paths);
  for (const auto& p : paths) {
    const std::string name = p.filename().string();
    REQUIRE_OK_AND_ASSIGN(auto im, read_nifti(p));
    Expect e;
    e.value_rel = 1e-5;
    if (name == "functional.nii") {
      CHECK((im.voxels.scalar_type() == at::kFloat));  // scaled
      e.dtype = false;
    }
    e.nan_as_zero = reader == "sitk";  // ITK's NIfTI reader turns NaN voxels into 0
    check_reference(im, ref[p.string()], reader + ": " + name, e);
  }
}

}  // namespace

TEST_CASE("NIfTI files from nibabel's test data read as nibabel reads them") {
  check_nibabel_data("nibabel");
}

TEST_CASE("NIfTI-1 files from nibabel's test data read as SimpleITK reads them") {
  check_nibabel_data("sitk");
}

TEST_CASE("a CIFTI-2 NIfTI file (6 dimensions, no transform) reads its values as channels in file order") {
  // row_major.dconn.nii: NIfTI-2, dims (1, 1, 1, 1, 10, 10), sform and qform codes 0. The 100
  // values of dims 5 and 6 become channels in file order. nibabel opens it as CIFTI (no
  // affine, so reference.py cannot), hence the raw array from nibabel. Geometry follows
  // ITK's rule for a missing transform (nibabel would centre the grid and flip x).
  st::TempDir dir("nifti_cifti");
  const auto p = nibabel_data_dir() / "row_major.dconn.nii";
  st::run_python(
      "import sys, numpy as np, nibabel as nib\n"
      "a = np.asanyarray(nib.Nifti2Image.from_filename(sys.argv[1]).dataobj)\n"
      "assert a.shape == (1, 1, 1, 1, 10, 10), a.shape\n"
      "a.reshape(-1, order='F').astype('<f4').tofile(sys.argv[2])\n",
      {p.string(), (dir / "cifti.raw").string()});
  REQUIRE_OK_AND_ASSIGN(auto im, read_nifti(p));
  CHECK(im.voxels.sizes() == at::IntArrayRef({100, 1, 1, 1}));
  const std::string raw = st::read_file(dir / "cifti.raw");
  REQUIRE(raw.size() == 400);
  CHECK(std::memcmp(im.voxels.data_ptr(), raw.data(), 400) == 0);
  CHECK(segflow::geometry_close(im.geometry, Geometry{}, 1e-12));

  // nibabel's lone headers: a .hdr without its .img names the missing image file, and an
  // ANALYZE 7.5 header (no NIfTI magic) is refused.
  auto hdr = read_nifti(nibabel_data_dir() / "nifti1.hdr");
  REQUIRE_FALSE(hdr.is_ok());
  CHECK(hdr.status().message().find("nifti1.img") != std::string::npos);
  auto analyze = read_nifti(nibabel_data_dir() / "analyze.hdr");
  REQUIRE_FALSE(analyze.is_ok());
  CHECK(analyze.status().message().find("magic") != std::string::npos);
}

TEST_CASE("NIfTI files nibabel writes in every dtype, both byte orders, NIfTI-1 and NIfTI-2, read exactly") {
  st::TempDir dir("nifti_nib");
  const std::string gen = R"PY(
import sys, os, numpy as np, nibabel as nib
out = sys.argv[1]
rng = np.random.default_rng(7)
a = np.deg2rad(25.0); c, s = np.cos(a), np.sin(a)
d = np.array([[c, -s, 0], [s, c, 0], [0, 0, 1]]) @ np.array([[1, 0, 0], [0, c, -s], [0, s, c]])
flip = np.diag([-1.0, -1.0, 1.0])
aff = np.eye(4); aff[:3, :3] = flip @ d @ np.diag([0.7, 0.9, 2.5]); aff[:3, 3] = flip @ [-112.5, 85.25, 40.0]
i = 0
for ver in (1, 2):
    for endian in '<>':
        for dt in ['u1', 'i1', 'i2', 'u2', 'i4', 'u4', 'i8', 'u8', 'f4', 'f8']:
            for nd in (3, 4):
                shape = (7, 6, 5) + ((3,) if nd == 4 else ())
                if dt[0] == 'f':
                    arr = rng.normal(0, 100, shape).astype(dt)
                else:
                    info = np.iinfo(dt)
                    arr = rng.integers(info.min, info.max, shape, dtype=dt, endpoint=True)
                hdr = (nib.Nifti1Header if ver == 1 else nib.Nifti2Header)(endianness=endian)
                hdr.set_data_dtype(np.dtype(dt))
                img = (nib.Nifti1Image if ver == 1 else nib.Nifti2Image)(arr, aff, header=hdr)
                name = 'n%d_%s_%s_%dd.nii%s' % (ver, 'le' if endian == '<' else 'be', dt, nd, '.gz' if i % 2 else '')
                i += 1
                nib.save(img, os.path.join(out, name))
                zyx = arr.transpose(tuple(range(arr.ndim))[::-1])
                if nd == 3: zyx = zyx[None]
                np.ascontiguousarray(zyx).astype(np.dtype(dt).newbyteorder('<')).tofile(os.path.join(out, name + '.raw'))
                print(name)
)PY";
  std::istringstream names(st::run_python(gen, {dir.path().string()}));
  std::vector<fs::path> paths;
  for (std::string line; std::getline(names, line);)
    if (line.ends_with(".nii") || line.ends_with(".nii.gz")) paths.push_back(dir / line);
  REQUIRE(paths.size() == 80);
  const json nib = reference_many("nibabel", paths);
  for (const auto& p : paths) {
    CAPTURE(p.filename().string());
    REQUIRE_OK_AND_ASSIGN(auto im, read_nifti(p));
    const std::string raw = st::read_file(p.string() + ".raw");
    REQUIRE(static_cast<std::size_t>(im.voxels.numel() * im.voxels.element_size()) == raw.size());
    CHECK(std::memcmp(im.voxels.data_ptr(), raw.data(), raw.size()) == 0);
    CHECK(segflow::geometry_close(im.geometry, oblique_geometry(), 1e-5));
    Expect e;
    e.value_rel = 1e-12;
    check_reference(im, nib[p.string()], "nibabel", e);
  }
}

TEST_CASE("an RGB24 NIfTI image reads as three channels and a header/image pair reads like one file") {
  st::TempDir dir("nifti_rgb");
  const std::string gen = R"PY(
import sys, os, numpy as np, nibabel as nib
out = sys.argv[1]
x, y, z = np.meshgrid(np.arange(7), np.arange(6), np.arange(5), indexing='ij')
rgb = np.zeros((7, 6, 5), dtype=[('R', 'u1'), ('G', 'u1'), ('B', 'u1')])
rgb['R'] = x; rgb['G'] = 10 * y; rgb['B'] = 100 + z
aff = np.diag([-0.5, -0.6, 0.7, 1.0]); aff[:3, 3] = [1, 2, 3]
nib.save(nib.Nifti1Image(rgb, aff), os.path.join(out, 'rgb.nii.gz'))
vol = (x + 7 * y + 42 * z).astype('>i2')
nib.save(nib.Nifti1Pair(vol, aff), os.path.join(out, 'pair.img'))
)PY";
  st::run_python(gen, {dir.path().string()});

  REQUIRE_OK_AND_ASSIGN(auto rgb, read_nifti(dir / "rgb.nii.gz"));
  REQUIRE(rgb.voxels.sizes() == at::IntArrayRef({3, 5, 6, 7}));
  CHECK((rgb.voxels.scalar_type() == at::kByte));
  auto acc = rgb.voxels.accessor<std::uint8_t, 4>();
  bool all_ok = true;
  for (int z = 0; z < 5; ++z)
    for (int y = 0; y < 6; ++y)
      for (int x = 0; x < 7; ++x)
        all_ok = all_ok && acc[0][z][y][x] == x && acc[1][z][y][x] == 10 * y && acc[2][z][y][x] == 100 + z;
  CHECK(all_ok);
  Geometry g;
  g.spacing = {0.5, 0.6, 0.7};
  g.origin = {-1, -2, 3};
  CHECK(segflow::geometry_close(rgb.geometry, g, 1e-6));

  REQUIRE(fs::exists(dir / "pair.hdr"));
  REQUIRE_OK_AND_ASSIGN(auto pair, read_nifti(dir / "pair.hdr"));
  CHECK((pair.voxels.scalar_type() == at::kShort));
  const json ref = reference_many("nibabel", {dir / "pair.hdr"});
  check_reference(pair, ref[(dir / "pair.hdr").string()], "nibabel: pair.hdr");
}

TEST_CASE("NIfTI scl_slope and scl_inter give float32 values; slope 0 or (1, 0) keeps the stored type") {
  st::TempDir dir("nifti_scl");
  Image im = make_image(at::kShort, 1, 9);
  const auto src = dir / "raw.nii";
  REQUIRE_OK(write_nifti(src, im));
  std::string bytes = st::read_file(src);
  CHECK(peek<float>(bytes, 112) == 0.0f);  // segflow writes no scaling

  patch<float>(bytes, 112, 0.5f);
  patch<float>(bytes, 116, -1024.0f);
  st::write_file(dir / "scaled.nii", bytes);
  REQUIRE_OK_AND_ASSIGN(auto scaled, read_nifti(dir / "scaled.nii"));
  CHECK((scaled.voxels.scalar_type() == at::kFloat));
  CHECK(torch::allclose(scaled.voxels, im.voxels.to(at::kFloat) * 0.5 - 1024.0));

  patch<float>(bytes, 112, 1.0f);
  patch<float>(bytes, 116, 0.0f);
  st::write_file(dir / "unit.nii", bytes);
  REQUIRE_OK_AND_ASSIGN(auto unit, read_nifti(dir / "unit.nii"));
  CHECK(st::same_bytes(unit.voxels, im.voxels));

  patch<float>(bytes, 112, 1.0f);
  patch<float>(bytes, 116, 5.0f);  // slope 1 with an intercept still rescales
  st::write_file(dir / "shift.nii", bytes);
  REQUIRE_OK_AND_ASSIGN(auto shift, read_nifti(dir / "shift.nii"));
  CHECK((shift.voxels.scalar_type() == at::kFloat));
  CHECK(torch::equal(shift.voxels, im.voxels.to(at::kFloat) + 5.0));

  patch<float>(bytes, 112, std::nanf(""));  // NaN slope: no scaling (as nibabel)
  st::write_file(dir / "nan.nii", bytes);
  REQUIRE_OK_AND_ASSIGN(auto nan, read_nifti(dir / "nan.nii"));
  CHECK(st::same_bytes(nan.voxels, im.voxels));
}

TEST_CASE("NIfTI gzip is recognised by its magic bytes, not by the file name") {
  st::TempDir dir("nifti_gzname");
  Image im = make_image(at::kFloat, 2, 11);
  REQUIRE_OK(write_nifti(dir / "a.nii.gz", im));
  REQUIRE_OK(write_nifti(dir / "b.nii", im));
  fs::rename(dir / "a.nii.gz", dir / "gzip_named_plain.nii");
  fs::rename(dir / "b.nii", dir / "plain_named_gzip.nii.gz");
  for (const char* name : {"gzip_named_plain.nii", "plain_named_gzip.nii.gz"}) {
    CAPTURE(name);
    REQUIRE_OK_AND_ASSIGN(auto back, read_nifti(dir / name));
    CHECK(st::same_bytes(back.voxels, im.voxels));
    CHECK(segflow::geometry_close(back.geometry, im.geometry, 1e-5));
  }
}

TEST_CASE("NIfTI vox_offset is honoured and header extensions are skipped") {
  st::TempDir dir("nifti_ext");
  Image im = make_image(at::kInt, 1, 12);
  REQUIRE_OK(write_nifti(dir / "plain.nii", im));
  const std::string bytes = st::read_file(dir / "plain.nii");
  // Insert one 64-byte extension (esize 64, ecode 6 = comment) before the voxels.
  std::string ext(64, 'x');
  patch<std::int32_t>(ext, 0, 64);
  patch<std::int32_t>(ext, 4, 6);
  std::string with_ext = bytes.substr(0, 348) + std::string("\x01\0\0\0", 4) + ext + bytes.substr(352);
  patch<float>(with_ext, 108, 352.0f + 64);
  st::write_file(dir / "ext.nii", with_ext);
  REQUIRE_OK_AND_ASSIGN(auto back, read_nifti(dir / "ext.nii"));
  CHECK(st::same_bytes(back.voxels, im.voxels));
  const json ref = reference_many("nibabel", {dir / "ext.nii"});
  check_reference(back, ref[(dir / "ext.nii").string()], "nibabel: ext.nii");
}

TEST_CASE("NIfTI geometry from qform and pixdim follows SimpleITK when the sform is absent or unusable") {
  st::TempDir dir("nifti_geo");
  Image im = make_image(at::kShort, 1, 13);
  REQUIRE_OK(write_nifti(dir / "src.nii", im));
  const std::string bytes = st::read_file(dir / "src.nii");

  // qform only: the quaternion alone gives the oblique geometry.
  std::string q_only = bytes;
  patch<std::int16_t>(q_only, 254, 0);
  st::write_file(dir / "qform_only.nii", q_only);
  // sform scaled away from pixdim (x column * 1.5) next to a valid qform: ITK takes the qform.
  std::string bad_scales = bytes;
  for (std::size_t row : {280u, 296u, 312u})
    patch<float>(bad_scales, row, peek<float>(bad_scales, row) * 1.5f);
  st::write_file(dir / "sform_scales.nii", bad_scales);
  // Neither sform nor qform: pixdim spacing, zero origin, identity direction.
  std::string none = bytes;
  patch<std::int16_t>(none, 252, 0);
  patch<std::int16_t>(none, 254, 0);
  st::write_file(dir / "no_transform.nii", none);

  const std::vector<fs::path> paths = {dir / "qform_only.nii", dir / "sform_scales.nii",
                                       dir / "no_transform.nii"};
  const json itk = reference_many("sitk", paths);
  for (const auto& p : paths) {
    REQUIRE_OK_AND_ASSIGN(auto back, read_nifti(p));
    CHECK(st::same_bytes(back.voxels, im.voxels));
    check_reference(back, itk[p.string()], "sitk: " + p.filename().string());
  }
  CHECK(segflow::geometry_close(read_nifti(paths[0])->geometry, im.geometry, 1e-5));
  CHECK(segflow::geometry_close(read_nifti(paths[1])->geometry, im.geometry, 1e-5));
  Geometry pix;
  pix.spacing = im.geometry.spacing;
  CHECK(segflow::geometry_close(read_nifti(paths[2])->geometry, pix, 1e-6));

  // A sheared sform and no qform (ITK refuses it): column norms and the nearest rotation.
  std::string sheared = bytes;
  patch<std::int16_t>(sheared, 252, 0);
  patch<float>(sheared, 284, peek<float>(sheared, 284) + 0.3f);  // srow_x[1]
  st::write_file(dir / "sheared.nii", sheared);
  REQUIRE_OK_AND_ASSIGN(auto sh, read_nifti(dir / "sheared.nii"));
  CHECK(segflow::direction_is_orthonormal(sh.geometry.direction, 1e-9));
  CHECK(std::abs(sh.geometry.spacing[0] - 0.7) < 1e-5);
  CHECK(std::abs(sh.geometry.spacing[2] - 2.5) < 1e-5);
}

TEST_CASE("a truncated or empty NIfTI file is an error naming the file") {
  st::TempDir dir("nifti_trunc");
  const std::string bytes = valid_file_bytes(dir);
  CHECK(nifti_read_error(dir, "empty.nii", "").find("empty") != std::string::npos);
  CHECK(nifti_read_error(dir, "cut_data.nii", bytes.substr(0, bytes.size() - 100)).find("truncated") !=
        std::string::npos);
  CHECK(nifti_read_error(dir, "cut_header.nii", bytes.substr(0, 200)).find("truncated") != std::string::npos);
  CHECK(nifti_read_error(dir, "three_bytes.nii", bytes.substr(0, 3)).find("sizeof_hdr") != std::string::npos);

  Image im = make_image(at::kShort, 1, 3);
  REQUIRE_OK(write_nifti(dir / "full.nii.gz", im));
  const std::string gz = st::read_file(dir / "full.nii.gz");
  const std::string msg = nifti_read_error(dir, "cut.nii.gz", gz.substr(0, gz.size() / 2));
  CHECK((msg.find("truncated") != std::string::npos || msg.find("gzip") != std::string::npos));

  auto missing = read_nifti(dir / "missing.nii");
  REQUIRE_FALSE(missing.is_ok());
  CHECK((missing.status().code() == segflow::ErrorCode::not_found));
}

/// `bytes` as a gzip member holding one stored (uncompressed) deflate block.
std::string gzip_stored(const std::string& bytes) {
  REQUIRE(bytes.size() < 65536);
  const auto len = static_cast<std::uint16_t>(bytes.size());
  std::string gz = {'\x1f', '\x8b', 8, 0, 0, 0, 0, 0, 0, '\xff', 1};
  gz += static_cast<char>(len & 0xff);
  gz += static_cast<char>(len >> 8);
  gz += static_cast<char>(~len & 0xff);
  gz += static_cast<char>((~len >> 8) & 0xff);
  gz += bytes;
  const uLong crc = crc32(0L, reinterpret_cast<const Bytef*>(bytes.data()), static_cast<uInt>(bytes.size()));
  for (int i = 0; i < 4; ++i) gz += static_cast<char>((crc >> (8 * i)) & 0xff);
  for (int i = 0; i < 4; ++i) gz += static_cast<char>((bytes.size() >> (8 * i)) & 0xff);
  return gz;
}

TEST_CASE("a NIfTI header claiming more voxels than its file can hold fails before the allocation") {
  st::TempDir dir("nifti_claim");
  std::string b = valid_file_bytes(dir);
  // 32767^3 int16 voxels: 70 TB, far past memory, so an allocation attempt would fail as
  // "out of memory" instead of naming the truncation.
  for (std::size_t off : {42, 44, 46}) patch<std::int16_t>(b, off, 32767);
  const std::string plain = nifti_read_error(dir, "huge.nii", b);
  CHECK(plain.find("truncated: expected 70362301923678") != std::string::npos);
  CHECK(plain.find("out of memory") == std::string::npos);

  // Compressed, the file bounds the data too: deflate expands at most 1032:1.
  const std::string gz = nifti_read_error(dir, "huge.nii.gz", gzip_stored(b.substr(0, 352)));
  CHECK(gz.find("can hold at most") != std::string::npos);
  CHECK(gz.find("out of memory") == std::string::npos);

  // Just under the bound it is an honest truncation found while reading.
  for (std::size_t off : {44, 46}) patch<std::int16_t>(b, off, 1);
  patch<std::int16_t>(b, 42, 1000);  // 2000 bytes of voxels from a 380-byte gzip file
  const std::string small = nifti_read_error(dir, "short.nii.gz", gzip_stored(b.substr(0, 352)));
  CHECK(small.find("truncated") != std::string::npos);
  CHECK(small.find("can hold at most") == std::string::npos);
}

TEST_CASE("impossible NIfTI headers are errors naming the file and the field") {
  st::TempDir dir("nifti_bad");
  const std::string bytes = valid_file_bytes(dir);
  struct Case {
    std::string name, field;
    std::function<void(std::string&)> edit;
  };
  const std::vector<Case> cases = {
      {"dim0_9.nii", "dim[0]", [](std::string& b) { patch<std::int16_t>(b, 40, 9); }},
      {"dim0_0.nii", "dim[0]", [](std::string& b) { patch<std::int16_t>(b, 40, 0); }},
      {"dim2_neg.nii", "dim[2]: expected > 0, got -3",
       [](std::string& b) { patch<std::int16_t>(b, 44, -3); }},
      {"bitpix.nii", "bitpix", [](std::string& b) { patch<std::int16_t>(b, 72, 8); }},
      {"sizeof_hdr.nii", "sizeof_hdr", [](std::string& b) { patch<std::int32_t>(b, 0, 350); }},
      {"magic.nii", "magic", [](std::string& b) { b[346] = '9'; }},
      {"datatype.nii", "datatype", [](std::string& b) { patch<std::int16_t>(b, 70, 17); }},
      {"pixdim.nii", "pixdim[1]", [](std::string& b) { patch<float>(b, 80, 0.0f); }},
      {"pixdim_neg.nii", "pixdim[3]", [](std::string& b) { patch<float>(b, 88, -2.0f); }},
      // A spacing too small to take the qform's columns apart (found by fuzzing).
      {"pixdim_tiny.nii", "pixdim/srow_z: expected a finite voxel spacing above 1e-12 mm",
       [](std::string& b) { patch<float>(b, 88, 1e-30f); }},
      {"vox_offset.nii", "vox_offset", [](std::string& b) { patch<float>(b, 108, 100.0f); }},
      {"scl_inter.nii", "scl_inter",
       [](std::string& b) {
         patch<float>(b, 112, 2.0f);
         patch<float>(b, 116, INFINITY);
       }},
  };
  for (const auto& c : cases) {
    CAPTURE(c.name);
    std::string b = bytes;
    c.edit(b);
    const std::string msg = nifti_read_error(dir, c.name, b);
    CHECK(msg.find(c.field) != std::string::npos);
  }
  // The same checks hold for a big-endian header (byte order read from sizeof_hdr).
  const fs::path be = nibabel_data_dir() / "anatomical.nii";
  std::string b = st::read_file(be);
  b[40] = 0;
  b[41] = 9;  // dim[0] = 9, big endian
  CHECK(nifti_read_error(dir, "be_dim0.nii", b).find("dim[0]: expected 1..7, got 9") != std::string::npos);
}

TEST_CASE("complex NIfTI data and corrupt NIfTI gzip streams are clear errors") {
  st::TempDir dir("nifti_cplx");
  std::string bytes = valid_file_bytes(dir);
  patch<std::int16_t>(bytes, 70, 32);  // complex64
  patch<std::int16_t>(bytes, 72, 64);
  st::write_file(dir / "complex.nii", bytes);
  auto c = read_nifti(dir / "complex.nii");
  REQUIRE_FALSE(c.is_ok());
  CHECK((c.status().code() == segflow::ErrorCode::unsupported));
  CHECK(c.status().message().find("complex64") != std::string::npos);
  CHECK(c.status().message().find("datatype") != std::string::npos);

  Image im = make_image(at::kShort, 4, 21);
  REQUIRE_OK(write_nifti(dir / "good.nii.gz", im));
  std::string gz = st::read_file(dir / "good.nii.gz");
  for (std::size_t i = gz.size() / 2; i < gz.size() / 2 + 16; ++i) gz[i] = static_cast<char>(gz[i] ^ 0x5a);
  const std::string msg = nifti_read_error(dir, "corrupt.nii.gz", gz);
  CHECK(msg.find("gzip") != std::string::npos);
}

TEST_CASE("write_nifti rejects images NIfTI cannot hold and leaves no temporary file") {
  st::TempDir dir("nifti_wbad");
  Image im = make_image(at::kFloat, 1, 5);
  CHECK_FALSE(write_nifti(dir / "no_such_dir" / "x.nii", im).is_ok());
  Image five_d = im;
  five_d.voxels = im.voxels.unsqueeze(0);
  CHECK((write_nifti(dir / "five.nii", five_d).code() == segflow::ErrorCode::invalid_argument));
  Image bad_geo = im;
  bad_geo.geometry.spacing[1] = 0;
  const auto s = write_nifti(dir / "geo.nii", bad_geo);
  CHECK((s.code() == segflow::ErrorCode::invalid_argument));
  CHECK(s.message().find("spacing") != std::string::npos);
  Image complex = im;
  complex.voxels = torch::zeros({1, 2, 2, 2}, torch::TensorOptions().dtype(at::kComplexFloat));
  CHECK((write_nifti(dir / "complex.nii", complex).code() == segflow::ErrorCode::unsupported));
  CHECK_FALSE(segflow::testing::has_temporaries(dir.path()));
  // Bool masks are stored as uint8.
  Image mask = im;
  mask.voxels = im.voxels > 0;
  REQUIRE_OK(write_nifti(dir / "mask.nii.gz", mask));
  REQUIRE_OK_AND_ASSIGN(auto back, read_nifti(dir / "mask.nii.gz"));
  CHECK((back.voxels.scalar_type() == at::kByte));
  CHECK(torch::equal(back.voxels, mask.voxels.to(at::kByte)));
}

TEST_CASE("is_nifti_path recognises NIfTI names ending in .nii and .nii.gz") {
  using segflow::pipeline::is_nifti_path;
  CHECK(is_nifti_path("a/b.nii"));
  CHECK(is_nifti_path("b.nii.gz"));
  CHECK_FALSE(is_nifti_path("b.npy"));
  CHECK_FALSE(is_nifti_path("b.nii.bak"));
}

// Synthetic CT-like phantoms. Structures are defined in patient (LPS) space around a body
// centre, so a rotated or anisotropic grid samples the same anatomy, and labels and
// intensities always agree.
#include "pipeline/synth.hpp"

#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>
#include <random>

#include "messages/file_util.hpp"
#include "pipeline/io/dicom.hpp"
#include "pipeline/io/nifti.hpp"
#include "pipeline/io/npy.hpp"
#include "pipeline/options.hpp"

namespace segflow::pipeline {

namespace fs = std::filesystem;

namespace {

constexpr double kPi = 3.14159265358979323846;

/// Rotation matrix (row-major) from angles about x, y, z (radians), R = Rz * Ry * Rx.
std::array<double, 9> rotation(double ax, double ay, double az) {
  const double cx = std::cos(ax), sx = std::sin(ax), cy = std::cos(ay), sy = std::sin(ay), cz = std::cos(az),
               sz = std::sin(az);
  return {cz * cy,
          cz * sy * sx - sz * cx,
          cz * sy * cx + sz * sx,
          sz * cy,
          sz * sy * sx + cz * cx,
          sz * sy * cx - cz * sx,
          -sy,
          cy * sx,
          cy * cx};
}

/// An ellipsoid in body-normalised coordinates (the body spans about [-1, 1] per axis).
struct Ellipsoid {
  std::array<double, 3> centre;
  std::array<double, 3> radii;
  std::array<double, 9> rot;  ///< local axes as columns
};

/// Boolean mask of points (u: 3 tensors x, y, z) inside `e`, with an optional radial wobble.
at::Tensor inside(const std::array<at::Tensor, 3>& u, const Ellipsoid& e, double wobble = 0.0,
                  double freq = 3.0) {
  std::array<at::Tensor, 3> d;
  for (int i = 0; i < 3; ++i) d[i] = u[i] - e.centre[i];
  at::Tensor r2 = torch::zeros_like(d[0]);
  std::array<at::Tensor, 3> local;
  for (int c = 0; c < 3; ++c) {
    // local coordinate c = column c of rot dotted with d
    local[c] = d[0] * e.rot[0 * 3 + c] + d[1] * e.rot[1 * 3 + c] + d[2] * e.rot[2 * 3 + c];
    r2 = r2 + (local[c] / e.radii[c]).square();
  }
  if (wobble > 0.0) {
    at::Tensor ang = torch::atan2(local[1], local[0]);
    r2 = r2 * (1.0 + wobble * torch::sin(freq * ang + 2.0 * local[2] / e.radii[2]));
  }
  return r2 <= 1.0;
}

}  // namespace

const char* phantom_label_name(int label) {
  switch (label) {
    case 0:
      return "background";
    case 1:
      return "liver";
    case 2:
      return "spleen";
    case 3:
      return "kidney";
    case 4:
      return "spine";
    default:
      return "unknown";
  }
}

namespace {

/// The phantom's random numbers, drawn in a fixed order (the phantom depends on them only).
struct PhantomRng {
  std::mt19937_64 engine;
  std::uniform_real_distribution<double> uni{0.0, 1.0};
  /// Uniform in [a, b).
  double operator()(double a, double b) { return a + (b - a) * uni(engine); }
};

/// The phantom's grid: its geometry, size and where the body sits in it.
struct PhantomGrid {
  Geometry g;
  std::int64_t nx = 0, ny = 0, nz = 0;
  std::array<double, 3> centre{};    ///< body centre, mm (LPS)
  std::array<double, 3> half_fov{};  ///< half the field of view, mm, per axis
};

/// Grid: anisotropic spacing (random, or `spacing` with its jitter), thicker slices, roughly
/// cubic field of view; every third phantom oblique.
PhantomGrid phantom_grid(int size, int index, PhantomRng& U, const std::array<double, 3>& spacing,
                         double jitter) {
  PhantomGrid pg;
  Geometry& g = pg.g;
  const double rxy = U(0.7, 1.6);
  const double rz = U(1.5, 3.0);
  g.spacing = {rxy, rxy, rz};
  if (spacing[0] > 0) {  // drawn after the random pair, so the default draws stay as they were
    const double fxy = 1.0 + U(-jitter, jitter), fz = 1.0 + U(-jitter, jitter);
    g.spacing = {spacing[0] * fxy, spacing[1] * fxy, spacing[2] * fz};
  }
  const double sxy = g.spacing[0], sz = g.spacing[2];
  const std::int64_t nx = size, ny = size;
  const std::int64_t nz = std::max<std::int64_t>(16, std::llround(size * sxy / sz * 1.2));
  const bool oblique = index % 3 == 2;
  g.direction = oblique ? rotation(U(3, 8) * kPi / 180, 0.0, U(10, 25) * kPi / 180) : rotation(0, 0, 0);
  const std::array<double, 3> centre{U(-20, 20), U(-20, 20), U(-150, 150)};
  // origin such that the grid centre lands on the body centre
  const std::array<double, 3> half_idx{(nx - 1) / 2.0, (ny - 1) / 2.0, (nz - 1) / 2.0};
  for (int r = 0; r < 3; ++r) {
    double off = 0;
    for (int c = 0; c < 3; ++c) off += g.direction[r * 3 + c] * g.spacing[c] * half_idx[c];
    g.origin[r] = centre[r] - off;
  }
  pg.nx = nx, pg.ny = ny, pg.nz = nz;
  pg.centre = centre;
  pg.half_fov = {nx * sxy / 2.0, ny * g.spacing[1] / 2.0, nz * sz / 2.0};
  return pg;
}

/// Physical coordinates of every voxel, normalised by the half field of view: x, y, z, each
/// (Z, Y, X) float32.
std::array<at::Tensor, 3> body_coordinates(const PhantomGrid& pg) {
  const Geometry& g = pg.g;
  const std::int64_t nx = pg.nx, ny = pg.ny, nz = pg.nz;
  auto opts = torch::TensorOptions().dtype(torch::kFloat64);
  auto k = torch::arange(nz, opts).view({nz, 1, 1});
  auto j = torch::arange(ny, opts).view({1, ny, 1});
  auto i = torch::arange(nx, opts).view({1, 1, nx});
  std::array<at::Tensor, 3> u;
  for (int r = 0; r < 3; ++r) {
    at::Tensor p = g.origin[r] + g.direction[r * 3 + 0] * g.spacing[0] * i +
                   g.direction[r * 3 + 1] * g.spacing[1] * j + g.direction[r * 3 + 2] * g.spacing[2] * k;
    u[r] = ((p - pg.centre[r]) / pg.half_fov[r]).to(torch::kFloat32).expand({nz, ny, nx}).contiguous();
  }
  return u;
}

/// The anatomy: the body, its inside (below the fat layer) and the label map (1 liver,
/// 2 spleen, 3 kidneys, 4 spine), each (Z, Y, X).
struct Anatomy {
  at::Tensor in_body, in_inner, label;
};

Anatomy phantom_anatomy(const std::array<at::Tensor, 3>& u, PhantomRng& U, bool hard) {
  auto jitter = [&](std::array<double, 3> c, double d) {
    for (auto& v : c) v += U(-d, d);
    return c;
  };
  auto scale = [&](std::array<double, 3> r, double lo, double hi) {
    const double s = U(lo, hi);
    for (auto& v : r) v *= s * U(0.92, 1.08);
    return r;
  };
  const Ellipsoid body{{0, 0.02, 0}, {U(0.78, 0.88), U(0.58, 0.68), 1.2}, rotation(0, 0, 0)};
  Ellipsoid inner = body;
  for (auto& r : inner.radii) r -= 0.06;
  inner.radii[2] = body.radii[2];
  // Patient right is -x in LPS, posterior is +y.
  const Ellipsoid liver{jitter({-0.33, -0.02, 0.15}, 0.04), scale({0.32, 0.3, 0.42}, 0.9, 1.1),
                        rotation(0, 0, U(-0.3, 0.3))};
  Ellipsoid spleen{jitter({0.42, 0.22, 0.25}, 0.04), scale({0.12, 0.19, 0.26}, 0.85, 1.15),
                   rotation(U(-0.3, 0.3), 0, U(0.3, 0.7))};
  Ellipsoid kidney_r{jitter({-0.28, 0.3, -0.3}, 0.03), scale({0.1, 0.12, 0.2}, 0.85, 1.15),
                     rotation(0, 0, U(-0.4, -0.1))};
  if (hard) {
    // A thin spleen lying on the left kidney, and the right kidney pressed into the liver:
    // boundaries between structures, not only against the background.
    spleen.radii[0] *= 0.4;
    spleen.centre = {0.36 + U(-0.02, 0.02), 0.24 + U(-0.02, 0.02), -0.08 + U(-0.04, 0.04)};
    kidney_r.centre = {-0.28 + U(-0.02, 0.02), 0.22 + U(-0.02, 0.02), -0.1 + U(-0.03, 0.03)};
  }
  const Ellipsoid kidney_l{jitter({0.28, 0.3, -0.28}, 0.03), scale({0.1, 0.12, 0.2}, 0.85, 1.15),
                           rotation(0, 0, U(0.1, 0.4))};
  const Ellipsoid spine{jitter({0.0, 0.45, 0.0}, 0.02), {0.1, 0.1, 1.3}, rotation(0, 0, 0)};

  Anatomy a;
  a.in_body = inside(u, body, 0.02, 5.0);
  a.in_inner = inside(u, inner, 0.02, 5.0);
  at::Tensor m_liver = inside(u, liver, 0.15, 3.0) & a.in_inner;
  at::Tensor m_spleen = inside(u, spleen, 0.25, 2.0) & a.in_inner;
  at::Tensor m_kidney = (inside(u, kidney_r, 0.1, 2.0) | inside(u, kidney_l, 0.1, 2.0)) & a.in_inner;
  at::Tensor m_spine = inside(u, spine, 0.0) & a.in_inner;

  a.label = torch::zeros(a.in_body.sizes(), torch::kUInt8);
  a.label.masked_fill_(m_liver, 1);
  a.label.masked_fill_(m_spleen, 2);
  a.label.masked_fill_(m_kidney, 3);
  a.label.masked_fill_(m_spine, 4);
  return a;
}

/// HU per tissue, then a smooth bias field (low-frequency, +-30 HU inside the body) and
/// Gaussian noise; rounded and clamped to -1024..3071.
at::Tensor phantom_hu(const Anatomy& a, const std::array<at::Tensor, 3>& u, PhantomRng& U, bool hard) {
  const auto& label = a.label;
  double hu_tissue = U(20, 40), hu_liver = U(90, 110), hu_spleen = U(140, 160), hu_kidney = U(190, 220),
         hu_bone = U(450, 650);
  if (hard) {  // unenhanced CT: soft tissues 8-15 HU apart
    hu_tissue = U(38, 44);
    hu_liver = hu_tissue + U(10, 14);
    hu_spleen = hu_liver + U(8, 12);
    hu_kidney = hu_spleen + U(8, 12);
    hu_bone = U(250, 350);
  }
  auto hu = torch::full(label.sizes(), -1000.0f);
  hu.masked_fill_(a.in_body, -100.0f);  // subcutaneous fat
  hu.masked_fill_(a.in_inner, static_cast<float>(hu_tissue));
  hu.masked_fill_(label == 1, static_cast<float>(hu_liver));
  hu.masked_fill_(label == 2, static_cast<float>(hu_spleen));
  hu.masked_fill_(label == 3, static_cast<float>(hu_kidney));
  hu.masked_fill_(label == 4, static_cast<float>(hu_bone));

  auto gen = at::make_generator<at::CPUGeneratorImpl>(U.engine());
  const double fx = U(0.5, 1.5), fy = U(0.5, 1.5), fz = U(0.3, 1.0), ph = U(0, 2 * kPi);
  at::Tensor bias = (hard ? 70.0 : 30.0) * torch::sin(fx * u[0] + ph) * torch::cos(fy * u[1] - 0.5 * ph) *
                    torch::cos(fz * u[2]);
  at::Tensor noise = torch::randn(label.sizes(), gen, torch::kFloat32) * (hard ? U(25, 35) : U(12, 20));
  hu = torch::where(a.in_body, hu + bias + noise, hu + noise * 0.3);
  return hu.round().clamp(-1024, 3071);
}

}  // namespace

Phantom make_phantom(int size, std::uint64_t seed, int index, const std::array<double, 3>& spacing,
                     double spacing_jitter, bool hard) {
  torch::NoGradGuard no_grad;
  PhantomRng U{std::mt19937_64(seed * 1000003ULL + static_cast<std::uint64_t>(index) * 7919ULL + 17ULL)};
  // Hard phantoms are thick-slice CT unless a spacing is given.
  const bool thick = hard && spacing[0] == 0 && spacing[1] == 0 && spacing[2] == 0;
  const PhantomGrid grid = phantom_grid(
      size, index, U, thick ? std::array<double, 3>{0.7, 0.7, 5.0} : spacing, thick ? 0.15 : spacing_jitter);
  const std::array<at::Tensor, 3> u = body_coordinates(grid);
  const Anatomy anatomy = phantom_anatomy(u, U, hard);
  const at::Tensor hu = phantom_hu(anatomy, u, U, hard);

  Phantom ph_out;
  ph_out.image.voxels = hu.unsqueeze(0).contiguous();
  ph_out.image.geometry = grid.g;
  ph_out.image.modality = "CT";
  ph_out.label.voxels = anatomy.label.unsqueeze(0).contiguous();
  ph_out.label.geometry = grid.g;
  ph_out.label.modality = "SEG";
  return ph_out;
}

namespace {

Status validate(const SynthOptions& o) {
  if (o.cases < 1 || o.cases > 100000)
    return invalid_argument("--cases: expected 1..100000, got " + std::to_string(o.cases));
  if (o.size < 16 || o.size > 512)
    return invalid_argument("--size: expected 16..512, got " + std::to_string(o.size));
  if (o.format != "dicom" && o.format != "nifti" && o.format != "npy")
    return invalid_argument("--format: expected dicom, nifti or npy, got '" + o.format + "'");
  if (o.out.empty()) return invalid_argument("--out: expected an output folder, got nothing");
  const bool any = o.spacing[0] != 0 || o.spacing[1] != 0 || o.spacing[2] != 0;
  if (any && !(o.spacing[0] > 0 && o.spacing[1] > 0 && o.spacing[2] > 0))
    return invalid_argument("--spacing: expected 3 positive numbers (x, y, z mm), got " +
                            std::to_string(o.spacing[0]) + "," + std::to_string(o.spacing[1]) + "," +
                            std::to_string(o.spacing[2]));
  if (!(o.spacing_jitter >= 0 && o.spacing_jitter <= 0.9))
    return invalid_argument("--spacing-jitter: expected a number in [0, 0.9], got " +
                            std::to_string(o.spacing_jitter));
  if (o.spacing_jitter > 0 && !any) return invalid_argument("--spacing-jitter: needs --spacing");
  if (o.difficulty != "normal" && o.difficulty != "hard")
    return invalid_argument("--difficulty: expected normal or hard, got '" + o.difficulty + "'");
  if (o.compress != "none" && o.format != "dicom")
    return invalid_argument("--compress: only applies to --format dicom, got --format " + o.format);
  auto c = parse_dicom_compression(o.compress);
  if (!c.is_ok()) return c.status().with_context("--compress");
  return Status::ok();
}

std::string case_id(int i) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "case_%03d", i);
  return buf;
}

Status write_json(const fs::path& p, const nlohmann::json& j) {
  return write_file_atomically(p, j.dump(2) + '\n');
}

}  // namespace

void SynthOptions::bind(OptionParser& p) {
  p.integer("cases", cases, Range::closed(1, 100000), "cases", "number of cases");
  p.integer("size", size, Range::closed(16, 512), "voxels", "in-plane size (x = y = size)");
  p.choice("format", format, {"dicom", "nifti", "npy"},
           "dataset layout: DICOM case folders, MSD NIfTI, MedSAM npy");
  p.string("compress", compress, "DICOM transfer syntax: none, rle, jpeg-ls, jpeg-lossless");
  if (auto c = parse_dicom_compression(compress); !c.is_ok()) {
    const std::string m = c.status().message();  // "compression: expected one of ..., got ..."
    const auto at = m.find("expected");
    p.fail("compress", at == std::string::npos ? m : m.substr(at));
  } else if (compress != "none" && format != "dicom")
    p.fail("compress",
           "expected none unless format is dicom, got \"" + compress + "\" with format " + format);
  p.integer("seed", seed, Range::non_negative(), "", "dataset seed; case i uses (seed, i)");
  p.choice(
      "difficulty", difficulty, {"normal", "hard"},
      "normal phantoms, or hard ones: low contrast, strong noise and bias, touching and thin structures, "
      "0.7 x 0.7 x 5 mm voxels");
}

Status synthesize_dataset(const SynthOptions& o) {
  SEGFLOW_RETURN_IF_ERROR(validate(o));
  std::error_code ec;
  fs::create_directories(o.out, ec);
  if (ec) return io_error(o.out.string() + ": cannot create folder: " + ec.message());
  const auto compression = parse_dicom_compression(o.compress).value();

  nlohmann::json labels_msd = nlohmann::json::object();
  nlohmann::json labels_v2 = nlohmann::json::object();
  for (int l = 0; l <= kPhantomLabels; ++l) {
    labels_msd[std::to_string(l)] = phantom_label_name(l);
    labels_v2[phantom_label_name(l)] = l;
  }
  nlohmann::json training = nlohmann::json::array();

  for (int i = 0; i < o.cases; ++i) {
    const std::string id = case_id(i);
    Phantom ph = make_phantom(o.size, o.seed, i, o.spacing, o.spacing_jitter, o.difficulty == "hard");
    if (o.format == "nifti") {
      fs::create_directories(o.out / "imagesTr");
      fs::create_directories(o.out / "labelsTr");
      Image img = ph.image;
      img.voxels = img.voxels.to(torch::kInt16);  // integer HU, as CT NIfTI files store them
      SEGFLOW_RETURN_IF_ERROR(write_nifti(o.out / "imagesTr" / (id + "_0000.nii.gz"), img));
      SEGFLOW_RETURN_IF_ERROR(write_nifti(o.out / "labelsTr" / (id + ".nii.gz"), ph.label));
      training.push_back(
          {{"image", "./imagesTr/" + id + "_0000.nii.gz"}, {"label", "./labelsTr/" + id + ".nii.gz"}});
    } else if (o.format == "npy") {
      fs::create_directories(o.out / "imgs");
      fs::create_directories(o.out / "gts");
      SEGFLOW_RETURN_IF_ERROR(
          write_npy(o.out / "imgs" / (id + ".npy"), ph.image.voxels[0].to(torch::kInt16)));
      SEGFLOW_RETURN_IF_ERROR(write_npy(o.out / "gts" / (id + ".npy"), ph.label.voxels[0]));
      training.push_back({{"image", "./imgs/" + id + ".npy"}, {"label", "./gts/" + id + ".npy"}});
    } else {
      const fs::path dir = o.out / id;
      fs::create_directories(dir);
      DicomWriteOptions w;
      w.compression = compression;
      w.patient_id = "SEGFLOW_" + id;
      w.series_description = "segflow synthetic CT " + id;
      SEGFLOW_ASSIGN_OR_RETURN(auto series, write_dicom_series(dir, ph.image, w));
      SEGFLOW_RETURN_IF_ERROR(write_dicom_seg(dir / "seg.dcm", ph.label, series));
      training.push_back({{"image", "./" + id}, {"label", "./" + id + "/seg.dcm"}});
    }
  }
  nlohmann::json ds = {
      {"name", "segflow-phantoms"},
      {"description", "Synthetic CT-like phantoms written by segflow synth"},
      {"tensorImageSize", "3D"},
      {"modality", {{"0", "CT"}}},
      {"channel_names", {{"0", "CT"}}},
      {"labels", o.format == "nifti" ? labels_v2 : labels_msd},
      {"numTraining", o.cases},
      {"file_ending", o.format == "nifti" ? ".nii.gz" : (o.format == "npy" ? ".npy" : ".dcm")},
      {"training", training},
      {"segflow",
       {{"format", o.format},
        {"size", o.size},
        {"seed", o.seed},
        {"compress", o.compress},
        {"difficulty", o.difficulty}}},
  };
  return write_json(o.out / "dataset.json", ds);
}

}  // namespace segflow::pipeline

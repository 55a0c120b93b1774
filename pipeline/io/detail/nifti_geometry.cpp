#include "pipeline/io/detail/nifti_geometry.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>

namespace segflow::pipeline::detail {

namespace {

using Mat3 = std::array<double, 9>;  // row-major
double& at(Mat3& m, int r, int c) { return m[r * 3 + c]; }
double at(const Mat3& m, int r, int c) { return m[r * 3 + c]; }

double det(const Mat3& m) {
  return at(m, 0, 0) * (at(m, 1, 1) * at(m, 2, 2) - at(m, 1, 2) * at(m, 2, 1)) -
         at(m, 0, 1) * (at(m, 1, 0) * at(m, 2, 2) - at(m, 1, 2) * at(m, 2, 0)) +
         at(m, 0, 2) * (at(m, 1, 0) * at(m, 2, 1) - at(m, 1, 1) * at(m, 2, 0));
}

double column_norm(const Mat3& m, int c) {
  return std::sqrt(at(m, 0, c) * at(m, 0, c) + at(m, 1, c) * at(m, 1, c) + at(m, 2, c) * at(m, 2, c));
}

bool all_finite(const Mat3& m) {
  return std::all_of(m.begin(), m.end(), [](double v) { return std::isfinite(v); });
}

/// The shortest column (voxel spacing, mm) that normalize_columns takes apart.
constexpr double kMinColumnNorm = 1e-12;

/// m with each column divided by its norm; false when a column is (nearly) zero.
bool normalize_columns(const Mat3& m, Mat3& out, std::array<double, 3>& norms) {
  for (int c = 0; c < 3; ++c) {
    norms[c] = column_norm(m, c);
    if (!(norms[c] > kMinColumnNorm)) return false;
    for (int r = 0; r < 3; ++r) at(out, r, c) = at(m, r, c) / norms[c];
  }
  return true;
}

bool orthonormal(const Mat3& d, double tol) {
  for (int a = 0; a < 3; ++a)
    for (int b = 0; b < 3; ++b) {
      double dot = 0;
      for (int r = 0; r < 3; ++r) dot += at(d, r, a) * at(d, r, b);
      if (std::abs(dot - (a == b ? 1.0 : 0.0)) > tol) return false;
    }
  return true;
}

/// Nearest orthogonal matrix (polar decomposition by Newton iteration X <- (X + X^-T) / 2).
Mat3 nearest_rotation(Mat3 x) {
  for (int it = 0; it < 100; ++it) {
    const double dt = det(x);
    if (std::abs(dt) < 1e-300) break;
    Mat3 inv_t;  // (X^-1)^T = cofactor(X) / det
    for (int r = 0; r < 3; ++r)
      for (int c = 0; c < 3; ++c) {
        const int r1 = (r + 1) % 3, r2 = (r + 2) % 3, c1 = (c + 1) % 3, c2 = (c + 2) % 3;
        at(inv_t, r, c) = (at(x, r1, c1) * at(x, r2, c2) - at(x, r1, c2) * at(x, r2, c1)) / dt;
      }
    double change = 0;
    for (int i = 0; i < 9; ++i) {
      const double v = 0.5 * (x[i] + inv_t[i]);
      change = std::max(change, std::abs(v - x[i]));
      x[i] = v;
    }
    if (change < 1e-15) break;
  }
  return x;
}

/// nifti1_io's nifti_quatern_to_mat44 (3x3 part), in double precision.
Mat3 quatern_to_matrix(double b, double c, double d, double dx, double dy, double dz, double qfac) {
  double a = 1.0 - (b * b + c * c + d * d);
  if (a < 1e-7) {  // 180 degree rotation: normalize (b, c, d)
    a = 1.0 / std::sqrt(b * b + c * c + d * d);
    b *= a;
    c *= a;
    d *= a;
    a = 0.0;
  } else {
    a = std::sqrt(a);
  }
  const double xd = dx > 0 ? dx : 1.0, yd = dy > 0 ? dy : 1.0;
  double zd = dz > 0 ? dz : 1.0;
  if (qfac < 0) zd = -zd;
  Mat3 r;
  at(r, 0, 0) = (a * a + b * b - c * c - d * d) * xd;
  at(r, 0, 1) = 2.0 * (b * c - a * d) * yd;
  at(r, 0, 2) = 2.0 * (b * d + a * c) * zd;
  at(r, 1, 0) = 2.0 * (b * c + a * d) * xd;
  at(r, 1, 1) = (a * a + c * c - b * b - d * d) * yd;
  at(r, 1, 2) = 2.0 * (c * d - a * b) * zd;
  at(r, 2, 0) = 2.0 * (b * d - a * c) * xd;
  at(r, 2, 1) = 2.0 * (c * d + a * b) * yd;
  at(r, 2, 2) = (a * a + d * d - c * c - b * b) * zd;
  return r;
}

/// nifti1_io's nifti_mat44_to_quatern for an orthogonal matrix: (b, c, d) and qfac.
void matrix_to_quatern(Mat3 r, double& qb, double& qc, double& qd, double& qfac) {
  if (det(r) > 0) {
    qfac = 1.0;
  } else {
    qfac = -1.0;
    for (int i = 0; i < 3; ++i) at(r, i, 2) = -at(r, i, 2);
  }
  const double r11 = at(r, 0, 0), r12 = at(r, 0, 1), r13 = at(r, 0, 2);
  const double r21 = at(r, 1, 0), r22 = at(r, 1, 1), r23 = at(r, 1, 2);
  const double r31 = at(r, 2, 0), r32 = at(r, 2, 1), r33 = at(r, 2, 2);
  double a = r11 + r22 + r33 + 1.0, b, c, d;
  if (a > 0.5) {
    a = 0.5 * std::sqrt(a);
    b = 0.25 * (r32 - r23) / a;
    c = 0.25 * (r13 - r31) / a;
    d = 0.25 * (r21 - r12) / a;
  } else {
    const double xd = 1.0 + r11 - (r22 + r33), yd = 1.0 + r22 - (r11 + r33), zd = 1.0 + r33 - (r11 + r22);
    if (xd > 1.0) {
      b = 0.5 * std::sqrt(xd);
      c = 0.25 * (r12 + r21) / b;
      d = 0.25 * (r13 + r31) / b;
      a = 0.25 * (r32 - r23) / b;
    } else if (yd > 1.0) {
      c = 0.5 * std::sqrt(yd);
      b = 0.25 * (r12 + r21) / c;
      d = 0.25 * (r23 + r32) / c;
      a = 0.25 * (r13 - r31) / c;
    } else {
      d = 0.5 * std::sqrt(zd);
      b = 0.25 * (r13 + r31) / d;
      c = 0.25 * (r23 + r32) / d;
      a = 0.25 * (r21 - r12) / d;
    }
    if (a < 0.0) {
      b = -b;
      c = -c;
      d = -d;
    }
  }
  qb = b;
  qc = c;
  qd = d;
}

/// The error for a voxel spacing (a transform column's length) that is not finite or too short.
Status spacing_error(const std::string& file, int axis, double spacing) {
  static const char* kField[] = {"pixdim/srow_x", "pixdim/srow_y", "pixdim/srow_z"};
  char got[32];
  std::snprintf(got, sizeof got, "%g", spacing);
  return corrupt_data(file + ": " + kField[axis] + ": expected a finite voxel spacing above 1e-12 mm, got " +
                      got);
}

/// Geometry of a RAS affine (3x3 part and offset): flip to LPS, split spacing and direction.
/// A column too short to split is refused here, naming its axis.
Result<Geometry> from_ras(const Mat3& ras, const std::array<double, 3>& offset, bool make_rotation,
                          const std::string& file) {
  Mat3 lps = ras;
  for (int c = 0; c < 3; ++c) {
    at(lps, 0, c) = -at(lps, 0, c);
    at(lps, 1, c) = -at(lps, 1, c);
  }
  Geometry g;
  g.origin = {-offset[0], -offset[1], offset[2]};
  Mat3 dir{};
  std::array<double, 3> norms{};
  if (!normalize_columns(lps, dir, norms))
    for (int c = 0; c < 3; ++c)
      if (!(norms[c] > kMinColumnNorm)) return spacing_error(file, c, norms[c]);
  if (make_rotation) dir = nearest_rotation(dir);
  g.spacing = norms;
  g.direction = dir;
  return g;
}

}  // namespace

Result<NiftiGeometry> nifti_to_geometry(const NiftiHeader& h, const std::string& file) {
  const int nd = static_cast<int>(std::min<std::int64_t>(h.dim[0], 3));
  std::array<double, 3> pix{1.0, 1.0, 1.0};
  for (int i = 0; i < nd; ++i)
    pix[i] = std::isfinite(h.pixdim[i + 1]) && h.pixdim[i + 1] > 0 ? h.pixdim[i + 1] : 1.0;

  Mat3 s{};
  std::array<double, 3> s_off{};
  for (int r = 0; r < 3; ++r) {
    for (int c = 0; c < 3; ++c) at(s, r, c) = h.srow[r][c];
    s_off[r] = h.srow[r][3];
  }
  if (nd == 2 && column_norm(s, 2) < kMinColumnNorm) {
    // A 2D image may leave the slice axis of its sform empty: complete it by the cross product.
    const double n0 = column_norm(s, 0), n1 = column_norm(s, 1);
    if (n0 > 0 && n1 > 0) {
      at(s, 0, 2) = (at(s, 1, 0) * at(s, 2, 1) - at(s, 2, 0) * at(s, 1, 1)) / (n0 * n1);
      at(s, 1, 2) = (at(s, 2, 0) * at(s, 0, 1) - at(s, 0, 0) * at(s, 2, 1)) / (n0 * n1);
      at(s, 2, 2) = (at(s, 0, 0) * at(s, 1, 1) - at(s, 1, 0) * at(s, 0, 1)) / (n0 * n1);
    }
  }
  bool s_usable = false, s_rigid = false, s_scales_match = false;
  if (h.sform_code > 0 && all_finite(s) &&
      std::all_of(s_off.begin(), s_off.end(), [](double v) { return std::isfinite(v); })) {
    Mat3 dir{};
    std::array<double, 3> norms{};
    s_usable = normalize_columns(s, dir, norms) && std::abs(det(dir)) > 1e-6;
    s_rigid = s_usable && orthonormal(dir, 1e-4);
    s_scales_match = true;
    for (int i = 0; i < nd; ++i)
      if (std::abs(norms[i] - pix[i]) > 1e-4 * std::max(1.0, pix[i])) s_scales_match = false;
  }
  const bool q_present = h.qform_code > 0;

  NiftiGeometry out;
  if (s_rigid && (!q_present || s_scales_match)) {
    SEGFLOW_ASSIGN_OR_RETURN(out.geometry, from_ras(s, s_off, false, file));
    out.source = NiftiTransform::sform;
  } else if (q_present) {
    const double q[6] = {h.quatern_b, h.quatern_c, h.quatern_d, h.qoffset_x, h.qoffset_y, h.qoffset_z};
    for (double v : q)
      if (!std::isfinite(v))
        return corrupt_data(file + ": quatern_b/c/d, qoffset_x/y/z: expected finite numbers for qform_code " +
                            std::to_string(h.qform_code) + ", got a NaN or infinity");
    const Mat3 m =
        quatern_to_matrix(h.quatern_b, h.quatern_c, h.quatern_d, pix[0], pix[1], pix[2], h.pixdim[0]);
    SEGFLOW_ASSIGN_OR_RETURN(out.geometry, from_ras(m, {h.qoffset_x, h.qoffset_y, h.qoffset_z}, false, file));
    out.source = NiftiTransform::qform;
  } else if (s_usable) {
    SEGFLOW_ASSIGN_OR_RETURN(out.geometry, from_ras(s, s_off, true, file));
    out.source = NiftiTransform::sform;
  } else if (h.sform_code > 0) {
    return corrupt_data(file + ": srow_x/srow_y/srow_z: sform_code " + std::to_string(h.sform_code) +
                        " but the sform is singular or not finite, and there is no qform (qform_code 0)");
  } else {
    out.geometry.spacing = pix;
    out.source = NiftiTransform::pixdim;
  }
  // A finite transform can still overflow to an infinite column length, and pixdim alone can
  // be tiny (found by fuzzing: tests/fuzz/regressions/nifti/).
  for (int i = 0; i < 3; ++i) {
    const double sp = out.geometry.spacing[i], o = out.geometry.origin[i];
    if (!(std::isfinite(sp) && sp > kMinColumnNorm)) return spacing_error(file, i, sp);
    if (!std::isfinite(o))
      return corrupt_data(file + ": qoffset/srow offset: expected a finite origin, got " + std::to_string(o));
  }
  if (!orthonormal(out.geometry.direction, 1e-3))
    return corrupt_data(file + ": quatern_b/c/d or srow_x/y/z: the transform gives no orthonormal direction");
  return out;
}

Status geometry_to_nifti(const Geometry& g, NiftiHeader& h) {
  for (int i = 0; i < 3; ++i)
    if (!(g.spacing[i] > 0) || !std::isfinite(g.spacing[i]))
      return invalid_argument("geometry.spacing[" + std::to_string(i) + "]: expected > 0 mm, got " +
                              std::to_string(g.spacing[i]));
  Mat3 d = g.direction;
  if (!all_finite(d) || !orthonormal(d, 1e-3))
    return invalid_argument("geometry.direction: expected an orthonormal 3x3 matrix, got " + describe(g));
  // LPS -> RAS: negate the first two rows.
  Mat3 r = d;
  for (int c = 0; c < 3; ++c) {
    at(r, 0, c) = -at(r, 0, c);
    at(r, 1, c) = -at(r, 1, c);
  }
  const std::array<double, 3> off{-g.origin[0], -g.origin[1], g.origin[2]};
  for (int row = 0; row < 3; ++row) {
    for (int c = 0; c < 3; ++c) h.srow[row][c] = at(r, row, c) * g.spacing[c];
    h.srow[row][3] = off[row];
  }
  double qfac = 1.0;
  matrix_to_quatern(nearest_rotation(r), h.quatern_b, h.quatern_c, h.quatern_d, qfac);
  h.qoffset_x = off[0];
  h.qoffset_y = off[1];
  h.qoffset_z = off[2];
  h.pixdim[0] = qfac;
  for (int i = 0; i < 3; ++i) h.pixdim[i + 1] = g.spacing[i];
  h.qform_code = 1;
  h.sform_code = 1;
  return Status::ok();
}

}  // namespace segflow::pipeline::detail

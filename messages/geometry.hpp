#pragma once
// Image geometry in DICOM/ITK conventions: LPS patient coordinates, (x, y, z) =
// (column, row, slice) order as SimpleITK reports it. Tensors are (C, Z, Y, X).

#include <array>
#include <cstdint>
#include <string>

namespace segflow {

/// Physical placement of a voxel grid. Physical point of index (i, j, k) (x, y, z order):
///   p = origin + D * diag(spacing) * [i, j, k]^T, D = direction (row-major, columns are axes).
struct Geometry {
  std::array<double, 3> spacing{1.0, 1.0, 1.0};                ///< mm between voxel centres, (x, y, z), > 0
  std::array<double, 3> origin{0.0, 0.0, 0.0};                 ///< LPS mm of the centre of voxel (0, 0, 0)
  std::array<double, 9> direction{1, 0, 0, 0, 1, 0, 0, 0, 1};  ///< row-major 3x3, orthonormal
};

/// Size of a grid in (x, y, z) order.
using Size3 = std::array<std::int64_t, 3>;

/// LPS point of a continuous index (x, y, z order).
std::array<double, 3> index_to_physical(const Geometry& g, const std::array<double, 3>& index);

/// True when spacing, origin and direction agree within `tol` (mm for spacing/origin,
/// absolute for direction cosines).
bool geometry_close(const Geometry& a, const Geometry& b, double tol = 1e-4);

/// True when the direction matrix is orthonormal within `tol`.
bool direction_is_orthonormal(const std::array<double, 9>& d, double tol = 1e-3);

/// "spacing=[..] origin=[..] direction=[..]" for error messages and logs.
std::string describe(const Geometry& g);

}  // namespace segflow

#pragma once
// NIfTI transforms (sform, qform, pixdim) <-> segflow Geometry (LPS, ITK conventions).
// Private to pipeline/io/nifti.cpp.

#include <string>

#include "messages/geometry.hpp"
#include "messages/status.hpp"
#include "pipeline/io/detail/nifti_header.hpp"

namespace segflow::pipeline::detail {

/// Where a geometry came from.
enum class NiftiTransform { sform, qform, pixdim };

/// A geometry and the header transform it was taken from.
struct NiftiGeometry {
  Geometry geometry;
  NiftiTransform source = NiftiTransform::pixdim;
};

/// Geometry of a validated header. Rules (agreeing with ITK 5.4 on every file where ITK
/// reads one rigid transform):
///  1. sform, when sform_code > 0, its normalized columns are orthonormal (1e-4) and, if a
///     qform is also present, its column norms equal pixdim[1..3] (ITK warns "unexpected
///     scales in sform" and takes the qform otherwise);
///  2. else qform, when qform_code > 0 (quaternion, qfac = sign of pixdim[0], pixdim scales);
///  3. else a sheared sform with no qform: spacing = column norms, direction = the nearest
///     rotation (polar decomposition) of the normalized columns;
///  4. else (both codes 0, ANALYZE style): spacing = pixdim, origin 0, identity direction
///     in LPS, as ITK does (nibabel instead centres the grid and flips x).
/// RAS is converted to LPS by negating the first two rows of the affine and the offset.
Result<NiftiGeometry> nifti_to_geometry(const NiftiHeader& h, const std::string& file);

/// Fills pixdim[0..3], quatern_*, qoffset_*, srow and sets qform_code = sform_code = 1
/// (scanner) from an LPS geometry. Fails for non-positive spacing or a direction that is
/// not orthonormal (1e-3).
Status geometry_to_nifti(const Geometry& g, NiftiHeader& h);

}  // namespace segflow::pipeline::detail

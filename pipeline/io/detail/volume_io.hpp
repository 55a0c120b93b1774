#pragma once
// Helpers of the volume readers and writers (private to pipeline/io): geometry from per-axis
// step vectors, as NRRD (space directions) and MetaImage (TransformMatrix x ElementSpacing)
// store it, a staging folder for writing files that appear by rename, and the voxel check
// every writer (NIfTI, NRRD, MetaImage) starts with.

#include <array>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "messages/geometry.hpp"
#include "messages/status.hpp"
#include "pipeline/io/image.hpp"

namespace segflow::pipeline::detail {

/// `steps[a]` is the LPS vector (mm) from a voxel to the next along index axis a (x, y, z),
/// for a < `ndims` (2 or 3); `origin` the LPS position (mm) of voxel 0. Spacing is the length
/// of each step, direction its unit vector (a column). A 2D grid gets z spacing 1 and z
/// direction (0, 0, 1). Errors (naming `where`, e.g. "x.nrrd: space directions") for a zero,
/// infinite or NaN step and for axes that are not orthogonal within 1e-3.
Result<Geometry> geometry_from_steps(int ndims, const std::array<std::array<double, 3>, 3>& steps,
                                     const std::array<double, 3>& origin, const std::string& where);

/// `image`'s voxels as a writer takes them, (C, Z, Y, X): (Z, Y, X) gains a channel axis. An
/// undefined tensor or another number of dimensions is an error naming `file`.
Result<at::Tensor> voxels_to_write(const Image& image, const std::string& file);

/// Reverses the byte order of each of `count` elements of `size` bytes at `p`, in place
/// (a big-endian file read on this little-endian host, or the other way round).
void swap_bytes(unsigned char* p, std::int64_t count, int size);

/// "(a,b,c)" with up to 17 significant digits (the first `n`), for error messages.
std::string format_vector(const std::array<double, 3>& v, int n = 3);

/// A hidden folder beside `target` to write a header and its data files into; commit()
/// renames every file in it into target's folder (data files first, `target`'s name last,
/// so a reader never finds a header without its data). Removed with whatever is left.
class StagingDir {
 public:
  explicit StagingDir(const std::filesystem::path& target);
  ~StagingDir();
  StagingDir(const StagingDir&) = delete;
  StagingDir& operator=(const StagingDir&) = delete;
  /// Creates the folder.
  Status create();
  /// Where to write the file that will become `target`.
  std::filesystem::path file() const { return dir_ / target_.filename(); }
  /// Renames everything written into place.
  Status commit();

 private:
  std::filesystem::path target_, dir_;
};

}  // namespace segflow::pipeline::detail

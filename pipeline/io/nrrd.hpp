#pragma once
// NRRD (.nrrd with attached data, .nhdr with detached data) reader and writer on ITK's
// NrrdIO (the C subset of teem that ITK and 3D Slicer read NRRD with).
//
// Geometry: `space directions` give spacing (column norms) and direction (normalised
// columns), `space origin` the origin; right-anterior-superior is converted to LPS by
// negating x and y, left-anterior-superior by negating y; left-posterior-superior and
// scanner-xyz are taken as they are. Without a space, per-axis `spacings` (and `axis mins`)
// give spacing (and origin) with an identity direction. `kinds` tell the spatial axes
// (domain, space) from one non-spatial axis (list, vector, RGB-color, ...), which becomes
// the channels.

#include <filesystem>

#include "messages/status.hpp"
#include "pipeline/io/image.hpp"

namespace segflow::pipeline {

/// Reads a NRRD file: 2 or 3 spatial axes and at most one non-spatial axis, any scalar type,
/// encodings raw, ascii, hex and gzip. Voxels keep the file's type, (C, Z, Y, X). Errors name
/// the file and the header field: "x.nrrd: sizes: expected 763964 bytes of short data for
/// sizes [122, 101, 31], got 739320". Thread-safe (NrrdIO's error stack is process-wide, so
/// NRRD reads and writes take turns).
Result<Image> read_nrrd(const std::filesystem::path& path);

/// NRRD writer settings.
struct NrrdWriteOptions {
  bool compress = true;  ///< gzip encoding (zlib level 1), else raw
};

/// Writes `image` as NRRD in LPS with space directions, space origin and kinds (domain x3,
/// plus list for C > 1 channels), in the tensor's type (bool as uchar, float16 as float).
/// A .nhdr path writes a detached header and its data file beside it (<name>.raw or
/// <name>.raw.gz). Files are written in a temporary folder and renamed into place.
Status write_nrrd(const std::filesystem::path& path, const Image& image,
                  const NrrdWriteOptions& options = {});

/// True for names the format table gives NRRD (.nrrd, .nhdr, also in capitals).
bool is_nrrd_path(const std::filesystem::path& path);

}  // namespace segflow::pipeline

#pragma once
// MetaImage (.mha with the data after the header, .mhd with the data in ElementDataFile,
// .raw or .zraw) reader and writer. The header is parsed by ITK's MetaIO; segflow checks it
// and reads the data itself (zlib for CompressedData), so a short or corrupt data file is
// one clear error instead of MetaIO's console messages.
//
// Geometry as ITK reads it: spacing = ElementSpacing, origin = Offset (alias Origin,
// Position), direction = TransformMatrix transposed (its rows are the axis directions;
// aliases Rotation, Orientation), all LPS. AnatomicalOrientation is descriptive only and,
// as in ITK, does not change the geometry.

#include <filesystem>

#include "messages/status.hpp"
#include "pipeline/io/image.hpp"

namespace segflow::pipeline {

/// Reads a MetaImage: NDims 2 or 3, ElementNumberOfChannels >= 1, ElementType MET_CHAR ..
/// MET_DOUBLE, binary data (raw or CompressedData), LOCAL or one data file, HeaderSize
/// (-1: the data is the end of the file), either byte order. Voxels keep the file's type,
/// (C, Z, Y, X). Errors name the file and the field: "x.mhd: ElementDataFile: expected a
/// readable file x.raw beside the header, got no such file". Thread-safe.
Result<Image> read_metaimage(const std::filesystem::path& path);

/// MetaImage writer settings.
struct MetaImageWriteOptions {
  bool compress = true;  ///< CompressedData (zlib), else raw
};

/// Writes `image` as MetaImage in LPS (TransformMatrix, Offset, ElementSpacing,
/// AnatomicalOrientation) in the tensor's type. A .mhd path writes the data beside it
/// (<name>.zraw compressed, <name>.raw otherwise). Temporary files and renames.
Status write_metaimage(const std::filesystem::path& path, const Image& image,
                       const MetaImageWriteOptions& options = {});

/// True for names the format table gives MetaImage (.mha, .mhd, also in capitals).
bool is_metaimage_path(const std::filesystem::path& path);

}  // namespace segflow::pipeline

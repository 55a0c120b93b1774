#pragma once
// NIfTI-1 / NIfTI-2 header: decoding (either byte order), validation and NIfTI-1
// encoding. Private to pipeline/io/nifti.cpp; plain data, no LibTorch.

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "messages/status.hpp"

namespace segflow::pipeline::detail {

inline constexpr std::size_t kNifti1HeaderSize = 348;
inline constexpr std::size_t kNifti2HeaderSize = 540;

/// NIfTI datatype codes (nifti1.h).
enum NiftiDatatype : std::int16_t {
  kDtBinary = 1,
  kDtUint8 = 2,
  kDtInt16 = 4,
  kDtInt32 = 8,
  kDtFloat32 = 16,
  kDtComplex64 = 32,
  kDtFloat64 = 64,
  kDtRgb24 = 128,
  kDtInt8 = 256,
  kDtUint16 = 512,
  kDtUint32 = 768,
  kDtInt64 = 1024,
  kDtUint64 = 1280,
  kDtFloat128 = 1536,
  kDtComplex128 = 1792,
  kDtComplex256 = 2048,
  kDtRgba32 = 2304,
};

/// One row of the datatype table: code, bits per voxel, name, and whether segflow reads it.
struct NiftiTypeInfo {
  std::int16_t code;
  int bitpix;
  const char* name;
  bool supported;
};

/// The table row for `code`, or nullptr for a code nifti1.h does not define.
const NiftiTypeInfo* nifti_type_info(std::int16_t code);

/// The header fields segflow uses, widened to the NIfTI-2 types (both versions decode into it).
struct NiftiHeader {
  int version = 1;           ///< 1 or 2
  bool swapped = false;      ///< file byte order differs from the host's
  bool pair = false;         ///< magic "ni1"/"ni2": voxels live in a separate .img file
  std::int64_t dim[8] = {};  ///< dim[0] = number of dimensions, dim[1..7] extents
  double pixdim[8] = {};     ///< pixdim[0] = qfac, pixdim[1..3] mm, pixdim[4] time
  std::int16_t datatype = 0;
  std::int16_t bitpix = 0;
  double vox_offset = 0;  ///< bytes from the start of the data file to the voxels
  double scl_slope = 0;
  double scl_inter = 0;
  int xyzt_units = 0;
  int intent_code = 0;
  int qform_code = 0;
  int sform_code = 0;
  double quatern_b = 0, quatern_c = 0, quatern_d = 0;
  double qoffset_x = 0, qoffset_y = 0, qoffset_z = 0;
  double srow[3][4] = {};  ///< srow_x, srow_y, srow_z (RAS)
  std::string descrip;
};

/// Decodes and validates a header from the first `n` bytes of a file (n >= 348; 540 for
/// NIfTI-2). Byte order comes from sizeof_hdr. Errors are "<file>: <field>: expected .., got ..".
Result<NiftiHeader> decode_nifti_header(const unsigned char* bytes, std::size_t n, const std::string& file);

/// Number of voxels (product of dim[1..dim[0]]) and the data size in bytes; the header must
/// have been validated by decode_nifti_header (no overflow, positive dims).
std::int64_t nifti_voxel_count(const NiftiHeader& h);
std::int64_t nifti_data_bytes(const NiftiHeader& h);

/// Encodes `h` as a single-file NIfTI-1 header in host byte order: 348 bytes, magic "n+1",
/// followed by 4 zero extension bytes (352 bytes in all). vox_offset is written as given.
std::array<unsigned char, kNifti1HeaderSize + 4> encode_nifti1_header(const NiftiHeader& h);

}  // namespace segflow::pipeline::detail

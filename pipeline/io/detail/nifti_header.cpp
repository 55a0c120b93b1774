#include "pipeline/io/detail/nifti_header.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <sstream>

namespace segflow::pipeline::detail {

namespace {

constexpr NiftiTypeInfo kTypes[] = {
    {kDtBinary, 1, "binary", false},
    {kDtUint8, 8, "uint8", true},
    {kDtInt16, 16, "int16", true},
    {kDtInt32, 32, "int32", true},
    {kDtFloat32, 32, "float32", true},
    {kDtComplex64, 64, "complex64", false},
    {kDtFloat64, 64, "float64", true},
    {kDtRgb24, 24, "rgb24", true},
    {kDtInt8, 8, "int8", true},
    {kDtUint16, 16, "uint16", true},
    {kDtUint32, 32, "uint32", true},
    {kDtInt64, 64, "int64", true},
    {kDtUint64, 64, "uint64", true},
    {kDtFloat128, 128, "float128", false},
    {kDtComplex128, 128, "complex128", false},
    {kDtComplex256, 256, "complex256", false},
    {kDtRgba32, 32, "rgba32", true},
};

template <class T>
T load(const unsigned char* p, bool swap) {
  unsigned char b[sizeof(T)];
  std::memcpy(b, p, sizeof(T));
  if (swap)
    for (std::size_t i = 0; i < sizeof(T) / 2; ++i) std::swap(b[i], b[sizeof(T) - 1 - i]);
  T v;
  std::memcpy(&v, b, sizeof(T));
  return v;
}

template <class T>
void store(unsigned char* p, T v) {
  std::memcpy(p, &v, sizeof(T));
}

std::int32_t swap32(std::int32_t v) {
  auto u = static_cast<std::uint32_t>(v);
  u = (u >> 24) | ((u >> 8) & 0xff00u) | ((u << 8) & 0xff0000u) | (u << 24);
  return static_cast<std::int32_t>(u);
}

/// Printable form of raw magic bytes: "n+1\0" -> n+1\x00.
std::string show_bytes(const unsigned char* p, std::size_t n) {
  std::string s;
  for (std::size_t i = 0; i < n; ++i) {
    if (p[i] >= 0x20 && p[i] < 0x7f && p[i] != '\\') {
      s += static_cast<char>(p[i]);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", p[i]);
      s += buf;
    }
  }
  return s;
}

Status bad(const std::string& file, const std::string& field, const std::string& what) {
  return corrupt_data(file + ": " + field + ": " + what);
}

std::string num(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

}  // namespace

const NiftiTypeInfo* nifti_type_info(std::int16_t code) {
  for (const auto& t : kTypes)
    if (t.code == code) return &t;
  return nullptr;
}

std::int64_t nifti_voxel_count(const NiftiHeader& h) {
  std::int64_t n = 1;
  for (std::int64_t i = 1; i <= h.dim[0]; ++i) n *= h.dim[i];
  return n;
}

std::int64_t nifti_data_bytes(const NiftiHeader& h) { return nifti_voxel_count(h) * (h.bitpix / 8); }

namespace {

/// The NIfTI-1 fields (348-byte header) after its magic "n+1" or "ni1".
Status decode_nifti1_fields(const unsigned char* b, bool sw, const std::string& file, NiftiHeader& h) {
  const unsigned char* m = b + 344;
  if (std::memcmp(m, "n+1\0", 4) == 0) {
    h.pair = false;
  } else if (std::memcmp(m, "ni1\0", 4) == 0) {
    h.pair = true;
  } else {
    std::string hint = (m[0] == 0 && m[1] == 0 && m[2] == 0) ? " (an ANALYZE 7.5 header; not supported)" : "";
    return bad(file, "magic", "expected \"n+1\" or \"ni1\", got \"" + show_bytes(m, 4) + "\"" + hint);
  }
  for (int i = 0; i < 8; ++i) h.dim[i] = load<std::int16_t>(b + 40 + 2 * i, sw);
  h.intent_code = load<std::int16_t>(b + 68, sw);
  h.datatype = load<std::int16_t>(b + 70, sw);
  h.bitpix = load<std::int16_t>(b + 72, sw);
  for (int i = 0; i < 8; ++i) h.pixdim[i] = load<float>(b + 76 + 4 * i, sw);
  h.vox_offset = load<float>(b + 108, sw);
  h.scl_slope = load<float>(b + 112, sw);
  h.scl_inter = load<float>(b + 116, sw);
  h.xyzt_units = static_cast<unsigned char>(b[123]);
  h.descrip.assign(reinterpret_cast<const char*>(b + 148),
                   strnlen(reinterpret_cast<const char*>(b + 148), 80));
  h.qform_code = load<std::int16_t>(b + 252, sw);
  h.sform_code = load<std::int16_t>(b + 254, sw);
  h.quatern_b = load<float>(b + 256, sw);
  h.quatern_c = load<float>(b + 260, sw);
  h.quatern_d = load<float>(b + 264, sw);
  h.qoffset_x = load<float>(b + 268, sw);
  h.qoffset_y = load<float>(b + 272, sw);
  h.qoffset_z = load<float>(b + 276, sw);
  for (int r = 0; r < 3; ++r)
    for (int c = 0; c < 4; ++c) h.srow[r][c] = load<float>(b + 280 + 16 * r + 4 * c, sw);
  return Status::ok();
}

/// The NIfTI-2 fields (540-byte header) after its magic "n+2" or "ni2".
Status decode_nifti2_fields(const unsigned char* b, bool sw, const std::string& file, NiftiHeader& h) {
  const unsigned char* m = b + 4;
  if (std::memcmp(m, "n+2\0", 4) == 0) {
    h.pair = false;
  } else if (std::memcmp(m, "ni2\0", 4) == 0) {
    h.pair = true;
  } else {
    return bad(file, "magic", "expected \"n+2\" or \"ni2\", got \"" + show_bytes(m, 8) + "\"");
  }
  h.datatype = load<std::int16_t>(b + 12, sw);
  h.bitpix = load<std::int16_t>(b + 14, sw);
  for (int i = 0; i < 8; ++i) h.dim[i] = load<std::int64_t>(b + 16 + 8 * i, sw);
  for (int i = 0; i < 8; ++i) h.pixdim[i] = load<double>(b + 104 + 8 * i, sw);
  h.vox_offset = static_cast<double>(load<std::int64_t>(b + 168, sw));
  h.scl_slope = load<double>(b + 176, sw);
  h.scl_inter = load<double>(b + 184, sw);
  h.descrip.assign(reinterpret_cast<const char*>(b + 240),
                   strnlen(reinterpret_cast<const char*>(b + 240), 80));
  h.qform_code = load<std::int32_t>(b + 344, sw);
  h.sform_code = load<std::int32_t>(b + 348, sw);
  h.quatern_b = load<double>(b + 352, sw);
  h.quatern_c = load<double>(b + 360, sw);
  h.quatern_d = load<double>(b + 368, sw);
  h.qoffset_x = load<double>(b + 376, sw);
  h.qoffset_y = load<double>(b + 384, sw);
  h.qoffset_z = load<double>(b + 392, sw);
  for (int r = 0; r < 3; ++r)
    for (int c = 0; c < 4; ++c) h.srow[r][c] = load<double>(b + 400 + 32 * r + 8 * c, sw);
  h.xyzt_units = load<std::int32_t>(b + 500, sw);
  h.intent_code = load<std::int32_t>(b + 504, sw);
  return Status::ok();
}

/// dim[0] in 1..7, dim[1..dim[0]] > 0 and at most 2^46 voxels; unused dims read as 1.
Status check_dims(const std::string& file, NiftiHeader& h) {
  if (h.dim[0] < 1 || h.dim[0] > 7)
    return bad(file, "dim[0]", "expected 1..7, got " + std::to_string(h.dim[0]));
  std::int64_t voxels = 1;
  for (std::int64_t i = 1; i <= h.dim[0]; ++i) {
    if (h.dim[i] <= 0)
      return bad(file, "dim[" + std::to_string(i) + "]", "expected > 0, got " + std::to_string(h.dim[i]));
    if (__builtin_mul_overflow(voxels, h.dim[i], &voxels) || voxels > (std::int64_t{1} << 46))
      return bad(file, "dim", "expected at most 2^46 voxels, the product of dim[1..dim[0]] is larger");
  }
  for (std::int64_t i = h.dim[0] + 1; i < 8; ++i) h.dim[i] = 1;  // unused dims read as 1
  return Status::ok();
}

/// A known, supported datatype with its bitpix; positive spacing of the spatial dimensions
/// the volume uses.
Status check_type_and_spacing(const std::string& file, const NiftiHeader& h) {
  const NiftiTypeInfo* t = nifti_type_info(h.datatype);
  if (!t)
    return bad(
        file, "datatype",
        "expected a NIfTI datatype code (2, 4, 8, 16, 64, 128, 256, 512, 768, 1024, 1280, 2304), got " +
            std::to_string(h.datatype));
  if (!t->supported)
    return unsupported(file + ": datatype: " + t->name + " (code " + std::to_string(h.datatype) +
                       ") is not supported; expected an integer, float32/float64 or RGB type");
  if (h.bitpix != t->bitpix)
    return bad(file, "bitpix",
               "expected " + std::to_string(t->bitpix) + " for datatype " + std::to_string(h.datatype) +
                   " (" + t->name + "), got " + std::to_string(h.bitpix));

  // Spacing of the spatial dimensions the volume uses.
  for (std::int64_t i = 1; i <= std::min<std::int64_t>(h.dim[0], 3); ++i)
    if (!(h.pixdim[i] > 0) || !std::isfinite(h.pixdim[i]))
      return bad(file, "pixdim[" + std::to_string(i) + "]", "expected > 0 (mm), got " + num(h.pixdim[i]));
  return Status::ok();
}

/// Where the voxels start: a byte offset, past the header in a single-file NIfTI.
Status check_vox_offset(const std::string& file, NiftiHeader& h) {
  const double hdr = static_cast<double>(h.version == 1 ? kNifti1HeaderSize : kNifti2HeaderSize);
  if (!std::isfinite(h.vox_offset) || h.vox_offset < 0 || h.vox_offset > 1e15)
    return bad(file, "vox_offset", "expected a byte offset >= 0, got " + num(h.vox_offset));
  if (!h.pair) {
    // 0 is how some writers say "right after the header and its 4 extension bytes".
    if (h.vox_offset == 0) h.vox_offset = hdr + 4;
    if (h.vox_offset < hdr)
      return bad(
          file, "vox_offset",
          "expected >= " + num(hdr) + " (the header size) in a single-file NIfTI, got " + num(h.vox_offset));
  }
  h.vox_offset = std::floor(h.vox_offset);
  return Status::ok();
}

}  // namespace

Result<NiftiHeader> decode_nifti_header(const unsigned char* b, std::size_t n, const std::string& file) {
  if (n < 4)
    return bad(file, "sizeof_hdr",
               "truncated: file has " + std::to_string(n) + " bytes, expected a 348- or 540-byte header");
  NiftiHeader h;
  const std::int32_t raw = load<std::int32_t>(b, false);
  if (raw == 348 || raw == 540) {
    h.swapped = false;
  } else if (swap32(raw) == 348 || swap32(raw) == 540) {
    h.swapped = true;
  } else {
    return bad(file, "sizeof_hdr",
               "expected 348 (NIfTI-1) or 540 (NIfTI-2) in either byte order, got " + std::to_string(raw) +
                   " (not a NIfTI file)");
  }
  const bool sw = h.swapped;
  h.version = (h.swapped ? swap32(raw) : raw) == 348 ? 1 : 2;
  const std::size_t need = h.version == 1 ? kNifti1HeaderSize : kNifti2HeaderSize;
  if (n < need)
    return bad(file, "header",
               "truncated: expected " + std::to_string(need) + " header bytes (NIfTI-" +
                   std::to_string(h.version) + "), got " + std::to_string(n));

  if (h.version == 1) {
    SEGFLOW_RETURN_IF_ERROR(decode_nifti1_fields(b, sw, file, h));
  } else {
    SEGFLOW_RETURN_IF_ERROR(decode_nifti2_fields(b, sw, file, h));
  }
  SEGFLOW_RETURN_IF_ERROR(check_dims(file, h));
  SEGFLOW_RETURN_IF_ERROR(check_type_and_spacing(file, h));
  SEGFLOW_RETURN_IF_ERROR(check_vox_offset(file, h));
  return h;
}

std::array<unsigned char, kNifti1HeaderSize + 4> encode_nifti1_header(const NiftiHeader& h) {
  std::array<unsigned char, kNifti1HeaderSize + 4> out{};
  unsigned char* b = out.data();
  store<std::int32_t>(b + 0, 348);
  b[38] = 'r';  // "regular", as ANALYZE readers expect
  for (int i = 0; i < 8; ++i) store<std::int16_t>(b + 40 + 2 * i, static_cast<std::int16_t>(h.dim[i]));
  store<std::int16_t>(b + 68, static_cast<std::int16_t>(h.intent_code));
  store<std::int16_t>(b + 70, h.datatype);
  store<std::int16_t>(b + 72, h.bitpix);
  for (int i = 0; i < 8; ++i) store<float>(b + 76 + 4 * i, static_cast<float>(h.pixdim[i]));
  store<float>(b + 108, static_cast<float>(h.vox_offset));
  store<float>(b + 112, static_cast<float>(h.scl_slope));
  store<float>(b + 116, static_cast<float>(h.scl_inter));
  b[123] = static_cast<unsigned char>(h.xyzt_units);
  std::memcpy(b + 148, h.descrip.data(), std::min<std::size_t>(h.descrip.size(), 79));
  store<std::int16_t>(b + 252, static_cast<std::int16_t>(h.qform_code));
  store<std::int16_t>(b + 254, static_cast<std::int16_t>(h.sform_code));
  store<float>(b + 256, static_cast<float>(h.quatern_b));
  store<float>(b + 260, static_cast<float>(h.quatern_c));
  store<float>(b + 264, static_cast<float>(h.quatern_d));
  store<float>(b + 268, static_cast<float>(h.qoffset_x));
  store<float>(b + 272, static_cast<float>(h.qoffset_y));
  store<float>(b + 276, static_cast<float>(h.qoffset_z));
  for (int r = 0; r < 3; ++r)
    for (int c = 0; c < 4; ++c) store<float>(b + 280 + 16 * r + 4 * c, static_cast<float>(h.srow[r][c]));
  std::memcpy(b + 344, "n+1\0", 4);
  return out;  // bytes 348..351: extension flag, all zero (no extensions)
}

}  // namespace segflow::pipeline::detail

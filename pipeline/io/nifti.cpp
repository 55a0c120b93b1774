// NIfTI-1/2 reader and NIfTI-1 writer on zlib alone. gzopen/gzread read plain and gzip
// files alike (zlib recognises the 1f 8b magic itself), so a .nii holding gzip data or a
// .nii.gz holding plain data both read. Header decoding: detail/nifti_header.cpp;
// sform/qform rules: detail/nifti_geometry.hpp.
#include "pipeline/io/nifti.hpp"

#include <torch/torch.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <system_error>
#include <vector>

#include "messages/file_util.hpp"
#include "pipeline/io/detail/nifti_geometry.hpp"
#include "pipeline/io/detail/nifti_header.hpp"
#include "pipeline/io/detail/volume_io.hpp"
#include "pipeline/io/image_formats.hpp"

namespace segflow::pipeline {

namespace fs = std::filesystem;
using detail::NiftiHeader;

namespace {

constexpr unsigned kGzChunk = 1u << 30;  // gzread/gzwrite take an unsigned length

/// A file read through zlib, plain or gzip.
class GzInput {
 public:
  GzInput() = default;
  GzInput(const GzInput&) = delete;
  GzInput& operator=(const GzInput&) = delete;
  ~GzInput() {
    if (f_) gzclose(f_);
  }

  Status open(const fs::path& p) {
    name_ = p.string();
    f_ = gzopen(name_.c_str(), "rb");
    if (!f_) return io_error(name_ + ": cannot open: " + std::strerror(errno));
    gzbuffer(f_, 1u << 18);
    return Status::ok();
  }

  /// Reads up to n bytes; fewer only at the end of the data. zlib errors become a Status.
  Result<std::int64_t> read(void* dst, std::int64_t n) {
    auto* p = static_cast<unsigned char*>(dst);
    std::int64_t got = 0;
    while (got < n) {
      const unsigned want = static_cast<unsigned>(std::min<std::int64_t>(n - got, kGzChunk));
      const int r = gzread(f_, p + got, want);
      if (r < 0) return error_status();
      if (r == 0) break;
      got += r;
    }
    // zlib reports a stream cut short as an error after the short read.
    if (got < n) {
      int code = Z_OK;
      gzerror(f_, &code);
      if (code != Z_OK && code != Z_BUF_ERROR) return error_status();
    }
    return got;
  }

  /// Skips n bytes; returns how many were skipped (fewer at the end of the data).
  Result<std::int64_t> skip(std::int64_t n) {
    std::vector<unsigned char> buf(static_cast<std::size_t>(std::min<std::int64_t>(n, 1 << 16)));
    std::int64_t done = 0;
    while (done < n) {
      SEGFLOW_ASSIGN_OR_RETURN(
          std::int64_t r,
          read(buf.data(), std::min<std::int64_t>(n - done, static_cast<std::int64_t>(buf.size()))));
      if (r == 0) break;
      done += r;
    }
    return done;
  }

  /// After the voxels: reads on to the end of a gzip member so that its CRC is checked.
  Status check_trailer() {
    if (!compressed()) return Status::ok();
    unsigned char b[256];
    for (;;) {
      const int r = gzread(f_, b, sizeof b);
      if (r < 0) return error_status();
      if (r == 0) return Status::ok();
    }
  }

  bool compressed() const { return f_ && gzdirect(f_) == 0; }

 private:
  Status error_status() {
    int code = Z_OK;
    const char* msg = gzerror(f_, &code);
    if (code == Z_ERRNO) return io_error(name_ + ": read failed: " + std::strerror(errno));
    return corrupt_data(name_ +
                        ": gzip stream corrupt: " + (msg ? msg : "zlib error " + std::to_string(code)));
  }

  gzFile f_ = nullptr;
  std::string name_;
};

at::ScalarType torch_type(std::int16_t dt) {
  switch (dt) {
    case detail::kDtUint8:
      return at::kByte;
    case detail::kDtInt8:
      return at::kChar;
    case detail::kDtInt16:
      return at::kShort;
    case detail::kDtUint16:
      return at::kUInt16;
    case detail::kDtInt32:
      return at::kInt;
    case detail::kDtUint32:
      return at::kUInt32;
    case detail::kDtInt64:
      return at::kLong;
    case detail::kDtUint64:
      return at::kUInt64;
    case detail::kDtFloat32:
      return at::kFloat;
    case detail::kDtFloat64:
      return at::kDouble;
    default:
      return at::kByte;  // RGB24 / RGBA32: bytes
  }
}

std::string dims_text(const NiftiHeader& h) {
  std::string s = "[";
  for (std::int64_t i = 1; i <= h.dim[0]; ++i) s += (i > 1 ? ", " : "") + std::to_string(h.dim[i]);
  return s + "]";
}

/// The data file of a header/image pair: x.hdr -> x.img (or x.img.gz), x.hdr.gz -> x.img.gz.
Result<fs::path> pair_image_path(const fs::path& header) {
  std::string s = header.string();
  if (s.ends_with(".gz")) s.resize(s.size() - 3);
  const auto dot = s.find_last_of('.');
  const auto slash = s.find_last_of('/');
  if (dot != std::string::npos && (slash == std::string::npos || dot > slash)) s.resize(dot);
  for (const char* ext : {".img", ".img.gz"}) {
    fs::path p = s + ext;
    std::error_code ec;
    if (fs::is_regular_file(p, ec)) return p;
  }
  return not_found(header.string() + ": magic: a header/image pair (ni1/ni2) but its image file " + s +
                   ".img is missing");
}

/// Reads the `data_bytes` of voxels at the header's vox_offset into `dst`: from `in` (the
/// single file, whose first `head_n` bytes are in `head`) or from `img` (the .img of a pair).
/// `truncated` starts the message when the data ends early.
Status read_voxel_data(const NiftiHeader& h, GzInput& in, GzInput& img, const unsigned char* head,
                       std::int64_t head_n, unsigned char* dst, std::int64_t data_bytes,
                       const std::string& truncated) {
  const auto vox_offset = static_cast<std::int64_t>(h.vox_offset);
  GzInput* data = h.pair ? &img : &in;
  std::int64_t got = 0;
  // Bring the stream to vox_offset.
  if (h.pair) {
    SEGFLOW_ASSIGN_OR_RETURN(std::int64_t skipped, img.skip(vox_offset));
    if (skipped < vox_offset) got = -1;
  } else if (vox_offset < head_n) {
    got = std::min<std::int64_t>(head_n - vox_offset, data_bytes);
    std::memcpy(dst, head + vox_offset, static_cast<std::size_t>(got));
  } else {
    SEGFLOW_ASSIGN_OR_RETURN(std::int64_t skipped, in.skip(vox_offset - head_n));
    if (skipped < vox_offset - head_n) got = -1;
  }
  if (got < 0) return corrupt_data(truncated + ", the data ends before vox_offset");
  if (got < data_bytes) {
    SEGFLOW_ASSIGN_OR_RETURN(std::int64_t r, data->read(dst + got, data_bytes - got));
    got += r;
  }
  if (got < data_bytes)
    return corrupt_data(truncated + ", got " + std::to_string(vox_offset + got) +
                        (data->compressed() ? " after decompression" : ""));
  return data->check_trailer();
}

/// The voxels as the image holds them: RGB components as channels, (C, Z, Y, X, k) ->
/// (C * k, Z, Y, X), components of channel 0 first; otherwise scl_slope / scl_inter applied
/// (float32) unless they are (0 or 1, 0).
Result<at::Tensor> image_values(const std::string& file, const NiftiHeader& h, at::Tensor t, int components) {
  if (components > 1) {
    const auto c = t.size(0), z = t.size(1), y = t.size(2), x = t.size(3);
    return t.permute({0, 4, 1, 2, 3}).reshape({c * components, z, y, x}).contiguous();
  }
  const double slope = h.scl_slope, inter = h.scl_inter;
  if (std::isfinite(slope) && slope != 0.0 && !(slope == 1.0 && inter == 0.0)) {
    if (!std::isfinite(inter))
      return corrupt_data(file + ": scl_inter: expected a finite number with scl_slope " +
                          std::to_string(slope) + ", got " + std::to_string(inter));
    t = (t.to(at::kDouble) * slope + inter).to(at::kFloat);
  }
  return t;
}

Result<Image> read_nifti_impl(const fs::path& path) {
  const std::string file = path.string();
  std::error_code ec;
  const auto st = fs::status(path, ec);
  if (!fs::exists(st)) return not_found(file + ": no such file");
  if (!fs::is_regular_file(st)) return invalid_argument(file + ": not a regular file");
  const auto file_size = static_cast<std::int64_t>(fs::file_size(path, ec));
  if (ec) return io_error(file + ": cannot stat: " + ec.message());
  if (file_size == 0) return corrupt_data(file + ": empty file (0 bytes), expected a NIfTI header");

  GzInput in;
  SEGFLOW_RETURN_IF_ERROR(in.open(path));
  unsigned char head[detail::kNifti2HeaderSize];
  SEGFLOW_ASSIGN_OR_RETURN(std::int64_t head_n, in.read(head, sizeof head));
  SEGFLOW_ASSIGN_OR_RETURN(NiftiHeader h,
                           detail::decode_nifti_header(head, static_cast<std::size_t>(head_n), file));
  const detail::NiftiTypeInfo* type = detail::nifti_type_info(h.datatype);
  const std::int64_t data_bytes = detail::nifti_data_bytes(h);
  const auto vox_offset = static_cast<std::int64_t>(h.vox_offset);

  // Geometry first: a bad transform fails before any voxel is read.
  SEGFLOW_ASSIGN_OR_RETURN(detail::NiftiGeometry geo, detail::nifti_to_geometry(h, file));

  const std::int64_t x = h.dim[1], y = h.dim[2], z = h.dim[3];
  const std::int64_t c = h.dim[4] * h.dim[5] * h.dim[6] * h.dim[7];
  const bool rgb = h.datatype == detail::kDtRgb24 || h.datatype == detail::kDtRgba32;
  const int components = h.datatype == detail::kDtRgb24 ? 3 : h.datatype == detail::kDtRgba32 ? 4 : 1;

  // The data file: this file, or the .img of a pair. Its size bounds what it can hold
  // (deflate expands at most 1032:1), so a header claiming more fails before the allocation.
  GzInput img;
  GzInput* data = &in;
  std::int64_t data_file_size = file_size;
  std::string data_name = file;
  if (h.pair) {
    SEGFLOW_ASSIGN_OR_RETURN(fs::path img_path, pair_image_path(path));
    data_name = img_path.string();
    data_file_size = static_cast<std::int64_t>(fs::file_size(img_path, ec));
    if (ec) return io_error(data_name + ": cannot stat: " + ec.message());
    SEGFLOW_RETURN_IF_ERROR(img.open(img_path));
    data = &img;
  }
  const std::string truncated = data_name + ": truncated: expected " +
                                std::to_string(vox_offset + data_bytes) + " bytes (vox_offset " +
                                std::to_string(vox_offset) + " + " + std::to_string(data_bytes) +
                                " bytes of " + type->name + " for dim " + dims_text(h) + ")";
  if (!data->compressed() && data_file_size < vox_offset + data_bytes)
    return corrupt_data(truncated + ", got " + std::to_string(data_file_size));
  constexpr std::int64_t kMaxDeflateRatio = 1032;
  if (data->compressed() && data_file_size < (vox_offset + data_bytes) / kMaxDeflateRatio)
    return corrupt_data(truncated + ", but the gzip file of " + std::to_string(data_file_size) +
                        " bytes can hold at most " + std::to_string(data_file_size * kMaxDeflateRatio));

  std::vector<std::int64_t> shape{c, z, y, x};
  if (rgb) shape.push_back(components);
  at::Tensor t = torch::empty(shape, torch::TensorOptions().dtype(torch_type(h.datatype)));
  auto* dst = static_cast<unsigned char*>(t.data_ptr());

  SEGFLOW_RETURN_IF_ERROR(read_voxel_data(h, in, img, head, head_n, dst, data_bytes, truncated));
  const int elem = h.bitpix / 8;
  if (h.swapped && !rgb && elem > 1) detail::swap_bytes(dst, t.numel(), elem);
  SEGFLOW_ASSIGN_OR_RETURN(t, image_values(file, h, std::move(t), rgb ? components : 1));

  Image image;
  image.voxels = std::move(t);
  image.geometry = geo.geometry;
  image.source = path;
  return image;
}

struct WriteType {
  std::int16_t code;
  std::int16_t bitpix;
  at::ScalarType stored;
};

Result<WriteType> write_type(at::ScalarType s, const std::string& file) {
  switch (s) {
    case at::kByte:
      return WriteType{detail::kDtUint8, 8, at::kByte};
    case at::kBool:
      return WriteType{detail::kDtUint8, 8, at::kByte};
    case at::kChar:
      return WriteType{detail::kDtInt8, 8, at::kChar};
    case at::kShort:
      return WriteType{detail::kDtInt16, 16, at::kShort};
    case at::kUInt16:
      return WriteType{detail::kDtUint16, 16, at::kUInt16};
    case at::kInt:
      return WriteType{detail::kDtInt32, 32, at::kInt};
    case at::kUInt32:
      return WriteType{detail::kDtUint32, 32, at::kUInt32};
    case at::kLong:
      return WriteType{detail::kDtInt64, 64, at::kLong};
    case at::kUInt64:
      return WriteType{detail::kDtUint64, 64, at::kUInt64};
    case at::kHalf:
    case at::kBFloat16:
    case at::kFloat:
      return WriteType{detail::kDtFloat32, 32, at::kFloat};
    case at::kDouble:
      return WriteType{detail::kDtFloat64, 64, at::kDouble};
    default:
      return unsupported(file + ": voxels: dtype " + std::string(c10::toString(s)) +
                         " has no NIfTI datatype; expected bool, (u)int8..64, float16/32/64");
  }
}

Status write_nifti_impl(const fs::path& path, const Image& image) {
  const std::string file = path.string();
  SEGFLOW_ASSIGN_OR_RETURN(at::Tensor v, detail::voxels_to_write(image, file));
  SEGFLOW_ASSIGN_OR_RETURN(WriteType wt, write_type(v.scalar_type(), file));
  v = v.to(torch::kCPU).to(wt.stored).contiguous();

  NiftiHeader h;
  const std::int64_t sizes[4] = {v.size(3), v.size(2), v.size(1), v.size(0)};  // x, y, z, c
  for (int i = 0; i < 4; ++i)
    if (sizes[i] < 1 || sizes[i] > 32767)
      return invalid_argument(file + ": voxels: NIfTI-1 extents are 1..32767, got size " +
                              std::to_string(sizes[i]) + " in (x, y, z, c) position " + std::to_string(i));
  h.dim[0] = sizes[3] > 1 ? 4 : 3;
  for (int i = 0; i < 4; ++i) h.dim[i + 1] = sizes[i];
  for (int i = 5; i < 8; ++i) h.dim[i] = 1;
  for (double& p : h.pixdim) p = 1.0;
  h.pixdim[4] = h.dim[0] == 4 ? 1.0 : 0.0;
  for (int i = 5; i < 8; ++i) h.pixdim[i] = 0.0;
  Status gs = detail::geometry_to_nifti(image.geometry, h);
  if (!gs) return gs.with_context(file);
  h.datatype = wt.code;
  h.bitpix = wt.bitpix;
  h.vox_offset = detail::kNifti1HeaderSize + 4;
  h.scl_slope = 0.0;
  h.scl_inter = 0.0;
  h.xyzt_units = 2;  // NIFTI_UNITS_MM
  h.descrip = "segflow";
  const auto header = detail::encode_nifti1_header(h);

  const bool gz = file.ends_with(".gz");
  return replace_file_atomically(path, [&](const fs::path& tmp_path) -> Status {
    const std::string tmp = tmp_path.string();
    // Level 1, as nibabel writes: most of the ratio of level 6 at a fraction of the time.
    gzFile f = gzopen(tmp.c_str(), gz ? "wb1" : "wbT");
    if (!f) return io_error(tmp + ": cannot create: " + std::strerror(errno));
    auto fail = [&](const std::string& what) {
      int code = Z_OK;
      const char* msg = gzerror(f, &code);
      std::string detail_msg = code == Z_ERRNO ? std::strerror(errno) : (msg ? msg : "zlib error");
      gzclose(f);
      return io_error(file + ": " + what + ": " + detail_msg);
    };
    if (gzwrite(f, header.data(), static_cast<unsigned>(header.size())) != static_cast<int>(header.size()))
      return fail("write failed");
    const auto* p = static_cast<const unsigned char*>(v.data_ptr());
    std::int64_t left = v.numel() * static_cast<std::int64_t>(v.element_size());
    while (left > 0) {
      const unsigned n = static_cast<unsigned>(std::min<std::int64_t>(left, kGzChunk));
      if (gzwrite(f, p, n) != static_cast<int>(n)) return fail("write failed");
      p += n;
      left -= n;
    }
    const int rc = gzclose(f);
    if (rc != Z_OK) return io_error(file + ": close failed (zlib " + std::to_string(rc) + ")");
    return Status::ok();
  });
}

}  // namespace

Result<Image> read_nifti(const fs::path& path) {
  try {
    return read_nifti_impl(path);
  } catch (const std::bad_alloc&) {
    return internal_error(path.string() + ": out of memory reading the voxels");
  } catch (const std::exception& e) {
    return internal_error(path.string() + ": " + e.what());
  }
}

Status write_nifti(const fs::path& path, const Image& image) {
  try {
    return write_nifti_impl(path, image);
  } catch (const std::exception& e) {
    return internal_error(path.string() + ": " + e.what());
  }
}

bool is_nifti_path(const fs::path& p) { return format_from_name(p) == ImageFormat::nifti; }

}  // namespace segflow::pipeline

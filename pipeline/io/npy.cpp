// NumPy .npy reader and writer. Header parsing: detail/npy_header.cpp.
#include "pipeline/io/npy.hpp"

#include <torch/torch.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <system_error>

#include "messages/file_util.hpp"
#include "pipeline/io/detail/npy_header.hpp"
#include "pipeline/io/detail/volume_io.hpp"

namespace segflow::pipeline {

namespace fs = std::filesystem;

namespace {

struct FileCloser {
  void operator()(std::FILE* f) const {
    if (f) std::fclose(f);
  }
};
using FilePtr = std::unique_ptr<std::FILE, FileCloser>;

at::ScalarType torch_type(const detail::NpyType& t) {
  switch (t.kind) {
    case detail::NpyKind::boolean:
      return at::kBool;
    case detail::NpyKind::signed_int:
      return t.size == 1 ? at::kChar : t.size == 2 ? at::kShort : t.size == 4 ? at::kInt : at::kLong;
    case detail::NpyKind::unsigned_int:
      return t.size == 1 ? at::kByte : t.size == 2 ? at::kUInt16 : t.size == 4 ? at::kUInt32 : at::kUInt64;
    case detail::NpyKind::floating:
    default:
      return t.size == 2 ? at::kHalf : t.size == 4 ? at::kFloat : at::kDouble;
  }
}

Result<std::string> descr_of(at::ScalarType s, const std::string& file) {
  switch (s) {
    case at::kBool:
      return std::string("|b1");
    case at::kByte:
      return std::string("|u1");
    case at::kChar:
      return std::string("|i1");
    case at::kShort:
      return std::string("<i2");
    case at::kUInt16:
      return std::string("<u2");
    case at::kInt:
      return std::string("<i4");
    case at::kUInt32:
      return std::string("<u4");
    case at::kLong:
      return std::string("<i8");
    case at::kUInt64:
      return std::string("<u8");
    case at::kHalf:
      return std::string("<f2");
    case at::kFloat:
      return std::string("<f4");
    case at::kDouble:
      return std::string("<f8");
    default:
      return unsupported(file + ": tensor dtype " + std::string(c10::toString(s)) +
                         " has no .npy descriptor; expected bool, (u)int8..64 or float16/32/64");
  }
}

constexpr bool kHostBigEndian = std::endian::native == std::endian::big;

Result<at::Tensor> read_npy_impl(const fs::path& path) {
  const std::string file = path.string();
  std::error_code ec;
  const auto st = fs::status(path, ec);
  if (!fs::exists(st)) return not_found(file + ": no such file");
  if (!fs::is_regular_file(st)) return invalid_argument(file + ": not a regular file");
  const auto file_size = static_cast<std::int64_t>(fs::file_size(path, ec));
  if (ec) return io_error(file + ": cannot stat: " + ec.message());

  FilePtr f(std::fopen(file.c_str(), "rb"));
  if (!f) return io_error(file + ": cannot open: " + std::strerror(errno));
  unsigned char pre[12];
  const std::size_t n_pre = std::fread(pre, 1, 10, f.get());
  if (n_pre < 6 || std::memcmp(pre, "\x93NUMPY", 6) != 0) {
    if (file_size == 0)
      return corrupt_data(file + ": magic: expected \\x93NUMPY, got an empty file (0 bytes)");
    std::string got;
    for (std::size_t i = 0; i < std::min<std::size_t>(n_pre, 6); ++i) {
      if (pre[i] >= 0x20 && pre[i] < 0x7f) {
        got += static_cast<char>(pre[i]);
      } else {
        char b[8];
        std::snprintf(b, sizeof b, "\\x%02x", pre[i]);
        got += b;
      }
    }
    return corrupt_data(file + ": magic: expected \\x93NUMPY, got " + got + " (not an .npy file)");
  }
  if (n_pre < 10)
    return corrupt_data(file + ": header: truncated: the file ends inside the 10-byte preamble");
  const int major = pre[6], minor = pre[7];
  if (major < 1 || major > 3 || minor != 0)
    return unsupported(file + ": version: expected 1.0, 2.0 or 3.0, got " + std::to_string(major) + "." +
                       std::to_string(minor));
  std::int64_t header_len = pre[8] | (pre[9] << 8);
  std::int64_t prefix = 10;
  if (major >= 2) {
    if (std::fread(pre + 10, 1, 2, f.get()) != 2)
      return corrupt_data(file + ": header: truncated: the file ends inside the 12-byte preamble");
    header_len = static_cast<std::int64_t>(pre[8]) | (static_cast<std::int64_t>(pre[9]) << 8) |
                 (static_cast<std::int64_t>(pre[10]) << 16) | (static_cast<std::int64_t>(pre[11]) << 24);
    prefix = 12;
  }
  if (prefix + header_len > file_size)
    return corrupt_data(file + ": header: truncated: header_len " + std::to_string(header_len) + " needs " +
                        std::to_string(prefix + header_len) + " bytes, the file has " +
                        std::to_string(file_size));
  std::string text(static_cast<std::size_t>(header_len), '\0');
  if (std::fread(text.data(), 1, text.size(), f.get()) != text.size())
    return io_error(file + ": header: read failed: " + std::strerror(errno));
  SEGFLOW_ASSIGN_OR_RETURN(detail::NpyHeader h, detail::parse_npy_dict(text, file));
  SEGFLOW_ASSIGN_OR_RETURN(detail::NpyType type, detail::parse_npy_descr(h.descr, file));
  if (h.shape.size() > 32)
    return unsupported(file + ": header.shape: expected at most 32 dimensions, got " +
                       std::to_string(h.shape.size()));

  std::int64_t count = 1;
  for (std::int64_t d : h.shape)
    if (__builtin_mul_overflow(count, d, &count) || count > (std::int64_t{1} << 46))
      return corrupt_data(file + ": header.shape: " + detail::npy_shape_text(h.shape) + " is too large");
  const std::int64_t bytes = count * type.size;
  const std::int64_t available = file_size - prefix - header_len;
  if (available < bytes)
    return corrupt_data(file + ": data: expected " + std::to_string(bytes) + " bytes for shape " +
                        detail::npy_shape_text(h.shape) + " of '" + h.descr + "', got " +
                        std::to_string(available) + " (truncated)");

  // Fortran order stores the transpose: read it as the reversed shape, then permute back.
  std::vector<std::int64_t> stored(h.shape.begin(), h.shape.end());
  if (h.fortran_order) std::reverse(stored.begin(), stored.end());
  at::Tensor t = torch::empty(stored, torch::TensorOptions().dtype(torch_type(type)));
  auto* p = static_cast<unsigned char*>(t.data_ptr());
  if (bytes > 0 &&
      std::fread(p, 1, static_cast<std::size_t>(bytes), f.get()) != static_cast<std::size_t>(bytes))
    return io_error(file + ": data: read failed: " + std::strerror(errno));
  if (type.size > 1 && type.big_endian != kHostBigEndian) detail::swap_bytes(p, count, type.size);
  if (type.kind == detail::NpyKind::boolean)  // numpy may store any non-zero byte as True
    for (std::int64_t i = 0; i < count; ++i) p[i] = p[i] != 0;
  if (h.fortran_order && t.dim() > 1) {
    std::vector<std::int64_t> perm(static_cast<std::size_t>(t.dim()));
    for (std::size_t i = 0; i < perm.size(); ++i) perm[i] = static_cast<std::int64_t>(perm.size() - 1 - i);
    t = t.permute(perm).contiguous();
  }
  return t;
}

Status write_npy_impl(const fs::path& path, const at::Tensor& tensor) {
  const std::string file = path.string();
  if (!tensor.defined()) return invalid_argument(file + ": tensor: expected a tensor, got an undefined one");
  SEGFLOW_ASSIGN_OR_RETURN(std::string descr, descr_of(tensor.scalar_type(), file));
  at::Tensor t = tensor.to(torch::kCPU).contiguous();
  if (kHostBigEndian && t.element_size() > 1) {
    t = t.clone();
    detail::swap_bytes(static_cast<unsigned char*>(t.data_ptr()), t.numel(),
                       static_cast<int>(t.element_size()));
  }
  const std::string header = detail::make_npy_header(descr, t.sizes().vec());
  return replace_file_atomically(path, [&](const fs::path& tmp) -> Status {
    FilePtr f(std::fopen(tmp.c_str(), "wb"));
    if (!f) return io_error(tmp.string() + ": cannot create: " + std::strerror(errno));
    const auto bytes = static_cast<std::size_t>(t.numel()) * t.element_size();
    bool ok = std::fwrite(header.data(), 1, header.size(), f.get()) == header.size();
    if (ok && bytes > 0) ok = std::fwrite(t.data_ptr(), 1, bytes, f.get()) == bytes;
    const int err = errno;
    ok = (std::fclose(f.release()) == 0) && ok;
    if (!ok) return io_error(file + ": write failed: " + std::strerror(err));
    return Status::ok();
  });
}

}  // namespace

Result<at::Tensor> read_npy(const fs::path& path) {
  try {
    return read_npy_impl(path);
  } catch (const std::bad_alloc&) {
    return internal_error(path.string() + ": out of memory reading the array");
  } catch (const std::exception& e) {
    return internal_error(path.string() + ": " + e.what());
  }
}

Status write_npy(const fs::path& path, const at::Tensor& tensor) {
  try {
    return write_npy_impl(path, tensor);
  } catch (const std::exception& e) {
    return internal_error(path.string() + ": " + e.what());
  }
}

Result<Image> read_npy_image(const fs::path& path) {
  SEGFLOW_ASSIGN_OR_RETURN(at::Tensor t, read_npy(path));
  try {
    at::Tensor v;
    const auto d = t.dim();
    if (d == 2) {
      v = t.reshape({1, 1, t.size(0), t.size(1)});
    } else if (d == 3 && t.size(2) == 3) {  // (H, W, 3): an RGB slice
      v = t.permute({2, 0, 1}).unsqueeze(1).contiguous();
    } else if (d == 3) {
      v = t.unsqueeze(0);
    } else if (d == 4) {
      v = t;
    } else {
      return unsupported(path.string() +
                         ": shape: expected (H, W), (H, W, 3), (Z, Y, X) or (C, Z, Y, X), got " +
                         detail::npy_shape_text(t.sizes().vec()));
    }
    if (v.numel() == 0)  // found by fuzzing: a (0, 4, 4) array is no image
      return invalid_argument(path.string() + ": shape: expected every dimension >= 1, got " +
                              detail::npy_shape_text(t.sizes().vec()));
    Image image;
    image.voxels = v.contiguous();
    image.source = path;
    return image;
  } catch (const std::exception& e) {
    return internal_error(path.string() + ": " + e.what());
  }
}

}  // namespace segflow::pipeline

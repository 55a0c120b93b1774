// NRRD reader and writer on ITK's NrrdIO. The header is read twice: first alone (NrrdIO's
// skipData mode), to check the type, the axes and, for raw and gzip data, that the data
// holds exactly what `sizes` and `type` say; then with the data, which NrrdIO allocates and
// segflow adopts as the tensor's storage (no copy). NrrdIO reports errors on "biff", a
// process-wide message stack that is not thread-safe, so every NrrdIO call runs under one
// mutex; its multi-line messages are reduced to one line naming the field.
#include "pipeline/io/nrrd.hpp"

#include <NrrdIO.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <torch/torch.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <regex>
#include <vector>

#include "pipeline/io/detail/volume_io.hpp"
#include "pipeline/io/image_formats.hpp"

namespace segflow::pipeline {

namespace fs = std::filesystem;

namespace {

std::mutex& nrrd_mutex() {
  static std::mutex mu;
  return mu;
}

struct NrrdDeleter {
  void operator()(Nrrd* n) const { nrrdNuke(n); }
};
using NrrdPtr = std::unique_ptr<Nrrd, NrrdDeleter>;

/// An NrrdIoState that also closes the data file NrrdIO leaves open with keepNrrdDataFileOpen
/// (nrrdLoad has closed the header file itself, unless it is that data file).
struct IoDeleter {
  void operator()(NrrdIoState* nio) const {
    if (nio->dataFile) {
      airFclose(nio->dataFile);
      nio->dataFile = nullptr;
    }
    nio->headerFile = nullptr;
    nrrdIoStateNix(nio);
  }
};
using IoPtr = std::unique_ptr<NrrdIoState, IoDeleter>;

/// NrrdIO's error stack as one line: the innermost message, with the field it concerns.
/// biff lines read "[nrrd] function: message", outermost first.
Status biff_status(const std::string& file, ErrorCode code = ErrorCode::corrupt_data) {
  char* raw = biffGetDone(NRRD);
  std::string text = raw ? raw : "";
  std::free(raw);
  std::vector<std::string> lines;
  for (std::size_t b = 0; b < text.size();) {
    std::size_t e = text.find('\n', b);
    if (e == std::string::npos) e = text.size();
    std::string l = text.substr(b, e - b);
    if (l.rfind("[nrrd] ", 0) == 0) l = l.substr(7);
    if (!l.empty() && l.back() == ':') l.pop_back();  // "_nrrdFormatNRRD_read:" with nothing after
    if (!l.empty()) lines.push_back(l);
    b = e + 1;
  }
  // The innermost line with a message after "function: ".
  std::string fn, msg;
  for (auto it = lines.rbegin(); it != lines.rend(); ++it) {
    const auto colon = it->find(": ");
    if (colon == std::string::npos) continue;
    fn = it->substr(0, colon);
    msg = it->substr(colon + 2);
    break;
  }
  if (msg.empty())
    return Status(code, file + ": NrrdIO: " + (lines.empty() ? "unknown error" : lines.back()));
  static const std::regex parse_fn("_nrrdReadNrrdParse_(\\w+)");
  static const std::regex quoted("\"([^\"]*)\"");
  std::smatch m;
  std::string got;
  if (std::smatch q; std::regex_search(msg, q, quoted)) got = q[1];
  if (std::regex_search(fn, m, parse_fn)) {
    std::string field = m[1];
    for (char& c : field)
      if (c == '_') c = ' ';
    if (field == "encoding")
      return unsupported(file + ": encoding: expected one of raw, ascii, hex, gzip, got \"" + got + "\"");
    if (field == "type")
      return unsupported(
          file + ": type: expected one of (unsigned) char, short, int, long long, float, double, got \"" +
          got + "\"");
    return Status(code, file + ": " + field + ": " + msg);
  }
  if (fn == "nrrdIoStateDataFileIterNext" || fn.find("DataFile") != std::string::npos)
    return not_found(file + ": data file: expected a readable file, got " + msg);
  return Status(code, file + ": " + msg + " (NrrdIO " + fn + ")");
}

at::ScalarType torch_type(int t) {
  switch (t) {
    case nrrdTypeChar:
      return at::kChar;
    case nrrdTypeUChar:
      return at::kByte;
    case nrrdTypeShort:
      return at::kShort;
    case nrrdTypeUShort:
      return at::kUInt16;
    case nrrdTypeInt:
      return at::kInt;
    case nrrdTypeUInt:
      return at::kUInt32;
    case nrrdTypeLLong:
      return at::kLong;
    case nrrdTypeULLong:
      return at::kUInt64;
    case nrrdTypeFloat:
      return at::kFloat;
    case nrrdTypeDouble:
      return at::kDouble;
    default:
      return at::kByte;
  }
}

std::string sizes_text(const Nrrd* n) {
  std::string s = "[";
  for (unsigned a = 0; a < n->dim; ++a) s += (a ? ", " : "") + std::to_string(n->axis[a].size);
  return s + "]";
}

/// Bytes a gzip stream starting at `offset` of `fd` decompresses to (all members); -1 with
/// `error` set when the stream is corrupt.
std::int64_t gzip_length(int fd, std::int64_t offset, std::string& error) {
  const int dup_fd = ::dup(fd);
  if (dup_fd < 0 || ::lseek(dup_fd, static_cast<off_t>(offset), SEEK_SET) < 0) {
    error = std::strerror(errno);
    if (dup_fd >= 0) ::close(dup_fd);
    return -1;
  }
  gzFile gz = gzdopen(dup_fd, "rb");
  if (!gz) {
    ::close(dup_fd);
    error = "cannot open the gzip stream";
    return -1;
  }
  std::vector<unsigned char> buf(1 << 20);
  std::int64_t total = 0;
  for (;;) {
    const int r = gzread(gz, buf.data(), static_cast<unsigned>(buf.size()));
    if (r < 0) {
      int code = Z_OK;
      const char* msg = gzerror(gz, &code);
      error = msg ? msg : "zlib error";
      gzclose(gz);
      return -1;
    }
    if (r == 0) break;
    total += r;
  }
  int code = Z_OK;
  const char* msg = gzerror(gz, &code);
  if (code != Z_OK && code != Z_BUF_ERROR) error = msg ? msg : "zlib error";
  gzclose(gz);
  return total;
}

/// After the header pass: the data, when it is one raw or gzip stream, must hold exactly
/// `expected` bytes (NrrdIO itself only notices data that is too short).
Status check_data_length(const std::string& file, const Nrrd* n, const NrrdIoState* nio,
                         std::int64_t expected) {
  if (!nio->dataFile || nio->lineSkip != 0 || nio->byteSkip != 0 || nio->dataFNArr->len > 1)
    return Status::ok();
  const bool raw = nio->encoding == nrrdEncodingRaw, gz = nio->encoding == nrrdEncodingGzip;
  if (!raw && !gz) return Status::ok();
  const int fd = fileno(nio->dataFile);
  const long pos = std::ftell(nio->dataFile);
  struct stat st {};
  if (fd < 0 || pos < 0 || ::fstat(fd, &st) != 0) return Status::ok();
  const std::string data_name = nio->dataFNArr->len == 1 ? std::string(nio->dataFN[0]) + " (the data file)"
                                                         : "the data after the header";
  const std::string what = "sizes: expected " + std::to_string(expected) + " bytes of " +
                           airEnumStr(nrrdType, n->type) + " data for sizes " + sizes_text(n) + " in " +
                           data_name + ", got ";
  const std::int64_t available = static_cast<std::int64_t>(st.st_size) - pos;
  if (raw) {
    if (available != expected) return corrupt_data(file + ": " + what + std::to_string(available));
    return Status::ok();
  }
  // gzip: the trailer's ISIZE is the length of the last member mod 2^32; decompress to count
  // only when it disagrees (several members, or sizes that do not match the data).
  if (available >= 18) {
    unsigned char tail[4];
    if (::pread(fd, tail, 4, st.st_size - 4) == 4) {
      const std::uint32_t isize =
          static_cast<std::uint32_t>(tail[0]) | (static_cast<std::uint32_t>(tail[1]) << 8) |
          (static_cast<std::uint32_t>(tail[2]) << 16) | (static_cast<std::uint32_t>(tail[3]) << 24);
      if (isize == static_cast<std::uint32_t>(expected)) return Status::ok();
    }
  }
  std::string error;
  const std::int64_t got = gzip_length(fd, pos, error);
  if (!error.empty())
    return corrupt_data(file + ": encoding: gzip data corrupt in " + data_name + ": " + error + " (after " +
                        std::to_string(got < 0 ? 0 : got) + " of " + std::to_string(expected) + " bytes)");
  if (got != expected)
    return corrupt_data(file + ": " + what + std::to_string(got) + " after gzip decompression");
  return Status::ok();
}

/// Reads the header into `header` (the data is skipped) and checks the type, the encoding
/// and the length of the data.
Status load_header(const std::string& file, Nrrd* header) {
  IoPtr nio(nrrdIoStateNew());
  nrrdIoStateSet(nio.get(), nrrdIoStateSkipData, 1);
  nrrdIoStateSet(nio.get(), nrrdIoStateKeepNrrdDataFileOpen, 1);
  if (nrrdLoad(header, file.c_str(), nio.get())) return biff_status(file);
  const Nrrd* n = header;
  if (n->type == nrrdTypeBlock)
    return unsupported(file + ": type: expected a scalar type, got block (" + std::to_string(n->blockSize) +
                       "-byte blocks)");
  if (!nio->encoding->available())
    return unsupported(file +
                       ": encoding: expected raw, ascii, hex or gzip (the encodings NrrdIO reads), got " +
                       nio->encoding->name);
  const std::int64_t expected =
      static_cast<std::int64_t>(nrrdElementNumber(n)) * static_cast<std::int64_t>(nrrdElementSize(n));
  return check_data_length(file, n, nio.get(), expected);
}

/// The spatial (domain) axes and the at most one other (range) axis of a header.
struct Axes {
  unsigned domain[NRRD_DIM_MAX] = {}, range[NRRD_DIM_MAX] = {};
  unsigned ndomain = 0, nrange = 0;
};

Result<Axes> spatial_axes(const std::string& file, const Nrrd* h) {
  Axes a;
  a.ndomain = nrrdDomainAxesGet(h, a.domain);
  a.nrange = nrrdRangeAxesGet(h, a.range);
  std::string kinds;
  for (unsigned k = 0; k < h->dim; ++k)
    kinds += std::string(k ? " " : "") + (h->axis[k].kind ? airEnumStr(nrrdKind, h->axis[k].kind) : "???");
  if (a.ndomain < 2 || a.ndomain > 3 || a.nrange > 1)
    return unsupported(file +
                       ": kinds: expected 2 or 3 spatial axes (domain, space) and at most one other (list, "
                       "vector, ...), got dimension " +
                       std::to_string(h->dim) + " with kinds " + kinds);
  if (h->spaceDim != 0 && h->spaceDim != a.ndomain)
    return unsupported(file + ": space: expected a space of dimension " + std::to_string(a.ndomain) +
                       " (the spatial axes), got " +
                       (h->space ? airEnumStr(nrrdSpace, h->space) : "space dimension") + " of dimension " +
                       std::to_string(h->spaceDim));
  return a;
}

/// Geometry (LPS) from space directions and origin, or per-axis spacings and axis mins.
Result<Geometry> nrrd_geometry(const std::string& file, const Nrrd* h, const Axes& axes) {
  std::array<std::array<double, 3>, 3> steps{};
  std::array<double, 3> origin{0.0, 0.0, 0.0};
  std::array<double, 3> flip{1.0, 1.0, 1.0};
  switch (h->space) {
    case nrrdSpaceRightAnteriorSuperior:
    case nrrdSpaceRightAnteriorSuperiorTime:
      flip = {-1.0, -1.0, 1.0};
      break;
    case nrrdSpaceLeftAnteriorSuperior:
    case nrrdSpaceLeftAnteriorSuperiorTime:
      flip = {1.0, -1.0, 1.0};
      break;
    default:  // LPS, scanner-xyz (LPS for a supine patient), 3D-right-handed, no space
      break;
  }
  for (unsigned k = 0; k < axes.ndomain; ++k) {
    const unsigned ax = axes.domain[k];
    double spacing = 1.0;
    double dir[NRRD_SPACE_DIM_MAX];
    const int status = nrrdSpacingCalculate(h, ax, &spacing, dir);
    switch (status) {
      case nrrdSpacingStatusDirection:
        for (unsigned r = 0; r < h->spaceDim; ++r) steps[k][r] = dir[r] * spacing * flip[r];
        break;
      case nrrdSpacingStatusScalarNoSpace:
        steps[k][k] = spacing;
        break;
      case nrrdSpacingStatusNone:
        steps[k][k] = 1.0;
        break;
      default:
        return corrupt_data(file + ": space directions: axis " + std::to_string(ax) +
                            " has no usable spacing or direction (NrrdIO spacing status " +
                            std::to_string(status) + ")");
    }
  }
  if (h->spaceDim) {
    if (std::isfinite(h->spaceOrigin[0]))
      for (unsigned r = 0; r < h->spaceDim; ++r) origin[r] = h->spaceOrigin[r] * flip[r];
  } else {
    double o[NRRD_DIM_MAX];
    Axes domain = axes;  // NrrdIO takes the axis list non-const
    if (nrrdOriginCalculate(h, domain.domain, axes.ndomain, nrrdCenterCell, o) == nrrdOriginStatusOkay)
      for (unsigned k = 0; k < axes.ndomain; ++k) origin[k] = o[k];
  }
  return detail::geometry_from_steps(static_cast<int>(axes.ndomain), steps, origin,
                                     file + ": space directions");
}

/// The data, read a second time with it, as (C, Z, Y, X) in the file's type.
Result<at::Tensor> nrrd_voxels(const std::string& file, const Nrrd* h, const Axes& axes) {
  NrrdPtr data(nrrdNew());
  if (nrrdLoad(data.get(), file.c_str(), nullptr)) return biff_status(file);
  Nrrd* n = data.get();
  if (n->dim != h->dim || n->type != h->type || !n->data)
    return internal_error(file + ": NrrdIO read the header differently the second time");
  std::vector<std::int64_t> mem_shape;  // slowest axis first
  for (unsigned a = n->dim; a-- > 0;) mem_shape.push_back(static_cast<std::int64_t>(n->axis[a].size));
  void* ptr = n->data;
  at::Tensor t = torch::from_blob(
      ptr, mem_shape, [](void* p) { std::free(p); }, torch::TensorOptions().dtype(torch_type(n->type)));
  n->data = nullptr;  // the tensor owns it now
  const auto dim = static_cast<std::int64_t>(n->dim);
  std::vector<std::int64_t> perm;
  if (axes.nrange == 1) perm.push_back(dim - 1 - axes.range[0]);
  for (unsigned k = axes.ndomain; k-- > 0;) perm.push_back(dim - 1 - axes.domain[k]);
  t = t.permute(perm);
  if (axes.nrange == 0) t = t.unsqueeze(0);
  if (axes.ndomain == 2) t = t.unsqueeze(1);
  return t.contiguous();
}

Result<Image> read_nrrd_locked(const fs::path& path) {
  const std::string file = path.string();
  NrrdPtr header(nrrdNew());
  SEGFLOW_RETURN_IF_ERROR(load_header(file, header.get()));
  SEGFLOW_ASSIGN_OR_RETURN(const Axes axes, spatial_axes(file, header.get()));
  Image image;
  SEGFLOW_ASSIGN_OR_RETURN(image.geometry, nrrd_geometry(file, header.get(), axes));
  SEGFLOW_ASSIGN_OR_RETURN(image.voxels, nrrd_voxels(file, header.get(), axes));
  image.source = path;
  return image;
}

int nrrd_type(at::ScalarType s) {
  switch (s) {
    case at::kBool:
    case at::kByte:
      return nrrdTypeUChar;
    case at::kChar:
      return nrrdTypeChar;
    case at::kShort:
      return nrrdTypeShort;
    case at::kUInt16:
      return nrrdTypeUShort;
    case at::kInt:
      return nrrdTypeInt;
    case at::kUInt32:
      return nrrdTypeUInt;
    case at::kLong:
      return nrrdTypeLLong;
    case at::kUInt64:
      return nrrdTypeULLong;
    case at::kHalf:
    case at::kBFloat16:
    case at::kFloat:
      return nrrdTypeFloat;
    case at::kDouble:
      return nrrdTypeDouble;
    default:
      return nrrdTypeUnknown;
  }
}

at::ScalarType stored_type(int t) { return torch_type(t); }

Status write_nrrd_impl(const fs::path& path, const Image& image, const NrrdWriteOptions& o) {
  const std::string file = path.string();
  if (!is_nrrd_path(path)) return invalid_argument(file + ": expected a .nrrd or .nhdr name");
  SEGFLOW_ASSIGN_OR_RETURN(at::Tensor v, detail::voxels_to_write(image, file));
  const int type = nrrd_type(v.scalar_type());
  if (type == nrrdTypeUnknown)
    return unsupported(file + ": voxels: dtype " + std::string(c10::toString(v.scalar_type())) +
                       " has no NRRD type; expected bool, (u)int8..64, float16/32/64");
  v = v.to(torch::kCPU).to(stored_type(type)).contiguous();
  const Geometry& g = image.geometry;
  if (!direction_is_orthonormal(g.direction, 1e-3))
    return invalid_argument(file + ": geometry.direction: expected an orthonormal matrix, got " +
                            describe(g));
  const std::int64_t c = v.size(0);
  // Memory is (C, Z, Y, X): NRRD axes fastest first are x, y, z, then the channels.
  std::size_t sizes[4] = {static_cast<std::size_t>(v.size(3)), static_cast<std::size_t>(v.size(2)),
                          static_cast<std::size_t>(v.size(1)), static_cast<std::size_t>(c)};
  const unsigned dim = c > 1 ? 4 : 3;
  double dirs[4][NRRD_SPACE_DIM_MAX];
  int kinds[4] = {nrrdKindDomain, nrrdKindDomain, nrrdKindDomain, nrrdKindList};
  for (auto& d : dirs)
    for (double& x : d) x = AIR_NAN;
  for (int a = 0; a < 3; ++a)
    for (int r = 0; r < 3; ++r)
      dirs[a][r] = g.direction[static_cast<std::size_t>(r * 3 + a)] * g.spacing[static_cast<std::size_t>(a)];
  double origin[NRRD_SPACE_DIM_MAX] = {g.origin[0], g.origin[1], g.origin[2]};

  detail::StagingDir staging(path);
  SEGFLOW_RETURN_IF_ERROR(staging.create());
  {
    std::lock_guard<std::mutex> lock(nrrd_mutex());
    std::unique_ptr<Nrrd, decltype(&nrrdNix)> n(nrrdNew(),
                                                &nrrdNix);  // wraps the tensor's memory: Nix, not Nuke
    IoPtr nio(nrrdIoStateNew());
    if (nrrdWrap_nva(n.get(), v.data_ptr(), type, dim, sizes) ||
        nrrdSpaceSet(n.get(), nrrdSpaceLeftPosteriorSuperior) || nrrdSpaceOriginSet(n.get(), origin))
      return biff_status(file, ErrorCode::internal);
    nrrdAxisInfoSet_nva(n.get(), nrrdAxisInfoSpaceDirection, dirs);
    nrrdAxisInfoSet_nva(n.get(), nrrdAxisInfoKind, kinds);
    nio->encoding = o.compress ? nrrdEncodingGzip : nrrdEncodingRaw;
    nio->zlibLevel = 1;
    if (nrrdSave(staging.file().string().c_str(), n.get(), nio.get()))
      return biff_status(file, ErrorCode::io_error);
  }
  return staging.commit();
}

}  // namespace

Result<Image> read_nrrd(const fs::path& path) {
  const std::string file = path.string();
  std::error_code ec;
  const auto st = fs::status(path, ec);
  if (!fs::exists(st)) return not_found(file + ": no such file");
  if (!fs::is_regular_file(st)) return invalid_argument(file + ": not a regular file");
  if (fs::file_size(path, ec) == 0)
    return corrupt_data(file + ": empty file (0 bytes), expected a NRRD header");
  try {
    std::lock_guard<std::mutex> lock(nrrd_mutex());
    return read_nrrd_locked(path);
  } catch (const std::bad_alloc&) {
    return internal_error(file + ": out of memory reading the voxels");
  } catch (const std::exception& e) {
    return internal_error(file + ": " + e.what());
  }
}

Status write_nrrd(const fs::path& path, const Image& image, const NrrdWriteOptions& options) {
  try {
    return write_nrrd_impl(path, image, options);
  } catch (const std::exception& e) {
    return internal_error(path.string() + ": " + e.what());
  }
}

bool is_nrrd_path(const fs::path& p) { return format_from_name(p) == ImageFormat::nrrd; }

}  // namespace segflow::pipeline

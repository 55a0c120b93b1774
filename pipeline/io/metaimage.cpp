// MetaImage reader and writer. Reading: segflow scans the header lines (so that a missing
// or malformed required field is one clear error, before MetaIO would print its own
// messages to the console), MetaIO parses the header into numbers (aliases, geometry), and
// segflow reads the data: pread for raw data, zlib's inflate for CompressedData, each with
// exact length checks. Writing is MetaIO's.
#include "pipeline/io/metaimage.hpp"

#include <fcntl.h>
#include <metaImage.h>
#include <sys/stat.h>
#include <torch/torch.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <map>
#include <sstream>
#include <vector>

#include "pipeline/io/detail/volume_io.hpp"
#include "pipeline/io/image_formats.hpp"

namespace segflow::pipeline {

namespace fs = std::filesystem;

namespace {

constexpr std::int64_t kMaxHeaderBytes = 1 << 20;

/// One open file descriptor, closed on destruction.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

/// The header as text: key -> value, in order, and where the data starts in the file.
struct HeaderText {
  std::map<std::string, std::string> fields;
  std::vector<std::string> order;
  std::int64_t data_offset = 0;  ///< just after the ElementDataFile line
};

std::string trim(std::string s) {
  auto sp = [](unsigned char c) { return std::isspace(c) != 0; };
  while (!s.empty() && sp(static_cast<unsigned char>(s.back()))) s.pop_back();
  std::size_t b = 0;
  while (b < s.size() && sp(static_cast<unsigned char>(s[b]))) ++b;
  return s.substr(b);
}

std::string shorten(const std::string& s) { return s.size() > 60 ? s.substr(0, 57) + "..." : s; }

Result<HeaderText> scan_header(const std::string& file, int fd, std::int64_t file_size) {
  const std::int64_t n = std::min(file_size, kMaxHeaderBytes);
  std::string text(static_cast<std::size_t>(n), '\0');
  if (::pread(fd, text.data(), static_cast<std::size_t>(n), 0) != n)
    return io_error(file + ": read failed: " + std::strerror(errno));
  HeaderText h;
  std::size_t pos = 0;
  int line_no = 0;
  while (pos < text.size()) {
    std::size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (trim(line).empty()) continue;
    const auto eq = line.find('=');
    if (eq == std::string::npos || trim(line.substr(0, eq)).empty())
      return corrupt_data(file + ": header line " + std::to_string(line_no) +
                          ": expected 'Key = Value' (a MetaImage header), got \"" + shorten(line) + "\"");
    const std::string key = trim(line.substr(0, eq));
    h.fields[key] = trim(line.substr(eq + 1));
    h.order.push_back(key);
    if (key == "ElementDataFile") {
      h.data_offset = static_cast<std::int64_t>(std::min(pos, text.size()));
      return h;
    }
  }
  return corrupt_data(file +
                      ": ElementDataFile: expected a last header line 'ElementDataFile = LOCAL' or '= <data "
                      "file>', got none in the first " +
                      std::to_string(n) + " bytes");
}

std::vector<std::string> words(const std::string& s) {
  std::istringstream in(s);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

bool parse_int(const std::string& s, std::int64_t& v) {
  try {
    std::size_t used = 0;
    v = std::stoll(s, &used);
    return used == s.size();
  } catch (...) {
    return false;
  }
}

bool is_true(const std::string& s) {
  std::string l = s;
  std::transform(l.begin(), l.end(), l.begin(), ::tolower);
  return l == "true" || l == "1";
}

struct ElementType {
  MET_ValueEnumType met;
  at::ScalarType torch;
};

constexpr ElementType kTypes[] = {
    {MET_CHAR, at::kChar},         {MET_UCHAR, at::kByte},   {MET_SHORT, at::kShort},
    {MET_USHORT, at::kUInt16},     {MET_INT, at::kInt},      {MET_UINT, at::kUInt32},
    {MET_LONG, at::kInt},          {MET_ULONG, at::kUInt32}, {MET_LONG_LONG, at::kLong},
    {MET_ULONG_LONG, at::kUInt64}, {MET_FLOAT, at::kFloat},  {MET_DOUBLE, at::kDouble},
};

std::string type_names() {
  std::string s;
  for (const auto& t : kTypes) s += std::string(s.empty() ? "" : ", ") + MET_ValueTypeName[t.met];
  return s;
}

/// Inflates `in` (zlib or gzip framing) into exactly `out_n` bytes at `out`.
Status inflate_exact(const std::vector<unsigned char>& in, unsigned char* out, std::int64_t out_n,
                     const std::string& where, const std::string& expected_text) {
  constexpr std::int64_t kChunk = 1 << 30;  // avail_in/avail_out are 32-bit
  z_stream zs{};
  if (inflateInit2(&zs, 15 + 32) != Z_OK) return internal_error(where + ": zlib inflateInit2 failed");
  zs.next_in = const_cast<unsigned char*>(in.data());
  std::int64_t in_left = static_cast<std::int64_t>(in.size()), out_done = 0;
  int rc = Z_OK;
  bool truncated = false;
  for (;;) {
    if (zs.avail_in == 0 && in_left > 0) {
      zs.avail_in = static_cast<uInt>(std::min(in_left, kChunk));
      in_left -= zs.avail_in;
    }
    if (zs.avail_out == 0) {
      if (out_done >= out_n) break;  // full
      zs.next_out = out + out_done;
      zs.avail_out = static_cast<uInt>(std::min(out_n - out_done, kChunk));
    }
    const uInt before = zs.avail_out;
    rc = inflate(&zs, Z_NO_FLUSH);
    out_done += before - zs.avail_out;
    if (rc == Z_STREAM_END) break;
    if (rc == Z_BUF_ERROR && zs.avail_in == 0 && in_left == 0) {
      truncated = true;
      break;
    }
    if (rc != Z_OK && rc != Z_BUF_ERROR) break;
  }
  bool more = false;
  if (rc != Z_STREAM_END && !truncated && (rc == Z_OK || rc == Z_BUF_ERROR) && out_done >= out_n) {
    unsigned char probe[64];  // the output is full: does the stream hold more?
    zs.next_out = probe;
    zs.avail_out = sizeof probe;
    if (zs.avail_in == 0 && in_left > 0) zs.avail_in = static_cast<uInt>(std::min(in_left, kChunk));
    rc = inflate(&zs, Z_NO_FLUSH);
    more = zs.avail_out < sizeof probe;
    if (rc == Z_BUF_ERROR) rc = Z_OK;
  }
  const std::string msg = zs.msg ? zs.msg : "zlib error " + std::to_string(rc);
  inflateEnd(&zs);
  if (rc != Z_OK && rc != Z_STREAM_END && rc != Z_BUF_ERROR)
    return corrupt_data(where + ": CompressedData: corrupt zlib stream (" + msg + ") after " +
                        std::to_string(out_done) + " of " + std::to_string(out_n) + " bytes");
  if (out_done < out_n)
    return corrupt_data(where + ": DimSize: expected " + expected_text + ", got " + std::to_string(out_done) +
                        " after decompression" + (truncated ? " (the compressed data ends early)" : ""));
  if (more)
    return corrupt_data(where + ": DimSize: expected " + expected_text + ", got more after decompression");
  return Status::ok();
}

/// The required fields, checked on the header text.
struct RequiredFields {
  std::int64_t ndims = 0;
  std::vector<std::int64_t> dims;  ///< DimSize: x, y (, z)
  const ElementType* type = nullptr;
  std::string data_name;  ///< ElementDataFile: LOCAL or a file name
};

Result<RequiredFields> check_required_fields(const std::string& file, const HeaderText& h) {
  auto field = [&](const char* k) -> const std::string* {
    auto it = h.fields.find(k);
    return it == h.fields.end() ? nullptr : &it->second;
  };
  RequiredFields f;
  if (const auto* ot = field("ObjectType"); ot && *ot != "Image")
    return unsupported(file + ": ObjectType: expected Image, got " + *ot);
  const std::string* nd = field("NDims");
  if (!nd || !parse_int(*nd, f.ndims))
    return corrupt_data(file + ": NDims: expected 2 or 3, got " +
                        (nd ? "\"" + *nd + "\"" : std::string("none")));
  if (f.ndims != 2 && f.ndims != 3) return unsupported(file + ": NDims: expected 2 or 3, got " + *nd);
  const std::string* ds = field("DimSize");
  const auto dim_words = ds ? words(*ds) : std::vector<std::string>{};
  for (const auto& w : dim_words) {
    std::int64_t v = 0;
    if (parse_int(w, v) && v > 0 && v <= INT32_MAX) f.dims.push_back(v);
  }
  if (f.dims.size() != static_cast<std::size_t>(f.ndims) || dim_words.size() != f.dims.size())
    return corrupt_data(file + ": DimSize: expected " + std::to_string(f.ndims) + " positive integers, got " +
                        (ds ? "\"" + *ds + "\"" : std::string("none")));
  if (std::find(h.order.begin(), h.order.end(), "NDims") >
      std::find(h.order.begin(), h.order.end(), "DimSize"))
    return corrupt_data(file + ": DimSize: expected after NDims, got it before");
  const std::string* et = field("ElementType");
  MET_ValueEnumType met = MET_NONE;
  if (et && MET_StringToType(et->c_str(), &met))
    for (const auto& t : kTypes)
      if (t.met == met) f.type = &t;
  if (!f.type)
    return unsupported(file + ": ElementType: expected one of " + type_names() + ", got " +
                       (et ? *et : std::string("none")));
  if (const auto* bd = field("BinaryData"); bd && !is_true(*bd))
    return unsupported(file + ": BinaryData: expected True (ASCII data is not supported), got " + *bd);
  f.data_name = *field("ElementDataFile");
  if (f.data_name == "LIST" || f.data_name.rfind("LIST ", 0) == 0 ||
      f.data_name.find('%') != std::string::npos)
    return unsupported(file + ": ElementDataFile: expected LOCAL or one data file, got \"" + f.data_name +
                       "\" (slice lists and file patterns are not supported)");
  if (f.data_name.empty())
    return corrupt_data(file + ": ElementDataFile: expected LOCAL or a data file name, got nothing");
  return f;
}

/// The numbers MetaIO parses from the header: channels, data size, layout and geometry.
struct ParsedHeader {
  int channels = 1;
  int elem = 0;               ///< bytes per element
  std::int64_t voxels = 0;    ///< elements, channels included
  std::int64_t expected = 0;  ///< bytes of data
  std::string expected_text;  ///< "N bytes of MET_SHORT for DimSize [x, y, z]"
  bool compressed = false;    ///< CompressedData
  int header_size = 0;        ///< HeaderSize (-1: the data is the end of the file)
  bool msb = false;           ///< BinaryDataByteOrderMSB
  Geometry geometry;
};

Result<ParsedHeader> parse_header_numbers(const std::string& file, const RequiredFields& f) {
  MetaImage m;
  if (!m.Read(file.c_str(), false))
    return corrupt_data(file + ": MetaIO could not parse the header (its message is printed above)");
  ParsedHeader p;
  p.channels = m.ElementNumberOfChannels();
  if (p.channels < 1)
    return corrupt_data(file + ": ElementNumberOfChannels: expected >= 1, got " + std::to_string(p.channels));
  MET_SizeOfType(f.type->met, &p.elem);
  p.voxels = p.channels;
  for (auto d : f.dims) p.voxels *= d;
  p.expected = p.voxels * p.elem;
  std::string dims_text = "[";
  for (std::size_t i = 0; i < f.dims.size(); ++i) dims_text += (i ? ", " : "") + std::to_string(f.dims[i]);
  dims_text += "]";
  p.expected_text = std::to_string(p.expected) + " bytes of " + MET_ValueTypeName[f.type->met] +
                    " for DimSize " + dims_text +
                    (p.channels > 1 ? " x " + std::to_string(p.channels) + " channels" : "");
  p.compressed = m.CompressedData();
  p.header_size = m.HeaderSize();
  p.msb = m.BinaryDataByteOrderMSB();

  std::array<std::array<double, 3>, 3> steps{};
  std::array<double, 3> origin{0.0, 0.0, 0.0};
  for (int a = 0; a < f.ndims; ++a) {
    origin[static_cast<std::size_t>(a)] = m.Offset(a);
    for (int r = 0; r < f.ndims; ++r)
      steps[static_cast<std::size_t>(a)][static_cast<std::size_t>(r)] =
          m.TransformMatrix(a, r) * m.ElementSpacing(a);
  }
  SEGFLOW_ASSIGN_OR_RETURN(p.geometry,
                           detail::geometry_from_steps(static_cast<int>(f.ndims), steps, origin,
                                                       file + ": TransformMatrix/ElementSpacing"));
  return p;
}

/// Where the data is: the header file itself (LOCAL) or the ElementDataFile beside it.
struct DataSource {
  Fd fd;
  std::int64_t size = 0;    ///< bytes in the file
  std::int64_t offset = 0;  ///< where the data starts
  bool local = false;
  std::string where;  ///< the file, and the data file when detached, for messages
};

Status open_data(const fs::path& path, const HeaderText& h, const RequiredFields& f, const ParsedHeader& p,
                 const Fd& header_fd, std::int64_t file_size, DataSource& d) {
  const std::string file = path.string();
  d.local = f.data_name == "LOCAL";
  fs::path data_path = path;
  if (!d.local) {
    data_path = f.data_name;
    if (data_path.is_relative()) data_path = path.parent_path() / data_path;
  }
  d.where = d.local ? file : file + " (ElementDataFile " + data_path.string() + ")";
  d.size = file_size;
  std::error_code ec;
  if (d.local) {
    d.fd.fd = ::dup(header_fd.fd);
  } else {
    if (!fs::is_regular_file(data_path, ec))
      return not_found(file + ": ElementDataFile: expected a readable file " + data_path.string() +
                       ", got no such file");
    d.fd.fd = ::open(data_path.c_str(), O_RDONLY | O_CLOEXEC);
    if (d.fd.fd < 0) return io_error(data_path.string() + ": cannot open: " + std::strerror(errno));
    d.size = static_cast<std::int64_t>(fs::file_size(data_path, ec));
  }
  d.offset = d.local ? h.data_offset : 0;
  if (p.header_size > 0) d.offset += p.header_size;
  if (p.header_size == -1) {
    if (p.compressed)
      return unsupported(
          file + ": HeaderSize: -1 (data at the end of the file) with CompressedData is not supported");
    d.offset = d.size - p.expected;
    if (d.offset < 0)
      return corrupt_data(d.where + ": DimSize: expected " + p.expected_text + ", got " +
                          std::to_string(d.size));
  }
  return Status::ok();
}

/// Reads up to n bytes at `offset` (pread in pieces of at most 1 GiB); how many it got.
Result<std::int64_t> read_data_at(const DataSource& d, unsigned char* dst, std::int64_t n,
                                  std::int64_t offset) {
  std::int64_t done = 0;
  while (done < n) {
    const ssize_t r =
        ::pread(d.fd.fd, dst + done, static_cast<std::size_t>(std::min<std::int64_t>(n - done, 1 << 30)),
                static_cast<off_t>(offset + done));
    if (r < 0) return io_error(d.where + ": read failed: " + std::strerror(errno));
    if (r == 0) break;
    done += r;
  }
  return done;
}

/// Raw data: exactly the expected bytes after the offset.
Status read_raw(const DataSource& d, const ParsedHeader& p, unsigned char* dst) {
  const std::int64_t available = d.size - d.offset;
  if (available != p.expected)
    return corrupt_data(d.where + ": DimSize: expected " + p.expected_text +
                        (d.local ? " after the header" : "") + ", got " +
                        std::to_string(std::max<std::int64_t>(available, 0)));
  SEGFLOW_ASSIGN_OR_RETURN(std::int64_t done, read_data_at(d, dst, p.expected, d.offset));
  if (done != p.expected)
    return corrupt_data(d.where + ": DimSize: expected " + p.expected_text + ", got " + std::to_string(done));
  return Status::ok();
}

/// CompressedData: CompressedDataSize bytes (else the rest of the file), inflated into
/// exactly the expected bytes.
Status read_compressed(const std::string& file, const HeaderText& h, const DataSource& d,
                       const ParsedHeader& p, unsigned char* dst) {
  std::int64_t csize = d.size - d.offset;
  if (auto it = h.fields.find("CompressedDataSize"); it != h.fields.end()) {
    const std::string& cds = it->second;
    std::int64_t v = 0;
    if (!parse_int(cds, v) || v < 0)
      return corrupt_data(file + ": CompressedDataSize: expected a non-negative integer, got \"" + cds +
                          "\"");
    if (v > 0) {
      if (v > csize)
        return corrupt_data(d.where + ": CompressedDataSize: expected " + std::to_string(v) +
                            " bytes of compressed data, got " +
                            std::to_string(std::max<std::int64_t>(csize, 0)));
      csize = v;
    }
  }
  if (csize <= 0) return corrupt_data(d.where + ": CompressedData: expected compressed data, got 0 bytes");
  std::vector<unsigned char> in(static_cast<std::size_t>(csize));
  SEGFLOW_ASSIGN_OR_RETURN(std::int64_t done, read_data_at(d, in.data(), csize, d.offset));
  in.resize(static_cast<std::size_t>(done));
  return inflate_exact(in, dst, p.expected, d.where, p.expected_text);
}

Result<Image> read_metaimage_impl(const fs::path& path) {
  const std::string file = path.string();
  std::error_code ec;
  const auto st = fs::status(path, ec);
  if (!fs::exists(st)) return not_found(file + ": no such file");
  if (!fs::is_regular_file(st)) return invalid_argument(file + ": not a regular file");
  const auto file_size = static_cast<std::int64_t>(fs::file_size(path, ec));
  if (ec) return io_error(file + ": cannot stat: " + ec.message());
  if (file_size == 0) return corrupt_data(file + ": empty file (0 bytes), expected a MetaImage header");
  Fd header_fd;
  header_fd.fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (header_fd.fd < 0) return io_error(file + ": cannot open: " + std::strerror(errno));

  // 1. The required fields, checked on the text. 2. MetaIO parses the numbers.
  SEGFLOW_ASSIGN_OR_RETURN(HeaderText h, scan_header(file, header_fd.fd, file_size));
  SEGFLOW_ASSIGN_OR_RETURN(RequiredFields f, check_required_fields(file, h));
  SEGFLOW_ASSIGN_OR_RETURN(ParsedHeader p, parse_header_numbers(file, f));

  // 3. The data, in memory order (Z,) Y, X, C.
  DataSource d;
  SEGFLOW_RETURN_IF_ERROR(open_data(path, h, f, p, header_fd, file_size, d));
  std::vector<std::int64_t> shape;
  for (auto it = f.dims.rbegin(); it != f.dims.rend(); ++it) shape.push_back(*it);
  shape.push_back(p.channels);
  at::Tensor t = torch::empty(shape, torch::TensorOptions().dtype(f.type->torch));
  auto* dst = static_cast<unsigned char*>(t.data_ptr());
  SEGFLOW_RETURN_IF_ERROR(p.compressed ? read_compressed(file, h, d, p, dst) : read_raw(d, p, dst));
  if (p.msb && p.elem > 1) detail::swap_bytes(dst, p.voxels, p.elem);  // this host is little-endian

  // (Z, Y, X, C) -> (C, Z, Y, X); 2D (Y, X, C) -> (C, 1, Y, X).
  if (f.ndims == 2) t = t.unsqueeze(0);
  Image image;
  image.voxels = t.permute({3, 0, 1, 2}).contiguous();
  image.geometry = p.geometry;
  image.source = path;
  return image;
}

MET_ValueEnumType met_type(at::ScalarType s) {
  switch (s) {
    case at::kBool:
    case at::kByte:
      return MET_UCHAR;
    case at::kChar:
      return MET_CHAR;
    case at::kShort:
      return MET_SHORT;
    case at::kUInt16:
      return MET_USHORT;
    case at::kInt:
      return MET_INT;
    case at::kUInt32:
      return MET_UINT;
    case at::kLong:
      return MET_LONG_LONG;
    case at::kUInt64:
      return MET_ULONG_LONG;
    case at::kHalf:
    case at::kBFloat16:
    case at::kFloat:
      return MET_FLOAT;
    case at::kDouble:
      return MET_DOUBLE;
    default:
      return MET_NONE;
  }
}

/// MetaIO's AnatomicalOrientation letters (ITK's convention: the side each axis comes from,
/// "RAI" for the identity in LPS) of the nearest patient axis of each direction column.
std::string orientation_letters(const Geometry& g) {
  std::string s;
  for (int a = 0; a < 3; ++a) {
    int best = 0;
    for (int r = 1; r < 3; ++r)
      if (std::abs(g.direction[static_cast<std::size_t>(r * 3 + a)]) >
          std::abs(g.direction[static_cast<std::size_t>(best * 3 + a)]))
        best = r;
    const bool positive = g.direction[static_cast<std::size_t>(best * 3 + a)] > 0;
    static const char from_pos[] = {'R', 'A', 'I'}, from_neg[] = {'L', 'P', 'S'};
    s += positive ? from_pos[best] : from_neg[best];
  }
  return s;
}

Status write_metaimage_impl(const fs::path& path, const Image& image, const MetaImageWriteOptions& o) {
  const std::string file = path.string();
  if (!is_metaimage_path(path)) return invalid_argument(file + ": expected a .mha or .mhd name");
  SEGFLOW_ASSIGN_OR_RETURN(at::Tensor v, detail::voxels_to_write(image, file));
  const MET_ValueEnumType met = met_type(v.scalar_type());
  if (met == MET_NONE)
    return unsupported(file + ": voxels: dtype " + std::string(c10::toString(v.scalar_type())) +
                       " has no MetaImage type; expected bool, (u)int8..64, float16/32/64");
  at::ScalarType stored = at::kByte;
  for (const auto& t : kTypes)
    if (t.met == met) stored = t.torch;
  for (std::int64_t s : v.sizes())
    if (s > INT32_MAX) return invalid_argument(file + ": voxels: MetaImage sizes are limited to 2^31 - 1");
  const Geometry& g = image.geometry;
  if (!direction_is_orthonormal(g.direction, 1e-3))
    return invalid_argument(file + ": geometry.direction: expected an orthonormal matrix, got " +
                            describe(g));
  // MetaImage channels are interleaved: (C, Z, Y, X) -> (Z, Y, X, C).
  v = v.to(torch::kCPU).to(stored).permute({1, 2, 3, 0}).contiguous();
  const int dims[3] = {static_cast<int>(v.size(2)), static_cast<int>(v.size(1)), static_cast<int>(v.size(0))};
  MetaImage m(3, dims, g.spacing.data(), met, static_cast<int>(v.size(3)), v.data_ptr());
  m.AutoFreeElementData(false);
  double tm[9];
  for (int a = 0; a < 3; ++a)
    for (int r = 0; r < 3; ++r)
      tm[a * 3 + r] = g.direction[static_cast<std::size_t>(r * 3 + a)];  // rows: axes
  m.TransformMatrix(tm);
  m.Offset(g.origin.data());
  m.AnatomicalOrientation(orientation_letters(g).c_str());
  m.BinaryData(true);
  m.BinaryDataByteOrderMSB(false);
  m.CompressedData(o.compress);
  detail::StagingDir staging(path);
  SEGFLOW_RETURN_IF_ERROR(staging.create());
  const std::string head = staging.file().string();
  std::string data_file;
  if (path.extension() == ".mhd") data_file = path.stem().string() + (o.compress ? ".zraw" : ".raw");
  const std::string cwd_data =
      data_file.empty() ? std::string() : (staging.file().parent_path() / data_file).string();
  if (!m.Write(head.c_str(), data_file.empty() ? nullptr : cwd_data.c_str(), true))
    return io_error(file + ": MetaIO could not write the file (its message is printed above)");
  return staging.commit();
}

}  // namespace

Result<Image> read_metaimage(const fs::path& path) {
  try {
    return read_metaimage_impl(path);
  } catch (const std::bad_alloc&) {
    return internal_error(path.string() + ": out of memory reading the voxels");
  } catch (const std::exception& e) {
    return internal_error(path.string() + ": " + e.what());
  }
}

Status write_metaimage(const fs::path& path, const Image& image, const MetaImageWriteOptions& options) {
  try {
    return write_metaimage_impl(path, image, options);
  } catch (const std::exception& e) {
    return internal_error(path.string() + ": " + e.what());
  }
}

bool is_metaimage_path(const fs::path& p) { return format_from_name(p) == ImageFormat::metaimage; }

}  // namespace segflow::pipeline

#include "pipeline/io/detail/volume_io.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>

namespace segflow::pipeline::detail {

Result<at::Tensor> voxels_to_write(const Image& image, const std::string& file) {
  if (!image.voxels.defined())
    return invalid_argument(file + ": voxels: expected a tensor, got an undefined one");
  at::Tensor v = image.voxels;
  if (v.dim() == 3) v = v.unsqueeze(0);
  if (v.dim() != 4)
    return invalid_argument(file + ": voxels: expected (C, Z, Y, X) or (Z, Y, X), got " +
                            std::to_string(v.dim()) + " dimensions");
  return v;
}

std::string format_vector(const std::array<double, 3>& v, int n) {
  std::string s = "(";
  char buf[32];
  for (int i = 0; i < n; ++i) {
    std::snprintf(buf, sizeof buf, "%.17g", v[static_cast<std::size_t>(i)]);
    if (i) s += ',';
    s += buf;
  }
  return s + ")";
}

Result<Geometry> geometry_from_steps(int ndims, const std::array<std::array<double, 3>, 3>& steps,
                                     const std::array<double, 3>& origin, const std::string& where) {
  if (ndims != 2 && ndims != 3)
    return internal_error(where + ": expected 2 or 3 spatial axes, got " + std::to_string(ndims));
  Geometry g;
  for (int a = 0; a < 3; ++a) {
    if (!std::isfinite(origin[static_cast<std::size_t>(a)]))
      return corrupt_data(where + ": expected a finite origin, got " + format_vector(origin, ndims));
  }
  g.origin = origin;
  for (int a = 0; a < ndims; ++a) {
    const auto& s = steps[static_cast<std::size_t>(a)];
    const double norm = std::sqrt(s[0] * s[0] + s[1] * s[1] + s[2] * s[2]);
    if (!std::isfinite(norm) || norm <= 0.0)
      return corrupt_data(where + ": expected a non-zero finite vector for axis " + std::to_string(a) +
                          ", got " + format_vector(s, ndims));
    g.spacing[static_cast<std::size_t>(a)] = norm;
    for (int r = 0; r < 3; ++r)
      g.direction[static_cast<std::size_t>(r * 3 + a)] = s[static_cast<std::size_t>(r)] / norm;
  }
  if (ndims == 2) {
    g.spacing[2] = 1.0;
    g.direction[2] = 0.0;
    g.direction[5] = 0.0;
    g.direction[8] = 1.0;
  }
  if (!direction_is_orthonormal(g.direction, 1e-3)) {
    std::string got;
    for (int a = 0; a < ndims; ++a) {
      if (a) got += ' ';
      got += format_vector(steps[static_cast<std::size_t>(a)], ndims);
    }
    return unsupported(where + ": expected orthogonal axes (within 1e-3), got " + got +
                       " (sheared grids are not supported)");
  }
  return g;
}

namespace fs = std::filesystem;

StagingDir::StagingDir(const fs::path& target) : target_(target) {
  std::random_device rd;
  const fs::path parent = target.parent_path().empty() ? fs::path(".") : target.parent_path();
  dir_ = parent / (".segflow-tmp-" + target.filename().string() + "-" + std::to_string(rd()));
}

StagingDir::~StagingDir() {
  std::error_code ec;
  fs::remove_all(dir_, ec);
}

Status StagingDir::create() {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) return io_error(dir_.string() + ": cannot create: " + ec.message());
  return Status::ok();
}

Status StagingDir::commit() {
  std::error_code ec;
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir_, ec))
    if (e.path().filename() != target_.filename()) files.push_back(e.path());
  if (ec) return io_error(dir_.string() + ": cannot list: " + ec.message());
  files.push_back(file());
  const fs::path parent = target_.parent_path().empty() ? fs::path(".") : target_.parent_path();
  for (const auto& p : files) {
    fs::rename(p, parent / p.filename(), ec);
    if (ec)
      return io_error((parent / p.filename()).string() + ": rename from " + p.string() +
                      " failed: " + ec.message());
  }
  return Status::ok();
}

namespace {

template <class U>
void swap_words(unsigned char* p, std::int64_t count) {
  for (std::int64_t i = 0; i < count; ++i, p += sizeof(U)) {
    U u;
    std::memcpy(&u, p, sizeof u);
    if constexpr (sizeof(U) == 2) u = __builtin_bswap16(u);
    if constexpr (sizeof(U) == 4) u = __builtin_bswap32(u);
    if constexpr (sizeof(U) == 8) u = __builtin_bswap64(u);
    std::memcpy(p, &u, sizeof u);
  }
}

}  // namespace

void swap_bytes(unsigned char* p, std::int64_t count, int size) {
  if (size == 2) return swap_words<std::uint16_t>(p, count);
  if (size == 4) return swap_words<std::uint32_t>(p, count);
  if (size == 8) return swap_words<std::uint64_t>(p, count);
  for (std::int64_t i = 0; i < count; ++i, p += size) std::reverse(p, p + size);
}

}  // namespace segflow::pipeline::detail

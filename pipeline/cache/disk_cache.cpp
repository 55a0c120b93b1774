#include "pipeline/cache/disk_cache.hpp"

#include <torch/torch.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "pipeline/io/image.hpp"
#include "pipeline/pipeline_spec.hpp"

namespace segflow::pipeline {

namespace {

constexpr char kMagic[8] = {'S', 'F', 'C', 'A', 'C', 'H', 'E', '1'};
constexpr std::size_t kFixedHeader = 8 + 4 + 4 + 8 + 8 + 8;  // magic, version, header, payload, 2 hashes
constexpr std::size_t kAlign = 64;

std::size_t align_up(std::size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

inline std::uint64_t rotl(std::uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
inline std::uint64_t load64(const unsigned char* p) {
  std::uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

std::string hex64(std::uint64_t v) {
  static const char* d = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i, v >>= 4) s[static_cast<std::size_t>(i)] = d[v & 15];
  return s;
}

std::string errno_text() { return std::strerror(errno); }

/// Fields of one file for the key: size, mtime and a hash of its first and last bytes.
Status describe_file(const std::filesystem::path& p, std::int64_t ends, std::string& out) {
  struct stat st {};
  if (::stat(p.c_str(), &st) != 0)
    return not_found("disk cache: cannot stat " + p.string() + ": " + errno_text());
  const std::int64_t size = st.st_size;
  const std::int64_t mtime = static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1000000000LL + st.st_mtim.tv_nsec;
  out += "|size=" + std::to_string(size) + "|mtime=" + std::to_string(mtime);
  if (ends <= 0 || size == 0) return Status::ok();
  const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return io_error("disk cache: cannot open " + p.string() + ": " + errno_text());
  const std::int64_t head = std::min(size, ends);
  const std::int64_t tail = std::min(size - head, ends);
  std::vector<unsigned char> buf(static_cast<std::size_t>(head + tail));
  auto read_at = [&](unsigned char* dst, std::int64_t n, std::int64_t off) {
    while (n > 0) {
      const ssize_t r = ::pread(fd, dst, static_cast<std::size_t>(n), off);
      if (r <= 0) {
        if (r < 0 && errno == EINTR) continue;
        return false;
      }
      dst += r;
      n -= r;
      off += r;
    }
    return true;
  };
  const bool ok = read_at(buf.data(), head, 0) && read_at(buf.data() + head, tail, size - tail);
  ::close(fd);
  if (!ok) return io_error("disk cache: cannot read " + p.string() + ": " + errno_text());
  out += "|ends=" + hex64(hash_bytes(buf.data(), buf.size(), 7));
  return Status::ok();
}

/// A read-only view of a whole file, unmapped when the last user lets go.
struct Mapping {
  void* base = MAP_FAILED;
  std::size_t size = 0;
  ~Mapping() {
    if (base != MAP_FAILED && size > 0) ::munmap(base, size);
  }
  const unsigned char* bytes() const { return static_cast<const unsigned char*>(base); }
};

nlohmann::json geometry_json(const Geometry& g) {
  return {{"spacing", g.spacing}, {"origin", g.origin}, {"direction", g.direction}};
}

bool geometry_from(const nlohmann::json& j, Geometry& g) {
  try {
    g.spacing = j.at("spacing").get<std::array<double, 3>>();
    g.origin = j.at("origin").get<std::array<double, 3>>();
    g.direction = j.at("direction").get<std::array<double, 9>>();
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

std::uint64_t combine_hashes(const std::vector<std::uint64_t>& hs) {
  return hash_bytes(hs.data(), hs.size() * sizeof(std::uint64_t), 11);
}

}  // namespace

std::uint64_t hash_bytes(const void* data, std::size_t size, std::uint64_t seed) {
  // Four independent multiply-rotate lanes over 32-byte blocks, then the tail: a few GB/s,
  // enough to checksum cached volumes on every read.
  constexpr std::uint64_t k1 = 0x9E3779B185EBCA87ull, k2 = 0xC2B2AE3D27D4EB4Full, k3 = 0x165667B19E3779F9ull;
  const auto* p = static_cast<const unsigned char*>(data);
  std::uint64_t h0 = splitmix64(seed ^ 0x243F6A8885A308D3ull) ^ size;
  std::uint64_t a = h0 + k1, b = h0 ^ k2, c = h0 - k3, d = rotl(h0, 17) ^ k1;
  std::size_t n = size;
  while (n >= 32) {
    a = rotl(a ^ (load64(p) * k2), 31) * k1;
    b = rotl(b ^ (load64(p + 8) * k2), 29) * k1;
    c = rotl(c ^ (load64(p + 16) * k2), 27) * k1;
    d = rotl(d ^ (load64(p + 24) * k2), 33) * k1;
    p += 32;
    n -= 32;
  }
  std::uint64_t h =
      splitmix64(a) ^ rotl(splitmix64(b), 13) ^ rotl(splitmix64(c), 29) ^ rotl(splitmix64(d), 43);
  while (n >= 8) {
    h = rotl(h ^ (load64(p) * k2), 31) * k1 + k3;
    p += 8;
    n -= 8;
  }
  std::uint64_t last = 0;
  for (std::size_t i = 0; i < n; ++i) last |= static_cast<std::uint64_t>(p[i]) << (8 * i);
  h ^= splitmix64(last + n);
  return splitmix64(h);
}

nlohmann::json deterministic_spec(const Pipeline& pipeline) {
  nlohmann::json all = pipeline.to_json();
  nlohmann::json det = nlohmann::json::array();
  for (std::size_t i = 0; i < pipeline.cache_boundary() && i < all.size(); ++i) det.push_back(all[i]);
  return det;
}

DiskCache::DiskCache(DiskCacheOptions options) : options_(std::move(options)) {}

Result<std::shared_ptr<DiskCache>> DiskCache::open(const DiskCacheOptions& options) {
  if (options.dir.empty()) return invalid_argument("disk cache: dir: expected a folder, got \"\"");
  if (options.head_tail_bytes < 0 || options.folder_file_bytes < 0)
    return invalid_argument("disk cache: head_tail_bytes/folder_file_bytes: expected >= 0");
  std::error_code ec;
  std::filesystem::create_directories(options.dir, ec);
  if (!std::filesystem::is_directory(options.dir))
    return io_error("disk cache: cannot create folder " + options.dir.string() +
                    (ec ? ": " + ec.message() : std::string(": exists and is not a folder")));
  return std::make_shared<DiskCache>(options);
}

std::filesystem::path DiskCache::path_of(const std::string& key) const {
  return options_.dir / (key + ".sfc");
}

DiskCacheStats DiskCache::stats() const {
  return {hits_.load(), misses_.load(), corrupt_.load(), writes_.load(), write_errors_.load()};
}

Result<std::string> DiskCache::key_for(const CaseEntry& entry, const nlohmann::json& spec) const {
  std::string m = "segflow-disk-cache|v" + std::to_string(kDiskCacheVersion) + "|spec=" + spec.dump() +
                  "|case=" + entry.id;
  std::vector<std::filesystem::path> files = entry.images;
  if (entry.label) files.push_back(*entry.label);
  for (const auto& f : files) {
    m += "|file=" + f.string();
    std::error_code ec;
    if (std::filesystem::is_directory(f, ec)) {
      std::vector<std::filesystem::path> inner;
      for (auto it = std::filesystem::recursive_directory_iterator(f, ec);
           !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec))
        if (it->is_regular_file(ec)) inner.push_back(it->path());
      if (ec) return io_error("disk cache: cannot list " + f.string() + ": " + ec.message());
      std::sort(inner.begin(), inner.end());
      for (const auto& p : inner) {
        m += "|entry=" + std::filesystem::relative(p, f, ec).string();
        SEGFLOW_RETURN_IF_ERROR(describe_file(p, options_.folder_file_bytes, m));
      }
    } else {
      SEGFLOW_RETURN_IF_ERROR(describe_file(f, options_.head_tail_bytes, m));
    }
  }
  return hex64(hash_bytes(m.data(), m.size(), 1)) + hex64(hash_bytes(m.data(), m.size(), 2));
}

Result<std::optional<Sample>> DiskCache::load(const std::string& key) const {
  const std::filesystem::path path = path_of(key);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) {
      ++misses_;
      return std::optional<Sample>();
    }
    return io_error("disk cache: cannot open " + path.string() + ": " + errno_text());
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    return io_error("disk cache: cannot stat " + path.string() + ": " + errno_text());
  }
  auto corrupt = [&](const std::string& why) -> Result<std::optional<Sample>> {
    ++corrupt_;
    std::error_code ec;
    std::filesystem::remove(path, ec);
    (void)why;  // a corrupt entry is an ordinary miss; the counter tells it apart
    return std::optional<Sample>();
  };
  const auto size = static_cast<std::size_t>(st.st_size);
  if (size < kFixedHeader) {
    ::close(fd);
    return corrupt("shorter than the fixed header");
  }
  auto map = std::make_shared<Mapping>();
  map->base = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map->base == MAP_FAILED)
    return io_error("disk cache: cannot map " + path.string() + ": " + errno_text());
  map->size = size;
  const unsigned char* b = map->bytes();

  if (std::memcmp(b, kMagic, 8) != 0) return corrupt("bad magic");
  std::uint32_t version = 0, header_bytes = 0;
  std::uint64_t payload_bytes = 0, header_hash = 0, payload_hash = 0;
  std::memcpy(&version, b + 8, 4);
  std::memcpy(&header_bytes, b + 12, 4);
  std::memcpy(&payload_bytes, b + 16, 8);
  std::memcpy(&header_hash, b + 24, 8);
  std::memcpy(&payload_hash, b + 32, 8);
  if (version != kDiskCacheVersion) return corrupt("version");
  const std::size_t payload_at = align_up(kFixedHeader + header_bytes);
  if (payload_at + payload_bytes != size) return corrupt("size");
  if (hash_bytes(b + kFixedHeader, header_bytes, 3) != header_hash) return corrupt("header checksum");

  nlohmann::json header;
  try {
    header = nlohmann::json::parse(b + kFixedHeader, b + kFixedHeader + header_bytes);
  } catch (const std::exception&) {
    return corrupt("header json");
  }
  Sample sample;
  try {
    sample.id = header.at("id").get<std::string>();
    if (!geometry_from(header.at("geometry"), sample.geometry)) return corrupt("geometry");
    const unsigned char* payload = b + payload_at;
    std::vector<std::uint64_t> hashes;
    for (const auto& rec : header.at("tensors")) {
      const std::string name = rec.at("name").get<std::string>();
      const auto dtype = dtype_from_name(rec.at("dtype").get<std::string>());
      if (!dtype) return corrupt("dtype");
      const auto shape = rec.at("shape").get<std::vector<std::int64_t>>();
      const auto offset = rec.at("offset").get<std::uint64_t>();
      const auto bytes = rec.at("bytes").get<std::uint64_t>();
      std::int64_t numel = 1;
      for (std::int64_t s : shape) {
        if (s < 0) return corrupt("shape");
        numel *= s;
      }
      if (bytes != static_cast<std::uint64_t>(numel) * c10::elementSize(*dtype) || offset > payload_bytes ||
          bytes > payload_bytes - offset)
        return corrupt("tensor extent");
      hashes.push_back(rec.at("hash").get<std::uint64_t>());
      if (options_.verify_payload && hash_bytes(payload + offset, bytes, 5) != hashes.back())
        return corrupt("payload checksum");
      void* ptr = const_cast<unsigned char*>(payload + offset);
      sample.tensors[name] = torch::from_blob(
          ptr, shape, [map](void*) {}, torch::TensorOptions().dtype(*dtype));
    }
    if (combine_hashes(hashes) != payload_hash) return corrupt("payload hash list");
  } catch (const std::exception&) {
    return corrupt("header fields");
  }
  ++hits_;
  return std::optional<Sample>(std::move(sample));
}

Status DiskCache::store(const std::string& key, const Sample& sample) const {
  auto fail = [&](Status s) {
    ++write_errors_;
    return s;
  };
  nlohmann::json header;
  header["id"] = sample.id;
  header["key"] = key;
  header["geometry"] = geometry_json(sample.geometry);
  header["tensors"] = nlohmann::json::array();
  std::vector<at::Tensor> tensors;
  std::vector<std::uint64_t> hashes;
  std::uint64_t offset = 0;
  for (const auto& [name, t0] : sample.tensors) {
    at::Tensor t = t0.device().is_cpu() ? t0.contiguous() : t0.to(torch::kCPU).contiguous();
    const char* dn = dtype_name(t.scalar_type());
    if (!dn)
      return fail(unsupported("disk cache: tensor '" + name + "' of sample '" + sample.id + "' has dtype " +
                              std::string(c10::toString(t.scalar_type())) +
                              ", which the cache does not store"));
    const std::uint64_t bytes = t.numel() * t.element_size();
    hashes.push_back(hash_bytes(t.data_ptr(), bytes, 5));
    header["tensors"].push_back({{"name", name},
                                 {"dtype", dn},
                                 {"shape", t.sizes().vec()},
                                 {"offset", offset},
                                 {"bytes", bytes},
                                 {"hash", hashes.back()}});
    offset = align_up(offset + bytes);
    tensors.push_back(std::move(t));
  }
  const std::string hj = header.dump();
  const std::uint64_t payload_bytes = offset;
  const auto header_bytes = static_cast<std::uint32_t>(hj.size());
  const std::uint64_t header_hash = hash_bytes(hj.data(), hj.size(), 3);
  const std::uint64_t payload_hash = combine_hashes(hashes);

  std::string fixed(kFixedHeader, '\0');
  std::memcpy(fixed.data(), kMagic, 8);
  std::memcpy(fixed.data() + 8, &kDiskCacheVersion, 4);
  std::memcpy(fixed.data() + 12, &header_bytes, 4);
  std::memcpy(fixed.data() + 16, &payload_bytes, 8);
  std::memcpy(fixed.data() + 24, &header_hash, 8);
  std::memcpy(fixed.data() + 32, &payload_hash, 8);

  static std::atomic<std::uint64_t> counter{0};
  const std::filesystem::path final_path = path_of(key);
  const std::filesystem::path tmp = options_.dir / (key + ".sfc.tmp." + std::to_string(::getpid()) + "." +
                                                    std::to_string(counter.fetch_add(1)));
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return fail(io_error("disk cache: cannot create " + tmp.string() + ": " + errno_text()));
  auto write_all = [&](const void* data, std::size_t n) {
    const auto* p = static_cast<const char*>(data);
    while (n > 0) {
      const ssize_t w = ::write(fd, p, n);
      if (w < 0) {
        if (errno == EINTR) continue;
        return false;
      }
      p += w;
      n -= static_cast<std::size_t>(w);
    }
    return true;
  };
  static const std::array<char, kAlign> zeros{};
  bool ok = write_all(fixed.data(), fixed.size()) && write_all(hj.data(), hj.size());
  std::size_t pos = kFixedHeader + hj.size();
  if (ok) ok = write_all(zeros.data(), align_up(pos) - pos);
  std::uint64_t written = 0;
  for (const auto& t : tensors) {
    if (!ok) break;
    const std::uint64_t bytes = t.numel() * t.element_size();
    ok = write_all(t.data_ptr(), bytes);
    written += bytes;
    if (ok) {
      const std::uint64_t pad = align_up(written) - written;
      ok = write_all(zeros.data(), pad);
      written += pad;
    }
  }
  const std::string why = ok ? std::string() : errno_text();
  if (::close(fd) != 0 && ok) ok = false;
  std::error_code ec;
  if (!ok) {
    std::filesystem::remove(tmp, ec);
    return fail(io_error("disk cache: cannot write " + tmp.string() + ": " + why));
  }
  std::filesystem::rename(tmp, final_path, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    return fail(io_error("disk cache: cannot rename into " + final_path.string() + ": " + ec.message()));
  }
  ++writes_;
  return Status::ok();
}

}  // namespace segflow::pipeline

#pragma once
// A persistent on-disk cache of deterministic samples (the output of the stages before the
// cache boundary), so that a restarted job does not decode again.
//
// Key. 128 bits (32 hex digits) hashed from:
//   - a format version (kDiskCacheVersion),
//   - the deterministic spec: Pipeline::to_json() of the stages before cache_boundary()
//     (names and resolved options; see deterministic_spec()),
//   - the case id, and for each of its files (image channels, then the label), in order:
//     the path as given, the size, the modification time (ns), and a content hash of the
//     first and the last `head_tail_bytes` (1 MiB by default) of the file. A folder (a
//     DICOM series) contributes each regular file below it, sorted by relative path, with
//     the same fields but head/tail limited to `folder_file_bytes` (64 KiB) per file.
//   Hashing the whole file would cost as much as decoding it; size + mtime catch ordinary
//   rewrites and the head/tail hash catches a file replaced with one of the same size and
//   time (a copy with preserved mtime of other content). An edit in the middle of a large
//   file that keeps size and mtime is not detected: delete the cache folder in that case.
//   Code changes to a stage that keep its name and options are not seen either; bump
//   kDiskCacheVersion when a deterministic stage's output changes.
//
// File format (`<dir>/<key>.sfc`), little endian:
//   magic "SFCACHE1" (8) | u32 version | u32 header_bytes | u64 payload_bytes |
//   u64 header_hash | u64 payload_hash | header JSON (header_bytes) | zero padding to 64 |
//   payload: raw contiguous tensor bytes, each tensor at a 64-byte aligned offset.
//   The JSON header holds the id, the geometry, the case id, the key and one record per
//   tensor {name, dtype, shape, offset, bytes}. Files are written to a temporary file in
//   the same folder and renamed, so a reader sees a whole file or none.
//
// Reading maps the file (mmap, MAP_PRIVATE, readable and writable copy-on-write) and makes
// each tensor with torch::from_blob on the mapped region, zero-copy; the deleter holds the
// mapping, which is unmapped when the last tensor of the sample dies. Writes to such a
// tensor (no stage does that) stay private to the process. A file whose size, magic,
// version, header or checksum (header and, unless verify_payload is off, payload) do not
// match is corrupt: it is counted, removed, and read as a miss.
//
// Thread-safety: every member is const and safe to call from several threads (decoders).

#include <nlohmann/json.hpp>

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include "messages/sample.hpp"
#include "messages/status.hpp"
#include "pipeline/fwd.hpp"
#include "pipeline/io/dataset.hpp"

namespace segflow::pipeline {

/// Bump when the file format or a deterministic stage's output changes.
inline constexpr std::uint32_t kDiskCacheVersion = 1;

/// Options of a DiskCache.
struct DiskCacheOptions {
  std::filesystem::path dir;                  ///< cache folder (created when missing)
  std::int64_t head_tail_bytes = 1 << 20;     ///< bytes hashed at each end of a file, >= 0
  std::int64_t folder_file_bytes = 64 << 10;  ///< the same for each file of a folder, >= 0
  bool verify_payload = true;                 ///< checksum the tensor bytes on every read
};

/// Counters (monotonic, since the cache was opened).
struct DiskCacheStats {
  std::int64_t hits = 0;          ///< loads that found a valid file
  std::int64_t misses = 0;        ///< loads that found no file
  std::int64_t corrupt = 0;       ///< loads that found a corrupt file (removed, read as a miss)
  std::int64_t writes = 0;        ///< files written
  std::int64_t write_errors = 0;  ///< failed writes (the sample is still used)
};

/// The deterministic part of a pipeline as JSON: to_json() of stages [0, cache_boundary).
nlohmann::json deterministic_spec(const Pipeline& pipeline);

/// A folder of cached samples. Cheap to share (std::shared_ptr) between decoders.
class DiskCache {
 public:
  /// Creates the folder when missing; errors (io_error) when it cannot be created or is not
  /// a folder, and (invalid_argument) for negative byte counts.
  static Result<std::shared_ptr<DiskCache>> open(const DiskCacheOptions& options);

  /// The key of a case under a deterministic spec (see the header comment). Errors
  /// (not_found / io_error) when a file of the case cannot be read.
  Result<std::string> key_for(const CaseEntry& entry, const nlohmann::json& spec) const;

  /// The cached sample of `key`, std::nullopt on a miss (no file, or a corrupt one). An
  /// error only for an unexpected I/O failure (a file that exists but cannot be opened).
  Result<std::optional<Sample>> load(const std::string& key) const;

  /// Writes `sample` under `key` (temporary file + rename). Tensors must be on the CPU
  /// (they are made contiguous for writing). Overwrites an existing entry.
  Status store(const std::string& key, const Sample& sample) const;

  /// Path of the file of `key`.
  std::filesystem::path path_of(const std::string& key) const;
  const DiskCacheOptions& options() const { return options_; }
  DiskCacheStats stats() const;

  explicit DiskCache(DiskCacheOptions options);  // use open()

 private:
  DiskCacheOptions options_;
  mutable std::atomic<std::int64_t> hits_{0}, misses_{0}, corrupt_{0}, writes_{0}, write_errors_{0};
};

/// 64-bit hash of bytes (non-cryptographic; used for keys and checksums). `seed` selects an
/// independent function.
std::uint64_t hash_bytes(const void* data, std::size_t size, std::uint64_t seed = 0);

}  // namespace segflow::pipeline

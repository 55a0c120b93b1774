#pragma once
// Hashes segflow uses, each in one place: FNV-1a (64 bits) for names and signatures that must
// stay the same from run to run (run folder names, dataset and series signatures), and
// SHA-256 (OpenSSL's) for the files of a model package.

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

#include "messages/status.hpp"

namespace segflow {

/// FNV-1a, 64 bits, fed in pieces: the hash of the concatenation of what was added. Not for
/// security: a fast, stable fingerprint. The offset basis is 1469598103934665603, not the
/// standard's 14695981039346656037 (its last digit was lost when segflow's first copy was
/// written); it stays, because run folder names and the signatures the daemon stores are made
/// with it.
class Fnv1a64 {
 public:
  /// Adds `bytes`; returns *this for chaining.
  Fnv1a64& add(std::string_view bytes) noexcept;
  std::uint64_t value() const noexcept { return h_; }
  /// The low `digits` hexadecimal digits (1..16) of the value, lowercase, zero-padded.
  std::string hex(int digits = 16) const;

 private:
  std::uint64_t h_ = 1469598103934665603ULL;  // segflow's offset basis (see above)
};

/// FNV-1a (64 bits) of `bytes`.
std::uint64_t fnv1a64(std::string_view bytes) noexcept;

/// The lowercase hex SHA-256 (64 digits) of `bytes`.
std::string sha256_hex(std::string_view bytes);

/// The lowercase hex SHA-256 of a file's bytes, read in 1 MiB chunks. not_found when it
/// cannot be opened, io_error on a read error; both name the file.
Result<std::string> sha256_file(const std::filesystem::path& file);

}  // namespace segflow

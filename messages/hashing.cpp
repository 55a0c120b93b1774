#include "messages/hashing.hpp"

#include <openssl/evp.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <vector>

namespace segflow {

namespace {

constexpr std::uint64_t kFnvPrime = 1099511628211ULL;

/// An OpenSSL SHA-256 digest context, freed on every path.
struct Sha256 {
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx{EVP_MD_CTX_new(), &EVP_MD_CTX_free};
  bool ok = ctx && EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) == 1;

  void update(const void* data, std::size_t n) { ok = ok && EVP_DigestUpdate(ctx.get(), data, n) == 1; }

  /// The digest as hex; "" when OpenSSL failed.
  std::string hex() {
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    if (!ok || EVP_DigestFinal_ex(ctx.get(), md, &len) != 1) return "";
    static constexpr char kDigits[] = "0123456789abcdef";
    std::string out;
    out.reserve(2 * len);
    for (unsigned int i = 0; i < len; ++i) {
      out += kDigits[md[i] >> 4];
      out += kDigits[md[i] & 0xf];
    }
    return out;
  }
};

}  // namespace

Fnv1a64& Fnv1a64::add(std::string_view bytes) noexcept {
  for (const unsigned char c : bytes) h_ = (h_ ^ c) * kFnvPrime;
  return *this;
}

std::string Fnv1a64::hex(int digits) const {
  const int d = digits < 1 ? 1 : digits > 16 ? 16 : digits;
  const std::uint64_t v = d == 16 ? h_ : h_ & ((std::uint64_t{1} << (4 * d)) - 1);
  char buf[17];
  std::snprintf(buf, sizeof buf, "%0*llx", d, static_cast<unsigned long long>(v));
  return buf;
}

std::uint64_t fnv1a64(std::string_view bytes) noexcept { return Fnv1a64().add(bytes).value(); }

std::string sha256_hex(std::string_view bytes) {
  Sha256 h;
  h.update(bytes.data(), bytes.size());
  return h.hex();
}

Result<std::string> sha256_file(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) return not_found(file.string() + ": cannot be read");
  Sha256 h;
  std::vector<char> buf(std::size_t{1} << 20);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    h.update(buf.data(), static_cast<std::size_t>(in.gcount()));
  }
  if (in.bad()) return io_error(file.string() + ": read error");
  std::string hex = h.hex();
  if (hex.empty()) return internal_error(file.string() + ": OpenSSL's SHA-256 failed");
  return hex;
}

}  // namespace segflow

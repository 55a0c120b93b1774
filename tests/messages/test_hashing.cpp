// Hashes of every layer (messages/hashing.hpp): SHA-256 as FIPS 180-4 and Python's hashlib
// compute it, FNV-1a as an independent Python loop computes it with segflow's offset basis.
#include <doctest/doctest.h>

#include <filesystem>
#include <string>

#include "messages/hashing.hpp"
#include "test_util.hpp"

namespace fs = std::filesystem;
using segflow::ErrorCode;
using segflow::Fnv1a64;
using segflow::testing::run_python;
using segflow::testing::TempDir;
using segflow::testing::write_file;

namespace {

/// Python's answer without its trailing newline.
std::string python_line(const std::string& code, const std::vector<std::string>& args) {
  std::string out = run_python(code, args);
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return out;
}

}  // namespace

TEST_CASE("sha256_hex gives FIPS 180-4's digests of its example messages") {
  // FIPS 180-4 / NIST CSRC examples: "abc", the empty message and the two-block message.
  CHECK(segflow::sha256_hex("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(segflow::sha256_hex("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(segflow::sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq") ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

TEST_CASE("sha256_file of a file larger than its read chunk agrees with Python's hashlib") {
  TempDir dir("sha256");
  std::string bytes;
  for (int i = 0; bytes.size() < (std::size_t{3} << 20) + 17; ++i) bytes += std::to_string(i * 7919) + ",";
  const fs::path f = dir / "weights.bin";
  write_file(f, bytes);
  REQUIRE_OK_AND_ASSIGN(std::string ours, segflow::sha256_file(f));
  const std::string theirs = python_line(
      "import hashlib, sys; print(hashlib.sha256(open(sys.argv[1], 'rb').read()).hexdigest())", {f.string()});
  CHECK(ours == theirs);
  CHECK(segflow::sha256_hex(bytes) == theirs);
}

TEST_CASE("sha256_file of a missing file is not_found naming the file") {
  TempDir dir("sha256_missing");
  auto r = segflow::sha256_file(dir / "nope.pt");
  REQUIRE_FALSE(r.is_ok());
  CHECK(r.status().code() == ErrorCode::not_found);
  CHECK(r.status().message().find("nope.pt") != std::string::npos);
}

TEST_CASE("Fnv1a64 fed in pieces hashes their concatenation, as a Python FNV-1a loop does") {
  const std::string text =
      "spleen-unet\x1f"
      "12345\x1e"
      "case_007";
  Fnv1a64 pieces;
  pieces.add("spleen-unet")
      .add(
          "\x1f"
          "12345")
      .add("\x1e")
      .add("case_007");
  CHECK(pieces.value() == segflow::fnv1a64(text));
  const std::string theirs = python_line(
      "import sys\n"
      "h = 1469598103934665603\n"
      "for b in sys.argv[1].encode():\n"
      "    h = ((h ^ b) * 1099511628211) % 2**64\n"
      "print('%016x' % h)",
      {text});
  CHECK(pieces.hex() == theirs);
  CHECK(pieces.hex(8) == theirs.substr(8));  // the low 8 digits, as run folder names use them
}

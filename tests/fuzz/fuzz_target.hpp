#pragma once
// What every fuzz harness shares (tests/fuzz/README.md). A harness is one entry point of
// segflow fed with arbitrary bytes: SEGFLOW_FUZZ_TARGET(name) { ... } defines
// `int segflow::fuzz::run_<name>(const std::uint8_t*, std::size_t)`, and, in a libFuzzer
// build (SEGFLOW_LIBFUZZER defined, one harness per executable), LLVMFuzzerTestOneInput
// calling it. The replay suite links every harness into one doctest binary and feeds them
// their seed and regression files.
//
// A harness must never crash, hang or leak on any input; it checks what a successful read
// promises (invariant()) and aborts when a promise is broken, so the fuzzer and the replay
// test both report it.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

#include "pipeline/io/image.hpp"

namespace segflow::fuzz {

/// A per-process scratch folder (created on first use, under $TMPDIR), where harnesses of
/// path-based readers write their input.
const std::filesystem::path& scratch_dir();

/// Writes `size` bytes to scratch_dir()/name (replacing it) and returns the path.
std::filesystem::path write_input(const std::string& name, const std::uint8_t* data, std::size_t size);

/// Aborts with `what` on stderr when `ok` is false: a broken promise is a finding.
void invariant(bool ok, std::string_view what);

/// The promises of a successfully read image: a defined CPU tensor of rank 4 (C, Z, Y, X)
/// with at least one voxel, contiguous, spacing finite and > 0, origin finite, an
/// orthonormal direction, and every voxel readable (the sum is computed).
void check_image(const pipeline::Image& image);

}  // namespace segflow::fuzz

#ifdef SEGFLOW_LIBFUZZER
#define SEGFLOW_FUZZ_LIBFUZZER_ENTRY(name)                                            \
  extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) { \
    return segflow::fuzz::run_##name(data, size);                                     \
  }
#else
#define SEGFLOW_FUZZ_LIBFUZZER_ENTRY(name)
#endif

/// Declares the harness function `segflow::fuzz::run_<name>` (the replay suite calls it).
#define SEGFLOW_FUZZ_DECLARE(name)                            \
  namespace segflow::fuzz {                                   \
  int run_##name(const std::uint8_t* data, std::size_t size); \
  }

#define SEGFLOW_FUZZ_TARGET(name)    \
  SEGFLOW_FUZZ_DECLARE(name)         \
  SEGFLOW_FUZZ_LIBFUZZER_ENTRY(name) \
  int segflow::fuzz::run_##name(const std::uint8_t* data, std::size_t size)

#pragma once
// The .npy header: the Python dict literal after the magic, and dtype descriptors.
// Private to pipeline/io/npy.cpp; no LibTorch.

#include <cstdint>
#include <string>
#include <vector>

#include "messages/status.hpp"

namespace segflow::pipeline::detail {

/// The three keys of an .npy header dict.
struct NpyHeader {
  std::string descr;  ///< e.g. "<f4"
  bool fortran_order = false;
  std::vector<std::int64_t> shape;  ///< empty for a 0-d array
};

/// Parses "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }" (either quote
/// style, any spacing, Python 2 "3L" integers). Errors name `file` and the key.
Result<NpyHeader> parse_npy_dict(const std::string& text, const std::string& file);

/// Kind of element a descriptor names.
enum class NpyKind { boolean, signed_int, unsigned_int, floating };

/// A decoded descriptor: kind, bytes per element, and whether the file is big endian.
struct NpyType {
  NpyKind kind = NpyKind::floating;
  int size = 0;
  bool big_endian = false;
};

/// Decodes '|b1', '|u1', '|i1', '<i2', '>u4', '<f2', '<f8', ... (byte order '<', '>', '=' or
/// '|', the last only for one-byte types). Complex, object, string and structured
/// descriptors are `unsupported` errors that name the descriptor.
Result<NpyType> parse_npy_descr(const std::string& descr, const std::string& file);

/// "(2, 3)", "(5,)", "()" as Python writes a shape tuple.
std::string npy_shape_text(const std::vector<std::int64_t>& shape);

/// The complete version 1.0 header (magic, version, length, dict, space padding, newline),
/// its length a multiple of 64 as numpy writes it; version 2.0 if the dict needs > 65535 bytes.
std::string make_npy_header(const std::string& descr, const std::vector<std::int64_t>& shape);

}  // namespace segflow::pipeline::detail

#include "pipeline/io/detail/npy_header.hpp"

#include <cctype>

namespace segflow::pipeline::detail {

namespace {

/// A cursor over the dict literal with the few productions an .npy header uses.
class DictParser {
 public:
  DictParser(const std::string& s, const std::string& file) : s_(s), file_(file) {}

  Status fail(const std::string& field, const std::string& what) const {
    return corrupt_data(file_ + ": header" + (field.empty() ? "" : "." + field) + ": " + what + " in " +
                        quoted());
  }

  void skip_ws() {
    while (i_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[i_]))) ++i_;
  }
  bool eat(char c) {
    skip_ws();
    if (i_ < s_.size() && s_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  bool peek(char c) {
    skip_ws();
    return i_ < s_.size() && s_[i_] == c;
  }
  bool at_end() {
    skip_ws();
    return i_ >= s_.size();
  }

  Result<std::string> string(const std::string& field) {
    skip_ws();
    if (i_ >= s_.size() || (s_[i_] != '\'' && s_[i_] != '"')) return fail(field, "expected a quoted string");
    const char q = s_[i_++];
    std::string out;
    while (i_ < s_.size() && s_[i_] != q) {
      if (s_[i_] == '\\' && i_ + 1 < s_.size()) ++i_;
      out += s_[i_++];
    }
    if (i_ >= s_.size()) return fail(field, "unterminated string");
    ++i_;
    return out;
  }

  Result<bool> boolean(const std::string& field) {
    skip_ws();
    if (s_.compare(i_, 4, "True") == 0) {
      i_ += 4;
      return true;
    }
    if (s_.compare(i_, 5, "False") == 0) {
      i_ += 5;
      return false;
    }
    return fail(field, "expected True or False");
  }

  Result<std::vector<std::int64_t>> tuple(const std::string& field) {
    if (!eat('(')) return fail(field, "expected a tuple of integers");
    std::vector<std::int64_t> out;
    for (;;) {
      if (eat(')')) return out;
      skip_ws();
      std::int64_t v = 0;
      std::size_t digits = 0;
      while (i_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[i_]))) {
        if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, s_[i_] - '0', &v))
          return fail(field, "dimension too large");
        ++i_;
        ++digits;
      }
      if (digits == 0) return fail(field, "expected a non-negative integer");
      if (i_ < s_.size() && (s_[i_] == 'L' || s_[i_] == 'l')) ++i_;  // Python 2 long
      out.push_back(v);
      if (eat(',')) continue;
      if (peek(')')) continue;
      return fail(field, "expected ',' or ')'");
    }
  }

  /// The whole header text, quoted, for error messages.
  std::string quoted() const { return "'" + s_ + "'"; }

 private:
  const std::string& s_;
  const std::string& file_;
  std::size_t i_ = 0;
};

}  // namespace

Result<NpyHeader> parse_npy_dict(const std::string& text, const std::string& file) {
  std::string trimmed = text;
  while (!trimmed.empty() && (trimmed.back() == '\n' || trimmed.back() == ' ' || trimmed.back() == '\0' ||
                              trimmed.back() == '\r' || trimmed.back() == '\t'))
    trimmed.pop_back();
  DictParser p(trimmed, file);
  if (!p.eat('{')) return p.fail("", "expected a dict literal starting with '{'");
  NpyHeader h;
  bool have_descr = false, have_fortran = false, have_shape = false;
  for (;;) {
    if (p.eat('}')) break;
    SEGFLOW_ASSIGN_OR_RETURN(std::string key, p.string("key"));
    if (!p.eat(':')) return p.fail(key, "expected ':' after the key");
    if (key == "descr") {
      if (p.peek('['))
        return unsupported(file + ": header.descr: structured dtypes are not supported, got " + p.quoted());
      SEGFLOW_ASSIGN_OR_RETURN(h.descr, p.string(key));
      have_descr = true;
    } else if (key == "fortran_order") {
      SEGFLOW_ASSIGN_OR_RETURN(h.fortran_order, p.boolean(key));
      have_fortran = true;
    } else if (key == "shape") {
      SEGFLOW_ASSIGN_OR_RETURN(h.shape, p.tuple(key));
      have_shape = true;
    } else {
      return p.fail(key, "unexpected key (expected descr, fortran_order, shape)");
    }
    if (p.eat(',')) continue;
    if (p.eat('}')) break;
    return p.fail(key, "expected ',' or '}'");
  }
  if (!p.at_end()) return p.fail("", "unexpected text after the dict");
  if (!have_descr) return p.fail("descr", "missing key");
  if (!have_fortran) return p.fail("fortran_order", "missing key");
  if (!have_shape) return p.fail("shape", "missing key");
  return h;
}

Result<NpyType> parse_npy_descr(const std::string& d, const std::string& file) {
  auto bad = [&]() {
    return unsupported(file + ": header.descr: dtype '" + d +
                       "' is not supported; expected bool, (u)int8..64 or float16/32/64, e.g. '<f4'");
  };
  if (d.size() < 3) return bad();
  const char order = d[0], kind = d[1];
  if (order != '<' && order != '>' && order != '|' && order != '=') return bad();
  int size = 0;
  for (std::size_t i = 2; i < d.size(); ++i) {
    if (!std::isdigit(static_cast<unsigned char>(d[i])) || size > 100) return bad();
    size = size * 10 + (d[i] - '0');
  }
  NpyType t;
  t.size = size;
  t.big_endian = order == '>';
  switch (kind) {
    case 'b':
      if (size != 1) return bad();
      t.kind = NpyKind::boolean;
      break;
    case 'i':
      if (size != 1 && size != 2 && size != 4 && size != 8) return bad();
      t.kind = NpyKind::signed_int;
      break;
    case 'u':
      if (size != 1 && size != 2 && size != 4 && size != 8) return bad();
      t.kind = NpyKind::unsigned_int;
      break;
    case 'f':
      if (size != 2 && size != 4 && size != 8) return bad();
      t.kind = NpyKind::floating;
      break;
    default:
      return bad();
  }
  if (order == '|' && size != 1) return bad();
  return t;
}

std::string npy_shape_text(const std::vector<std::int64_t>& shape) {
  std::string s = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  if (shape.size() == 1) s += ",";
  return s + ")";
}

std::string make_npy_header(const std::string& descr, const std::vector<std::int64_t>& shape) {
  std::string dict =
      "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + npy_shape_text(shape) + ", }";
  std::size_t prefix = 10;
  std::size_t total = prefix + dict.size() + 1;
  if (total - prefix > 65535) {
    prefix = 12;
    total = prefix + dict.size() + 1;
  }
  const std::size_t padded = (total + 63) / 64 * 64;
  dict.append(padded - total, ' ');
  dict += '\n';
  const std::size_t len = dict.size();
  std::string out("\x93NUMPY", 6);
  out += static_cast<char>(prefix == 10 ? 1 : 2);
  out += '\0';
  for (std::size_t i = 0; i < prefix - 8; ++i) out += static_cast<char>((len >> (8 * i)) & 0xff);
  return out + dict;
}

}  // namespace segflow::pipeline::detail

#pragma once
// The one option reader of segflow: stage options, every section of a job config (model,
// loss, optimizer, schedule, data.synth, train, validation, ...), the daemon config and the
// control requests. One `bind(OptionParser&)` per options struct reads every field (or keeps
// its in-place default), checks type and range, records the resolved value (defaults filled
// in) and describes the field (type, default, range, unit, doc) for `segflow stages`. Errors
// name the place in the config, what was expected and what was got:
//   "configs/job.yaml: stages[2].options.spacing: expected 3 positive numbers, got [1.5, 0]"
//   "configs/job.yaml: optimizer.lrr: unknown option; expected name, lr, momentum, ..."
// A key given as null (YAML `key:` or `~`) counts as not given: the field keeps its default.
//
// Header-only on purpose: plugins use it without linking segflow's static libraries.

#include <nlohmann/json.hpp>

#include <array>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "messages/status.hpp"

namespace segflow::pipeline {

/// A JSON value as error messages show it: `[1.5, 0]`, `"cubic"`, `{a: 1}`.
inline std::string format_value(const nlohmann::json& j) {
  if (j.is_array()) {
    std::string s = "[";
    for (std::size_t i = 0; i < j.size(); ++i) s += (i ? ", " : "") + format_value(j[i]);
    return s + "]";
  }
  if (j.is_object()) {
    std::string s = "{";
    bool first = true;
    for (auto it = j.begin(); it != j.end(); ++it) {
      s += (first ? "" : ", ") + it.key() + ": " + format_value(it.value());
      first = false;
    }
    return s + "}";
  }
  // Replace bytes that are not UTF-8 (a config file may hold any; found by fuzzing).
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

/// Joins strings with ", ".
inline std::string join(const std::vector<std::string>& items, const char* sep = ", ") {
  std::string s;
  for (std::size_t i = 0; i < items.size(); ++i) s += (i ? sep : "") + items[i];
  return s;
}

/// A closed or open numeric interval an option must lie in.
struct Range {
  double lo = -std::numeric_limits<double>::infinity();
  double hi = std::numeric_limits<double>::infinity();
  bool lo_open = false;
  bool hi_open = false;

  static Range any() { return {}; }
  /// > 0
  static Range positive() { return {0.0, std::numeric_limits<double>::infinity(), true, false}; }
  /// >= 0
  static Range non_negative() { return {0.0, std::numeric_limits<double>::infinity(), false, false}; }
  /// [lo, hi]
  static Range closed(double lo, double hi) { return {lo, hi, false, false}; }
  /// >= lo
  static Range at_least(double lo) { return {lo, std::numeric_limits<double>::infinity(), false, false}; }

  bool contains(double v) const {
    if (std::isnan(v)) return false;
    if (lo_open ? !(v > lo) : !(v >= lo)) return false;
    if (hi_open ? !(v < hi) : !(v <= hi)) return false;
    return true;
  }
  bool unbounded() const { return std::isinf(lo) && std::isinf(hi); }

  /// "> 0", ">= 0", "[0, 1]", "" (unbounded).
  std::string text() const {
    auto num = [](double v) {
      return format_value(nlohmann::json(v == std::floor(v) && std::abs(v) < 1e15
                                             ? nlohmann::json(static_cast<std::int64_t>(v))
                                             : nlohmann::json(v)));
    };
    if (unbounded()) return "";
    if (std::isinf(hi)) return std::string(lo_open ? "> " : ">= ") + num(lo);
    if (std::isinf(lo)) return std::string(hi_open ? "< " : "<= ") + num(hi);
    return std::string(lo_open ? "(" : "[") + num(lo) + ", " + num(hi) + (hi_open ? ")" : "]");
  }

  /// "positive number", "non-negative integers", "number in [0, 1]", ...
  std::string noun(bool integer, bool plural) const {
    std::string base = integer ? (plural ? "integers" : "integer") : (plural ? "numbers" : "number");
    if (unbounded()) return base;
    if (std::isinf(hi) && lo == 0.0) return std::string(lo_open ? "positive " : "non-negative ") + base;
    if (std::isinf(hi) || std::isinf(lo)) return base + " " + text();
    return base + " in " + text();
  }
};

/// "a positive number" / "an integer in [1, 3]".
inline std::string with_article(const std::string& noun) {
  const char c = noun.empty() ? 'x' : noun[0];
  const bool vowel = c == 'a' || c == 'e' || c == 'i' || c == 'o' || c == 'u';
  return (vowel ? "an " : "a ") + noun;
}

/// What `segflow stages` prints about one option.
struct OptionInfo {
  std::string name;              ///< key in the config
  std::string type;              ///< "number", "3 numbers", "list of strings", ...
  nlohmann::json default_value;  ///< the in-place default
  std::string range;             ///< "> 0", "[0, 1]", "one of: trilinear, nearest"; may be empty
  std::string unit;              ///< "mm", "voxels", "radians", ...; may be empty
  std::string doc;               ///< one line
};

inline nlohmann::json to_json(const OptionInfo& o) {
  return {{"name", o.name},   {"type", o.type}, {"default", o.default_value},
          {"range", o.range}, {"unit", o.unit}, {"doc", o.doc}};
}

/// Reads the options of one struct from a JSON object. Each reader call takes the key, the
/// field (holding its default), constraints and a doc line: it records the description,
/// overwrites the field when the key is present and valid, and otherwise records the first
/// error. `finish()` adds the unknown-key check and returns the first error.
///
/// `where` is the place of the options object, e.g. "configs/job.yaml: stages[2].options";
/// errors read "<where>.<key>: expected ..., got ...". A `where` ending in ": " is the top
/// of a file ("configs/job.yaml: "): errors read "configs/job.yaml: <key>: ...".
/// Not thread-safe; one parser per object read.
class OptionParser {
 public:
  /// `stage`: the stage whose options these are (named in unknown-option errors).
  OptionParser(const nlohmann::json& options, std::string where, std::string stage = {})
      : where_(std::move(where)), owner_(stage.empty() ? std::string() : "stage '" + stage + "'") {
    if (options.is_null()) {
      options_ = nlohmann::json::object();
    } else if (!options.is_object()) {
      options_ = nlohmann::json::object();
      set_error(label() + (label().empty() ? "" : ": ") + "expected a map of options, got " +
                format_value(options));
    } else {
      options_ = options;
    }
  }

  /// How unknown-key errors call the keys: `noun` "option" (the default), "key" (sections of
  /// a config file) or "field" (control requests); `owner` whose they are ("status" gives
  /// "bogus: unknown field for status; expected job").
  OptionParser& name_keys(std::string noun, std::string owner = {}) {
    noun_ = std::move(noun);
    owner_ = std::move(owner);
    return *this;
  }

  /// A real number.
  void number(const char* key, double& field, Range range, const char* unit, const char* doc) {
    add_info(key, "number", field, range.text(), unit, doc);
    const nlohmann::json* v = find(key);
    if (!v) return resolve(key, field);
    if (!v->is_number() || !range.contains(v->get<double>()))
      return fail_expected(key, with_article(range.noun(false, false)), *v);
    field = v->get<double>();
    resolve(key, field);
  }

  /// An integer (a float with an integral value is accepted: YAML may write 2.0).
  template <class Int>
  void integer(const char* key, Int& field, Range range, const char* unit, const char* doc) {
    add_info(key, "integer", field, range.text(), unit, doc);
    const nlohmann::json* v = find(key);
    if (!v) return resolve(key, field);
    std::int64_t i = 0;
    if (!as_integer(*v, i) || !range.contains(static_cast<double>(i)))
      return fail_expected(key, with_article(range.noun(true, false)), *v);
    field = static_cast<Int>(i);
    resolve(key, field);
  }

  /// "auto" or an integer in `range`: "auto" is stored as `auto_value` (outside the range) and
  /// resolved as "auto", so a config written back reads as it was meant.
  template <class Int>
  void integer_or_auto(const char* key, Int& field, Int auto_value, Range range, const char* unit,
                       const char* doc) {
    auto as_json = [&] { return field == auto_value ? nlohmann::json("auto") : nlohmann::json(field); };
    add_info(key, "integer or auto", as_json(), range.text(), unit, doc);
    const nlohmann::json* v = find(key);
    if (!v) return resolve(key, as_json());
    std::int64_t i = 0;
    if (v->is_string() && v->get<std::string>() == "auto") {
      field = auto_value;
    } else if (as_integer(*v, i) && range.contains(static_cast<double>(i))) {
      field = static_cast<Int>(i);
    } else {
      return fail_expected(key, "auto or " + with_article(range.noun(true, false)), *v);
    }
    resolve(key, as_json());
  }

  /// true or false.
  void boolean(const char* key, bool& field, const char* doc) {
    add_info(key, "boolean", field, "", "", doc);
    const nlohmann::json* v = find(key);
    if (!v) return resolve(key, field);
    if (!v->is_boolean()) return fail_expected(key, "true or false", *v);
    field = v->get<bool>();
    resolve(key, field);
  }

  /// Any string.
  void string(const char* key, std::string& field, const char* doc) {
    add_info(key, "string", field, "", "", doc);
    const nlohmann::json* v = find(key);
    if (!v) return resolve(key, field);
    if (!v->is_string()) return fail_expected(key, "a string", *v);
    field = v->get<std::string>();
    resolve(key, field);
  }

  /// Any JSON value, checked by the caller (a map, a mixed list): `type` is what `segflow
  /// stages` shows ("map of integers"). Null or absent keeps the default.
  void json_value(const char* key, nlohmann::json& field, const char* type, const char* doc) {
    add_info(key, type, field, "", "", doc);
    const nlohmann::json* v = find(key);
    if (v && !v->is_null()) field = *v;
    resolve(key, field);
  }

  /// One string of a fixed set.
  void choice(const char* key, std::string& field, std::initializer_list<const char*> choices,
              const char* doc) {
    choice(key, field, std::vector<std::string>(choices.begin(), choices.end()), doc);
  }
  /// The same with the set computed at run time (registries, presets).
  void choice(const char* key, std::string& field, const std::vector<std::string>& names, const char* doc) {
    add_info(key, "string", field, "one of: " + join(names), "", doc);
    const nlohmann::json* v = find(key);
    if (!v) return resolve(key, field);
    bool ok = v->is_string();
    if (ok) {
      ok = false;
      for (const auto& n : names) ok = ok || v->get<std::string>() == n;
    }
    if (!ok) return fail_expected(key, "one of " + join(names), *v);
    field = v->get<std::string>();
    resolve(key, field);
  }

  /// A list of strings (a single string is taken as a list of one). `non_empty`: at least one.
  void strings(const char* key, std::vector<std::string>& field, bool non_empty, const char* doc) {
    add_info(key, "list of strings", field, non_empty ? "non-empty" : "", "", doc);
    const nlohmann::json* v = find(key);
    if (!v) return resolve(key, field);
    std::vector<std::string> out;
    bool ok = true;
    if (v->is_string()) {
      out.push_back(v->get<std::string>());
    } else if (v->is_array()) {
      for (const auto& e : *v) {
        if (!e.is_string() || e.get<std::string>().empty())
          ok = false;
        else
          out.push_back(e.get<std::string>());
      }
    } else {
      ok = false;
    }
    if (!ok || (non_empty && out.empty()))
      return fail_expected(key, non_empty ? "a non-empty list of names" : "a list of names", *v);
    field = std::move(out);
    resolve(key, field);
  }

  /// N numbers; with `broadcast` a single number stands for N equal ones.
  template <std::size_t N>
  void numbers(const char* key, std::array<double, N>& field, Range range, bool broadcast, const char* unit,
               const char* doc) {
    list_impl<double, N>(key, field, range, broadcast, false, unit, doc);
  }

  /// N integers; with `broadcast` a single integer stands for N equal ones.
  template <std::size_t N>
  void integers(const char* key, std::array<std::int64_t, N>& field, Range range, bool broadcast,
                const char* unit, const char* doc) {
    list_impl<std::int64_t, N>(key, field, range, broadcast, true, unit, doc);
  }

  /// A list of integers of any length (each in `range`, no duplicates when `unique`).
  void integer_list(const char* key, std::vector<std::int64_t>& field, Range range, bool unique,
                    const char* doc) {
    add_info(key, "list of integers", field, range.text(), "", doc);
    const nlohmann::json* v = find(key);
    if (!v) return resolve(key, field);
    std::vector<std::int64_t> out;
    bool ok = v->is_array();
    if (ok)
      for (const auto& e : *v) {
        std::int64_t i = 0;
        if (!as_integer(e, i) || !range.contains(static_cast<double>(i)))
          ok = false;
        else
          out.push_back(i);
      }
    if (ok && unique && std::set<std::int64_t>(out.begin(), out.end()).size() != out.size()) ok = false;
    if (!ok)
      return fail_expected(
          key, std::string("a list of ") + (unique ? "distinct " : "") + range.noun(true, true), *v);
    field = std::move(out);
    resolve(key, field);
  }

  /// A real number or null (unset): `field` stays unset unless a number is given.
  void number(const char* key, std::optional<double>& field, Range range, const char* unit, const char* doc) {
    auto as_json = [&] { return field ? nlohmann::json(*field) : nlohmann::json(nullptr); };
    add_info(key, "number or null", as_json(), range.text(), unit, doc);
    const nlohmann::json* v = find(key);
    if (v) {
      if (!v->is_number() || !range.contains(v->get<double>()))
        return fail_expected(key, with_article(range.noun(false, false)) + " or null", *v);
      field = v->get<double>();
    }
    resolve(key, as_json());
  }

  /// A list of real numbers of any length, each in `range`.
  void number_list(const char* key, std::vector<double>& field, Range range, const char* unit,
                   const char* doc) {
    add_info(key, "list of numbers", field, range.text(), unit, doc);
    const nlohmann::json* v = find(key);
    if (!v) return resolve(key, field);
    std::vector<double> out;
    bool ok = v->is_array();
    if (ok)
      for (const auto& e : *v) {
        if (!e.is_number() || !range.contains(e.get<double>()))
          ok = false;
        else
          out.push_back(e.get<double>());
      }
    if (!ok) return fail_expected(key, "a list of " + range.noun(false, true), *v);
    field = std::move(out);
    resolve(key, field);
  }

  /// One number or a non-empty list of numbers, each in `range` (per-channel values: one
  /// number stands for every channel). Described and resolved as a number when `field`
  /// holds one value, else as the list.
  void number_or_list(const char* key, std::vector<double>& field, Range range, const char* unit,
                      const char* doc) {
    auto as_json = [&] { return field.size() == 1 ? nlohmann::json(field[0]) : nlohmann::json(field); };
    add_info(key, "number or list of numbers", as_json(), range.text(), unit, doc);
    const nlohmann::json* v = find(key);
    if (!v) return resolve(key, as_json());
    std::vector<double> out;
    bool ok = v->is_number() || (v->is_array() && !v->empty());
    for (const auto& e : v->is_array() ? *v : nlohmann::json::array({*v})) {
      if (!e.is_number() || !range.contains(e.get<double>())) {
        ok = false;
        break;
      }
      out.push_back(e.get<double>());
    }
    if (!ok)
      return fail_expected(
          key, with_article(range.noun(false, false)) + " or a non-empty list of " + range.noun(false, true),
          *v);
    field = std::move(out);
    resolve(key, as_json());
  }

  /// A list of strings, strictly (a single string is an error, unlike strings()); a bad
  /// element is named: "<where>.set[1]: expected a string, got 3". `non_empty`: at least one.
  void string_list(const char* key, std::vector<std::string>& field, bool non_empty, const char* doc) {
    add_info(key, "list of strings", field, non_empty ? "non-empty" : "", "", doc);
    const nlohmann::json* v = find(key);
    if (!v) return resolve(key, field);
    if (!v->is_array() || (non_empty && v->empty()))
      return fail_expected(key, non_empty ? "a non-empty list of strings" : "a list of strings", *v);
    std::vector<std::string> out;
    for (std::size_t i = 0; i < v->size(); ++i) {
      if (!(*v)[i].is_string())
        return set_error(path(std::string(key) + "[" + std::to_string(i) + "]") +
                         ": expected a string, got " + format_value((*v)[i]));
      out.push_back((*v)[i].get<std::string>());
    }
    field = std::move(out);
    resolve(key, field);
  }

  /// A nested mapping (a section such as `train` or `data.synth`): returns it for a parser
  /// of its own at path_of(key) (an empty object when absent or null; an error for anything
  /// but a mapping). Its resolved value is the nested parser's: pass it to set_resolved.
  nlohmann::json mapping(const char* key, const char* doc) {
    add_info(key, "mapping", nlohmann::json::object(), "", "", doc);
    const nlohmann::json* v = find(key);
    if (!v) return nlohmann::json::object();
    if (!v->is_object()) {
      fail_expected(key, "a mapping", *v);
      return nlohmann::json::object();
    }
    return *v;
  }

  /// The value given for `key` (nullptr when absent or null); does not mark it as read.
  /// For rules that depend on what was written (a preset overridden field by field).
  const nlohmann::json* given(const std::string& key) const {
    auto it = options_.find(key);
    return it == options_.end() || it->is_null() ? nullptr : &*it;
  }

  /// Overrides the resolved value of `key` (when a cross-field rule changed the field, or
  /// for a nested section).
  void set_resolved(const std::string& key, nlohmann::json value) { resolved_[key] = std::move(value); }

  /// Records a cross-field error on `key`: "<where>.<key>: <message>".
  void fail(const std::string& key, const std::string& message) { set_error(path(key) + ": " + message); }

  /// Records the error of a struct's own validate(), whose messages read "<prefix>: <field>:
  /// <text>" ("unet: strides: expected 3 entries ..."), as "<where>.<field>: <text>".
  void check(const Status& status, const std::string& prefix) {
    if (status.is_ok()) return;
    std::string m = status.message();
    if (!prefix.empty() && m.rfind(prefix + ": ", 0) == 0) m = m.substr(prefix.size() + 2);
    const auto colon = m.find(": ");
    if (colon == std::string::npos || m.find(' ') < colon)
      set_error(label() + (label().empty() ? "" : ": ") + m);
    else
      fail(m.substr(0, colon), m.substr(colon + 2));
  }

  /// A nested section read by `section.bind(OptionParser&)` (e.g. `train`, `data.synth`):
  /// absent or null keeps `section` as it is; its errors and resolved value become this
  /// parser's. `noun` names its keys in unknown-key errors ("option" or "key").
  template <class Section>
  void section(const char* key, Section& section, const char* doc, const char* noun = "option") {
    nlohmann::json v = mapping(key, doc);
    if (!ok()) return;
    OptionParser nested(v, path(key));
    nested.name_keys(noun);
    section.bind(nested);
    add_error(nested.finish());
    set_resolved(key, nested.resolved());
  }

  /// Records an error found elsewhere (a nested section's parser) as it is.
  void add_error(const Status& status) {
    if (!status.is_ok()) set_error(status.message());
  }

  /// The first error so far (invalid_config), without the unknown-key check of finish().
  Status status() const { return error_.empty() ? Status::ok() : Status(ErrorCode::invalid_config, error_); }

  /// "<where>.<key>" (or "<file>: <key>" at the top of a file): the `where` of a nested parser.
  std::string path_of(const std::string& key) const { return path(key); }

  /// True when no error so far.
  bool ok() const { return error_.empty(); }

  /// The first error, or an unknown-key error; ok() when the options are valid.
  Status finish() {
    if (error_.empty()) {
      for (auto it = options_.begin(); it != options_.end(); ++it) {
        if (seen_.count(it.key())) continue;
        std::vector<std::string> known;
        for (const auto& i : infos_) known.push_back(i.name);
        set_error(path(it.key()) + ": unknown " + noun_ +
                  (owner_.empty() ? std::string() : " for " + owner_) +
                  (known.empty() ? std::string("; it takes none") : "; expected " + join(known)));
        break;
      }
    }
    return error_.empty() ? Status::ok() : Status(ErrorCode::invalid_config, error_);
  }

  /// Descriptions of every option read so far, in reading order.
  const std::vector<OptionInfo>& infos() const { return infos_; }
  /// Every option's value after parsing (defaults included).
  const nlohmann::json& resolved() const { return resolved_; }

 private:
  static bool as_integer(const nlohmann::json& v, std::int64_t& out) {
    if (v.is_number_integer()) {
      out = v.get<std::int64_t>();
      return true;
    }
    if (v.is_number_float()) {
      const double d = v.get<double>();
      if (d != std::floor(d) || std::abs(d) > 9e15) return false;
      out = static_cast<std::int64_t>(d);
      return true;
    }
    return false;
  }

  template <class T, std::size_t N>
  void list_impl(const char* key, std::array<T, N>& field, Range range, bool broadcast, bool integer,
                 const char* unit, const char* doc) {
    const std::string plural = std::to_string(N) + " " + range.noun(integer, true);
    const std::string type = std::string(broadcast ? (integer ? "integer or " : "number or ") : "") +
                             std::to_string(N) + (integer ? " integers" : " numbers");
    add_info(key, type, field, range.text(), unit, doc);
    const nlohmann::json* v = find(key);
    if (!v) return resolve(key, field);
    const std::string expected =
        broadcast ? with_article(range.noun(integer, false)) + " or " + plural : plural;
    auto read_one = [&](const nlohmann::json& e, T& out) {
      if (integer) {
        std::int64_t i = 0;
        if (!as_integer(e, i) || !range.contains(static_cast<double>(i))) return false;
        out = static_cast<T>(i);
      } else {
        if (!e.is_number() || !range.contains(e.get<double>())) return false;
        out = static_cast<T>(e.get<double>());
      }
      return true;
    };
    std::array<T, N> out{};
    if (v->is_array()) {
      if (v->size() != N) return fail_expected(key, expected, *v);
      for (std::size_t i = 0; i < N; ++i)
        if (!read_one((*v)[i], out[i])) return fail_expected(key, expected, *v);
    } else if (broadcast && v->is_number()) {
      T one{};
      if (!read_one(*v, one)) return fail_expected(key, expected, *v);
      out.fill(one);
    } else {
      return fail_expected(key, expected, *v);
    }
    field = out;
    resolve(key, field);
  }

  const nlohmann::json* find(const char* key) {
    seen_.insert(key);
    return given(key);
  }
  template <class T>
  void resolve(const char* key, const T& value) {
    resolved_[key] = value;
  }
  template <class T>
  void add_info(const char* key, std::string type, const T& def, std::string range, const char* unit,
                const char* doc) {
    infos_.push_back(
        {key, std::move(type), nlohmann::json(def), std::move(range), unit ? unit : "", doc ? doc : ""});
  }
  static bool ends_file(const std::string& w) {
    return w.size() >= 2 && w.compare(w.size() - 2, 2, ": ") == 0;
  }
  std::string path(const std::string& key) const {
    if (where_.empty()) return key;
    return ends_file(where_) ? where_ + key : where_ + "." + key;
  }
  /// `where` without the ": " of a file top.
  std::string label() const { return ends_file(where_) ? where_.substr(0, where_.size() - 2) : where_; }
  void fail_expected(const char* key, const std::string& expected, const nlohmann::json& got) {
    set_error(path(key) + ": expected " + expected + ", got " + format_value(got));
  }
  void set_error(std::string e) {
    if (error_.empty()) error_ = std::move(e);
  }

  nlohmann::json options_;
  std::string where_;
  std::string owner_;
  std::string noun_ = "option";
  std::set<std::string> seen_;
  std::vector<OptionInfo> infos_;
  nlohmann::json resolved_ = nlohmann::json::object();
  std::string error_;
};

/// Every option of `options` (a struct with `void bind(OptionParser&)`) as JSON, defaults
/// included: what a parser resolves it to when nothing overrides a field.
template <class Options>
nlohmann::json resolved_options(Options options) {
  OptionParser p(nlohmann::json::object(), "");
  options.bind(p);
  return p.resolved();
}

/// Reads an Options struct (in-place defaults, `void bind(OptionParser&)`) from `json`;
/// errors name `where` ("configs/job.yaml: data.synth.cases: expected ...").
template <class Options>
Result<Options> parse_options(const nlohmann::json& json, const std::string& where) {
  Options options;
  OptionParser p(json, where);
  options.bind(p);
  SEGFLOW_RETURN_IF_ERROR(p.finish());
  return options;
}

}  // namespace segflow::pipeline

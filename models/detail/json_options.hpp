#pragma once
// Reading option structs from JSON objects, one key at a time, with errors that name the
// field, the expectation and the value: "unet: channels: expected a list of positive
// integers, got [16, -2]". Unknown keys are errors listing the known ones.

#include <nlohmann/json.hpp>

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "messages/status.hpp"

namespace segflow::models::detail {

class OptionReader {
 public:
  /// `where` prefixes every message ("unet"); `known` are the accepted keys.
  OptionReader(const nlohmann::json& j, std::string where, std::vector<std::string> known)
      : j_(j), where_(std::move(where)), known_(std::move(known)) {}

  /// invalid_argument for a non-object or for any key not in `known`.
  Status check_keys() const {
    if (j_.is_null()) return Status::ok();
    if (!j_.is_object())
      return invalid_argument(where_ + ": expected an object of options, got " + j_.dump());
    for (const auto& [k, v] : j_.items()) {
      bool ok = false;
      for (const auto& n : known_) ok = ok || n == k;
      if (!ok)
        return invalid_argument(where_ + ": unknown option '" + k + "'; known options: " + known_list());
    }
    return Status::ok();
  }

  bool has(const std::string& key) const { return j_.is_object() && j_.contains(key); }

  Status get(const std::string& key, int64_t& out) const {
    if (!has(key)) return Status::ok();
    const auto& v = j_[key];
    if (!v.is_number_integer()) return bad(key, "an integer", v);
    out = v.get<int64_t>();
    return Status::ok();
  }
  Status get(const std::string& key, int& out) const {
    int64_t v = out;
    SEGFLOW_RETURN_IF_ERROR(get(key, v));
    out = static_cast<int>(v);
    return Status::ok();
  }
  Status get(const std::string& key, double& out) const {
    if (!has(key)) return Status::ok();
    const auto& v = j_[key];
    if (!v.is_number()) return bad(key, "a number", v);
    out = v.get<double>();
    return Status::ok();
  }
  Status get(const std::string& key, bool& out) const {
    if (!has(key)) return Status::ok();
    const auto& v = j_[key];
    if (!v.is_boolean()) return bad(key, "true or false", v);
    out = v.get<bool>();
    return Status::ok();
  }
  Status get(const std::string& key, std::string& out) const {
    if (!has(key)) return Status::ok();
    const auto& v = j_[key];
    if (!v.is_string()) return bad(key, "a string", v);
    out = v.get<std::string>();
    return Status::ok();
  }
  Status get(const std::string& key, std::vector<int64_t>& out) const {
    if (!has(key)) return Status::ok();
    const auto& v = j_[key];
    if (!v.is_array()) return bad(key, "a list of integers", v);
    std::vector<int64_t> r;
    for (const auto& e : v) {
      if (!e.is_number_integer()) return bad(key, "a list of integers", v);
      r.push_back(e.get<int64_t>());
    }
    out = std::move(r);
    return Status::ok();
  }
  Status get(const std::string& key, std::vector<double>& out) const {
    if (!has(key)) return Status::ok();
    const auto& v = j_[key];
    if (!v.is_array()) return bad(key, "a list of numbers", v);
    std::vector<double> r;
    for (const auto& e : v) {
      if (!e.is_number()) return bad(key, "a list of numbers", v);
      r.push_back(e.get<double>());
    }
    out = std::move(r);
    return Status::ok();
  }
  Status get(const std::string& key, std::optional<double>& out) const {
    if (!has(key) || j_[key].is_null()) return Status::ok();
    double d = 0;
    SEGFLOW_RETURN_IF_ERROR(get(key, d));
    out = d;
    return Status::ok();
  }

  /// invalid_argument "<where>: <key>: expected <expected>, got <value>".
  Status bad(const std::string& key, const std::string& expected, const nlohmann::json& got) const {
    return invalid_argument(where_ + ": " + key + ": expected " + expected + ", got " + got.dump());
  }
  const std::string& where() const { return where_; }
  std::string known_list() const {
    std::string s;
    for (size_t i = 0; i < known_.size(); ++i) s += (i ? ", " : "") + known_[i];
    return s;
  }

 private:
  const nlohmann::json& j_;
  std::string where_;
  std::vector<std::string> known_;
};

}  // namespace segflow::models::detail

#include "apps/infer_args.hpp"

#include <algorithm>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace segflow::apps {

namespace {

/// Storage for the generated flag names and option lists (Option holds views).
struct FlagTables {
  std::deque<std::string> names;
  std::map<std::string, std::vector<Option>> groups;
};

FlagTables& tables() {
  static FlagTables t;
  return t;
}

/// The error of a value that is not of its field's kind.
Status bad_value(const models::InferField& f, const std::string& expected, const std::string& got) {
  return invalid_argument("--" + models::flag_name(f.key) + ": expected " + expected + ", got '" + got + "'");
}

}  // namespace

std::span<const Option> infer_flags(std::string_view group,
                                    std::initializer_list<std::string_view> leave_out) {
  std::string key(group);
  for (std::string_view l : leave_out) key += "\x1f" + std::string(l);
  FlagTables& t = tables();
  auto it = t.groups.find(key);
  if (it != t.groups.end()) return it->second;
  std::vector<Option> options;
  for (const models::InferField& f : models::infer_fields()) {
    if (f.group != group || std::find(leave_out.begin(), leave_out.end(), f.key) != leave_out.end()) continue;
    t.names.push_back(models::flag_name(f.key));
    options.push_back({t.names.back(), f.value, f.help});
  }
  return t.groups.emplace(key, std::move(options)).first->second;
}

Result<nlohmann::json> infer_fields_from_args(const Args& a, bool absolute) {
  using K = models::InferFieldKind;
  auto path = [absolute](const std::string& p) {
    return absolute && !p.empty() && p != "none" ? std::filesystem::absolute(p).lexically_normal().string()
                                                 : p;
  };
  nlohmann::json j = nlohmann::json::object();
  for (const models::InferField& f : models::infer_fields()) {
    const std::string flag = models::flag_name(f.key), key(f.key);
    if (!a.given(flag)) continue;
    const std::string v = a.get(flag);
    switch (f.kind) {
      case K::text:
        j[key] = v;
        break;
      case K::path:
        j[key] = path(v);
        break;
      case K::paths: {
        nlohmann::json list = nlohmann::json::array();
        for (const auto& p : a.all(flag)) list.push_back(path(p));
        j[key] = list;
        break;
      }
      case K::names:
        j[key] = split_text(v, ',');
        break;
      case K::number: {
        char* end = nullptr;
        const double x = std::strtod(v.c_str(), &end);
        if (v.empty() || *end != '\0')
          return bad_value(f, f.key == "overlap" ? "a number in [0, 1)" : "a number", v);
        j[key] = x;
        break;
      }
      case K::on_off:
        if (v != "on" && v != "off") return bad_value(f, "on or off", v);
        j[key] = v == "on";
        break;
      case K::flag:
        j[key] = true;
        break;
    }
  }
  return j;
}

Result<models::InferRequest> infer_request_from_args(const Args& a) {
  SEGFLOW_ASSIGN_OR_RETURN(nlohmann::json fields, infer_fields_from_args(a, false));
  auto r = models::read_infer_request(fields, "");
  if (r.is_ok()) return r;
  // The binding names the field ("overlap: expected ..., got 1"): name the flag, and quote the
  // value as it was typed.
  const std::string m = r.status().message();
  for (const models::InferField& f : models::infer_fields()) {
    const std::string key(f.key), flag = models::flag_name(f.key);
    if (m.rfind(key + ": ", 0) != 0) continue;
    std::string rest = m.substr(key.size() + 2);
    const auto got = rest.rfind(", got ");
    if (rest.rfind("expected ", 0) == 0 && got != std::string::npos && a.has(flag))
      rest = rest.substr(0, got) + ", got '" + a.get(flag) + "'";
    return invalid_argument("--" + flag + ": " + rest);
  }
  return invalid_argument(m);
}

nlohmann::json infer_result_json(const models::InferResult& r) {
  nlohmann::json j = {{"case", r.case_id},
                      {"output", r.output.string()},
                      {"size", r.size},
                      {"labels", r.labels},
                      {"seconds", r.seconds}};
  if (!r.probabilities.empty()) j["probabilities"] = r.probabilities.string();
  if (!r.also_written.empty()) {
    j["also_output"] = nlohmann::json::array();
    for (const auto& f : r.also_written) j["also_output"].push_back(f.string());
  }
  nlohmann::json axes = nlohmann::json::array();
  for (int a : r.tta_axes) axes.push_back(std::string(1, "xyz"[a]));
  j["tta_axes"] = axes;
  return j;
}

}  // namespace segflow::apps

#include "apps/cli_args.hpp"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace segflow::apps {

Result<Args> parse_args(int argc, char** argv, int first, const std::set<std::string>& with_value,
                        const std::set<std::string>& bool_flags) {
  Args a;
  for (int i = first; i < argc; ++i) {
    std::string s = argv[i];
    if (s.size() > 2 && s.rfind("--", 0) == 0) {
      std::string key = s.substr(2), val;
      bool inline_val = false;
      if (auto eq = key.find('='); eq != std::string::npos) {
        val = key.substr(eq + 1);
        key = key.substr(0, eq);
        inline_val = true;
      }
      if (bool_flags.count(key)) {
        if (inline_val) return invalid_argument("--" + key + ": takes no value");
        a.flags.insert(key);
      } else if (with_value.count(key)) {
        if (!inline_val) {
          if (i + 1 >= argc) return invalid_argument("--" + key + ": expected a value");
          val = argv[++i];
        }
        a.values[key].push_back(val);
      } else {
        std::string known;
        for (auto& k : with_value) known += " --" + k;
        for (auto& k : bool_flags) known += " --" + k;
        return invalid_argument("unknown option --" + key + " (known:" + known + ")");
      }
    } else {
      a.positional.push_back(s);
    }
  }
  return a;
}

Result<long long> parse_int(const std::string& option, const std::string& text) {
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || errno != 0 || end == nullptr || *end != '\0')
    return invalid_argument(option + ": expected an integer, got '" + text + "'");
  return v;
}

std::string clock_text(double s) {
  if (!std::isfinite(s) || s < 0) return "--:--";
  const long t = std::lround(s);
  char buf[32];
  if (t >= 3600)
    std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", t / 3600, (t / 60) % 60, t % 60);
  else
    std::snprintf(buf, sizeof buf, "%02ld:%02ld", t / 60, t % 60);
  return buf;
}

}  // namespace segflow::apps

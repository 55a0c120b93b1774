#pragma once
// Minimal command-line parsing for segflow's subcommands: positionals, `--key value`,
// `--key=value`, repeatable keys and boolean flags. Unknown options are errors. Also the
// clock the progress lines of train and infer print.

#include <map>
#include <set>
#include <string>
#include <vector>

#include "messages/status.hpp"

namespace segflow::apps {

/// Parsed arguments of one subcommand.
struct Args {
  std::vector<std::string> positional;
  std::map<std::string, std::vector<std::string>> values;  ///< key -> every value given
  std::set<std::string> flags;

  bool flag(const std::string& k) const { return flags.count(k) != 0; }
  bool has(const std::string& k) const { return values.count(k) != 0; }
  /// Last value of --k, or `def`.
  std::string get(const std::string& k, const std::string& def = "") const {
    auto it = values.find(k);
    return it == values.end() ? def : it->second.back();
  }
  std::vector<std::string> all(const std::string& k) const {
    auto it = values.find(k);
    return it == values.end() ? std::vector<std::string>{} : it->second;
  }
};

/// Parses argv[first..argc). `with_value` lists options that take a value, `bool_flags`
/// those that do not; anything else starting with "--" is an error naming it.
Result<Args> parse_args(int argc, char** argv, int first, const std::set<std::string>& with_value,
                        const std::set<std::string>& bool_flags);

/// Parses an integer option, naming it in the error ("--cases: expected an integer, got 'x'").
Result<long long> parse_int(const std::string& option, const std::string& text);

/// Seconds as a progress line's clock: "mm:ss", "h:mm:ss" from an hour on, "--:--" when not
/// known (negative or not finite).
std::string clock_text(double seconds);

}  // namespace segflow::apps

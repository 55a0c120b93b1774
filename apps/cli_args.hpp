#pragma once
// Command-line parsing and help for segflow's subcommands. A command is a table (`Command`):
// its forms, each with the options its parser accepts and what each one does. parse_args
// accepts exactly a form's options and help_text prints exactly them, so the help cannot
// drift from what is parsed. Positionals, `--key value`, `--key=value`, repeatable keys and
// boolean flags; unknown options are errors. Also the clock the progress lines of train and
// infer print.

#include <map>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "messages/status.hpp"

namespace segflow::apps {

/// One option of a command: `--name VALUE` and what it does.
struct Option {
  std::string_view name;   ///< without the leading "--"
  std::string_view value;  ///< placeholder of its value ("DIR", "none|mirror"); "": a flag without value
  std::string_view help;   ///< what it does, its default and range (one paragraph, wrapped when printed)
};

/// A positional argument of a command ("CONFIG", "RUN...") and what it is.
struct Operand {
  std::string_view name;
  std::string_view help;
};

/// Options printed under one heading.
struct OptionGroup {
  std::string_view title;  ///< "box prompts (a sam checkpoint)"; "" prints as "options"
  std::span<const Option> options;
};

/// One form of a command: the arguments that select it, its synopsis, and every option its
/// parser accepts (the union of its groups).
struct Form {
  std::string_view
      selector;              ///< what picks it after the command ("apply", "--to onnx"); "" for the only form
  std::string_view usage;    ///< the synopsis after "segflow " ('\n' starts another line)
  std::string_view summary;  ///< one line: what it does (`segflow --help` lists it)
  std::string_view about;  ///< more about it, printed under the summary ('\n' starts a paragraph); may be ""
  std::vector<Operand> operands;
  std::vector<OptionGroup> groups;
};

/// One `segflow` command: its name, what runs it and its forms.
struct Command {
  std::string_view name;
  int (*run)(int argc, char** argv);  ///< argv[1] is the command; returns the exit code
  std::vector<Form> forms;
  std::string (*more)() = nullptr;  ///< text printed after the forms (ctl: its daemon commands), or null
};

/// Parsed arguments of one subcommand.
struct Args {
  std::vector<std::string> positional;
  std::map<std::string, std::vector<std::string>> values;  ///< key -> every value given
  std::set<std::string> flags;

  bool flag(const std::string& k) const { return flags.count(k) != 0; }
  bool has(const std::string& k) const { return values.count(k) != 0; }
  /// Whether --k was given at all (a flag, or an option with a value).
  bool given(std::string_view k) const {
    const std::string key(k);
    return flag(key) || has(key);
  }
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

/// Parses argv[first..argc) with the options of `form`; anything else starting with "--" is
/// an error naming it and listing the known ones.
Result<Args> parse_args(int argc, char** argv, int first, const Form& form);

/// The same with the options given as two sets, for segflowd (whose usage text is its own).
Result<Args> parse_args(int argc, char** argv, int first, const std::set<std::string>& with_value,
                        const std::set<std::string>& bool_flags);

/// True when argv[first..argc) holds `--help` or `-h` where an argument may stand (not as the
/// value of an option of one of `c`'s forms).
bool asks_for_help(int argc, char** argv, int first, const Command& c);

/// `segflow NAME --help`: every form's synopsis, what it does, its arguments and every
/// option with its value and description.
std::string help_text(const Command& c);

/// `text` wrapped to `width` columns, every line after the first indented by `indent`
/// spaces; the first line starts at column `column` (so it holds width - column characters).
/// A '\n' in `text` starts a new line.
std::string wrap_text(std::string_view text, std::size_t indent, std::size_t column, std::size_t width = 100);

/// The pieces of `text` between `separator`s, empty ones included ("a,,b" -> a, "", b; "" ->
/// one empty piece).
std::vector<std::string> split_text(std::string_view text, char separator);

/// Parses an integer option, naming it in the error ("--cases: expected an integer, got 'x'").
Result<long long> parse_int(const std::string& option, const std::string& text);

/// Seconds as a progress line's clock: "mm:ss", "h:mm:ss" from an hour on, "--:--" when not
/// known (negative or not finite).
std::string clock_text(double seconds);

}  // namespace segflow::apps

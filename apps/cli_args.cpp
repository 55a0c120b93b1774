#include "apps/cli_args.hpp"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>

namespace segflow::apps {

namespace {

enum class OptionKind { unknown, flag, value };

/// The parser: `kind` says whether --name is known and takes a value; `known` lists the
/// known options for the error.
Result<Args> parse_with(int argc, char** argv, int first,
                        const std::function<OptionKind(std::string_view)>& kind,
                        const std::function<std::string()>& known) {
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
      const OptionKind k = kind(key);
      if (k == OptionKind::flag) {
        if (inline_val) return invalid_argument("--" + key + ": takes no value");
        a.flags.insert(key);
      } else if (k == OptionKind::value) {
        if (!inline_val) {
          if (i + 1 >= argc) return invalid_argument("--" + key + ": expected a value");
          val = argv[++i];
        }
        a.values[key].push_back(val);
      } else {
        return invalid_argument("unknown option --" + key + " (known:" + known() + ")");
      }
    } else {
      a.positional.push_back(s);
    }
  }
  return a;
}

/// The option --name of `form`, or null.
const Option* find_option(const Form& form, std::string_view name) {
  for (const OptionGroup& g : form.groups)
    for (const Option& o : g.options)
      if (o.name == name) return &o;
  return nullptr;
}

constexpr std::size_t kHelpLineWidth = 100;  // the help's line width
constexpr std::size_t kOptionColumn = 26;    // where an option's description starts
constexpr std::string_view kUsageLead = "usage: ";

/// "  --name VALUE" and its description at kOptionColumn (on the next line when the name is long).
std::string option_entry(std::string_view left, std::string_view help) {
  std::string line = "  " + std::string(left);
  if (line.size() + 2 > kOptionColumn)
    line += "\n" + std::string(kOptionColumn, ' ');
  else
    line.append(kOptionColumn - line.size(), ' ');
  return line + wrap_text(help, kOptionColumn, kOptionColumn) + "\n";
}

/// A synopsis wrapped at the spaces outside brackets (inside a bracket too long for a line),
/// continuation lines indented past "usage: segflow ".
std::string wrap_synopsis(std::string_view s) {
  const std::size_t indent = kUsageLead.size() + 10;
  std::vector<std::string> words;
  int depth = 0;
  std::string word;
  const auto end_word = [&] {
    if (word.size() + indent > kHelpLineWidth) {  // a long bracket: an option and its value a word
      for (std::string& w : split_text(word, ' ')) {
        if (w.empty()) continue;
        if (words.empty() || w[0] == '-' || w[0] == '[')
          words.push_back(std::move(w));
        else
          words.back().append(" ").append(w);
      }
    } else if (!word.empty()) {
      words.push_back(word);
    }
    word.clear();
  };
  for (char ch : s) {
    if (ch == '[' || ch == '(') ++depth;
    if (ch == ']' || ch == ')') --depth;
    if (ch == ' ' && depth <= 0)
      end_word();
    else
      word += ch;
  }
  end_word();
  std::string out;
  std::size_t col = kUsageLead.size() + 8;  // after "usage: segflow "
  for (const std::string& w : words) {
    if (!out.empty() && col + 1 + w.size() > kHelpLineWidth) {
      out += '\n';
      out.append(indent, ' ');
      col = indent;
    } else if (!out.empty()) {
      out += ' ';
      ++col;
    }
    out += w;
    col += w.size();
  }
  return out;
}

}  // namespace

Result<Args> parse_args(int argc, char** argv, int first, const Form& form) {
  return parse_with(
      argc, argv, first,
      [&](std::string_view name) {
        const Option* o = find_option(form, name);
        return o == nullptr ? OptionKind::unknown : o->value.empty() ? OptionKind::flag : OptionKind::value;
      },
      [&] {
        std::string known;
        for (const OptionGroup& g : form.groups)
          for (const Option& o : g.options) known += " --" + std::string(o.name);
        return known;
      });
}

Result<Args> parse_args(int argc, char** argv, int first, const std::set<std::string>& with_value,
                        const std::set<std::string>& bool_flags) {
  return parse_with(
      argc, argv, first,
      [&](std::string_view name) {
        const std::string key(name);
        return bool_flags.count(key)   ? OptionKind::flag
               : with_value.count(key) ? OptionKind::value
                                       : OptionKind::unknown;
      },
      [&] {
        std::string known;
        for (auto& k : with_value) known += " --" + k;
        for (auto& k : bool_flags) known += " --" + k;
        return known;
      });
}

bool asks_for_help(int argc, char** argv, int first, const Command& c) {
  for (int i = first; i < argc; ++i) {
    const std::string_view s = argv[i];
    if (s == "--help" || s == "-h") return true;
    if (s.size() <= 2 || s.rfind("--", 0) != 0 || s.find('=') != std::string_view::npos) continue;
    for (const Form& f : c.forms)
      if (const Option* o = find_option(f, s.substr(2)); o != nullptr && !o->value.empty()) {
        ++i;  // its value
        break;
      }
  }
  return false;
}

std::string help_text(const Command& c) {
  std::string out;
  for (const Form& f : c.forms)
    for (std::string_view synopsis : split_text(f.usage, '\n'))
      out.append(out.empty() ? kUsageLead : "       ").append("segflow ").append(wrap_synopsis(synopsis)) +=
          '\n';
  for (const Form& f : c.forms) {
    out += "\n";
    std::string head;  // "segflow postprocess apply: " before the summary of one of several forms
    if (c.forms.size() > 1)
      head.append("segflow ").append(c.name).append(" ").append(f.selector).append(": ");
    out += head + wrap_text(f.summary, 0, head.size()) + "\n";
    if (!f.about.empty()) out += wrap_text(f.about, 0, 0) + "\n";
    if (!f.operands.empty()) out += "\narguments:\n";
    for (const Operand& o : f.operands) out += option_entry(o.name, o.help);
    for (const OptionGroup& g : f.groups) {
      out.append("\n").append(g.title.empty() ? "options" : g.title).append(":\n");
      for (const Option& o : g.options) {
        std::string flag = "--";
        flag.append(o.name);
        if (!o.value.empty()) flag.append(" ").append(o.value);
        out += option_entry(flag, o.help);
      }
    }
  }
  if (c.more != nullptr) out += "\n" + c.more();
  return out;
}

std::string wrap_text(std::string_view text, std::size_t indent, std::size_t column, std::size_t width) {
  std::string out;
  std::size_t col = column;  // the indent is written before a line's first word
  bool first_line = true;
  for (std::string_view line : split_text(text, '\n')) {
    if (!first_line) {
      out += '\n';
      col = 0;
    }
    first_line = false;
    bool line_empty = true;
    for (std::size_t p = 0; p < line.size();) {
      const std::size_t q = std::min(line.find(' ', p), line.size());
      const std::string_view word = line.substr(p, q - p);
      p = q + 1;
      if (word.empty()) continue;
      if (!line_empty && col + 1 + word.size() > width) {
        out += '\n';
        col = 0;
        line_empty = true;
      }
      if (!line_empty) {
        out += ' ';
        ++col;
      } else if (col == 0) {
        out.append(indent, ' ');
        col = indent;
      }
      out += word;
      col += word.size();
      line_empty = false;
    }
  }
  return out;
}

std::vector<std::string> split_text(std::string_view text, char separator) {
  std::vector<std::string> out;
  for (std::size_t p = 0; p <= text.size();) {
    const std::size_t q = std::min(text.find(separator, p), text.size());
    out.emplace_back(text.substr(p, q - p));
    p = q + 1;
  }
  return out;
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

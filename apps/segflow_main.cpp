// segflow: the command line. Parses arguments and calls the libraries (or starts actors). The
// commands are one table (kCommands below, each entry's forms and options in its cmd_*.cpp):
// the usage text, `segflow COMMAND --help` and `segflow help --json` are made from it.
#include <torch/version.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <iostream>
#include <map>

#include "apps/commands.hpp"

namespace {

using namespace segflow::apps;

/// Every command, in the order the usage lists them. Adding one is a cmd_*.cpp with its
/// table and one entry here.
constexpr const Command& (*kCommands[])() = {
    synth_command,   inspect_command, stages_command, plan_command,   train_command,
    ctl_command,     infer_command,   eval_command,   cv_command,     postprocess_command,
    package_command, select_command,  export_command, import_command, bench_command,
};

const Command* command_named(std::string_view name) {
  for (auto command : kCommands)
    if (command().name == name) return &command();
  return nullptr;
}

/// "segflow 0.1.0 (LibTorch 2.9.1, with CUDA)".
std::string version_text() {
  return std::string("segflow ") + SEGFLOW_VERSION + " (LibTorch " + TORCH_VERSION +
         (SEGFLOW_WITH_CUDA ? ", with CUDA)" : ", without CUDA)");
}

/// The usage: a line per form of every command (its name, selector and summary).
std::string usage_text() {
  constexpr std::size_t kColumn = 26;
  std::string u =
      "segflow — fast medical-image segmentation training\n\n"
      "usage: segflow COMMAND [arguments] [options]\n"
      "       segflow COMMAND --help    the command's synopsis and every option (also -h, help COMMAND)\n"
      "       segflow --version         segflow's version, LibTorch's, and whether CUDA is compiled in\n\n"
      "commands:\n";
  auto line = [&](const std::string& left, std::string_view summary) {
    std::string l = "  " + left;
    l += l.size() + 2 > kColumn ? "\n" + std::string(kColumn, ' ') : std::string(kColumn - l.size(), ' ');
    u += l + wrap_text(summary, kColumn, kColumn) + "\n";
  };
  for (auto command : kCommands) {
    const Command& c = command();
    for (const Form& f : c.forms) {
      std::string name(c.name);
      if (!f.selector.empty()) name.append(" ").append(f.selector);
      line(name, f.summary);
    }
  }
  line("help [COMMAND]", "this text, or COMMAND's help; help --json: every command, form and option as JSON");
  return u +
         "\nEvery command exits non-zero with one line on stderr for bad input (2: bad usage or a bad\n"
         "config, 1: a failure).\n";
}

/// The table as JSON, for tools (completion, the documentation's check).
nlohmann::json table_json() {
  nlohmann::json commands = nlohmann::json::array();
  for (auto command : kCommands) {
    const Command& c = command();
    nlohmann::json forms = nlohmann::json::array();
    for (const Form& f : c.forms) {
      nlohmann::json operands = nlohmann::json::array(), options = nlohmann::json::array();
      for (const Operand& o : f.operands) operands.push_back({{"name", o.name}, {"help", o.help}});
      for (const OptionGroup& g : f.groups)
        for (const Option& o : g.options)
          options.push_back({{"flag", "--" + std::string(o.name)},
                             {"value", o.value.empty() ? nlohmann::json() : nlohmann::json(o.value)},
                             {"help", o.help},
                             {"group", g.title}});
      forms.push_back({{"selector", f.selector},
                       {"usage", f.usage},
                       {"summary", f.summary},
                       {"about", f.about},
                       {"arguments", operands},
                       {"options", options}});
    }
    commands.push_back({{"name", c.name}, {"forms", forms}});
  }
  return {{"version", SEGFLOW_VERSION}, {"commands", commands}};
}

/// `segflow help [COMMAND | --json]`.
int help_command(int argc, char** argv) {
  if (argc < 3) {
    std::fputs(usage_text().c_str(), stdout);
    return 0;
  }
  const std::string what = argv[2];
  if (what == "--json") {
    std::cout << table_json().dump(2) << '\n';
    return 0;
  }
  const Command* c = command_named(what);
  if (c == nullptr) {
    std::fprintf(stderr, "segflow help: unknown command '%s' (run 'segflow help')\n", what.c_str());
    return 2;
  }
  std::fputs(help_text(*c).c_str(), stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fputs(usage_text().c_str(), stderr);
    return 2;
  }
  const std::string cmd = argv[1];
  if (cmd == "--version") {
    std::printf("%s\n", version_text().c_str());
    return 0;
  }
  if (cmd == "help" || cmd == "--help" || cmd == "-h") return help_command(argc, argv);
  const Command* c = command_named(cmd);
  if (c == nullptr) {
    std::fprintf(stderr, "segflow: unknown command '%s' (run 'segflow help')\n", cmd.c_str());
    return 2;
  }
  if (asks_for_help(argc, argv, 2, *c)) {
    std::fputs(help_text(*c).c_str(), stdout);
    return 0;
  }
  try {
    return c->run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "segflow %s: internal error: %s\n", cmd.c_str(), e.what());
    return 1;
  }
}

// segflow's help, run as a user runs it: every command of the table answers --help, -h and
// `segflow help COMMAND`; the options a help describes are exactly the ones its parser
// accepts (each form's parser asked through a real run); --version; docs/reference/cli.md
// names every option of every command. The table is read with `segflow help --json`.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "test_util.hpp"

using namespace segflow::testing;

namespace {

using nlohmann::json;

/// The command table, from `segflow help --json`.
json command_table(const std::filesystem::path& scratch) {
  auto r = run_segflow("help --json", scratch);
  REQUIRE_MESSAGE(r.exit_code == 0, r.err);
  json table = json::parse(r.out);
  REQUIRE(table["commands"].size() >= 15);
  return table;
}

/// "--out", ... of one form of the table.
std::set<std::string> form_flags(const json& form) {
  std::set<std::string> flags;
  for (const json& o : form["options"]) flags.insert(o["flag"].get<std::string>());
  return flags;
}

/// The options a help text describes: its lines "  --name ..." (the option entries).
std::set<std::string> described_flags(const std::string& help) {
  std::set<std::string> flags;
  std::istringstream in(help);
  for (std::string line; std::getline(in, line);)
    if (line.rfind("  --", 0) == 0) flags.insert(line.substr(2, line.find(' ', 2) - 2));
  return flags;
}

/// The options an "unknown option --x (known: --a --b)" error lists.
std::set<std::string> known_flags(const std::string& error) {
  std::set<std::string> flags;
  const std::size_t at = error.find("(known:");
  REQUIRE_MESSAGE(at != std::string::npos, error);
  std::istringstream in(error.substr(at + 7, error.rfind(')') - at - 7));
  for (std::string f; in >> f;) flags.insert(f);
  return flags;
}

std::size_t line_count(const std::string& s) {
  return static_cast<std::size_t>(std::count(s.begin(), s.end(), '\n'));
}

}  // namespace

TEST_CASE(
    "every command of segflow's table answers --help with its synopsis and exactly the options of its "
    "table") {
  TempDir dir("help_commands");
  const json table = command_table(dir.path());
  auto usage = run_segflow("--help", dir.path());
  REQUIRE(usage.exit_code == 0);
  CHECK(usage.err.empty());
  CHECK(usage.out == run_segflow("help", dir.path()).out);
  for (const json& c : table["commands"]) {
    const std::string name = c["name"];
    CAPTURE(name);
    CHECK_MESSAGE(contains(usage.out, "\n  " + name + " "), usage.out);
    auto help = run_segflow(name + " --help", dir.path());
    CHECK(help.exit_code == 0);
    CHECK(help.err.empty());
    CHECK(help.out.rfind("usage: segflow " + name, 0) == 0);
    std::set<std::string> flags;
    for (const json& form : c["forms"]) {
      for (const json& o : form["options"]) {
        CHECK_MESSAGE(
            contains(help.out, o["flag"].get<std::string>() +
                                   (o["value"].is_null() ? "" : " " + o["value"].get<std::string>())),
            o.dump());
        CHECK(!o["help"].get<std::string>().empty());
        flags.insert(o["flag"].get<std::string>());
      }
      for (const json& a : form["arguments"]) CHECK(contains(help.out, a["name"].get<std::string>()));
      CHECK(contains(help.out, form["summary"].get<std::string>().substr(0, 40)));
    }
    CHECK(described_flags(help.out) == flags);
  }
  // -h and `help COMMAND` are --help; --help after other arguments, not as an option's value.
  for (const std::string name : {"ctl", "postprocess"}) {
    const std::string help = run_segflow(name + " --help", dir.path()).out;
    auto short_help = run_segflow(name + " -h", dir.path());
    CHECK(short_help.exit_code == 0);
    CHECK(short_help.out == help);
    auto help_command = run_segflow("help " + name, dir.path());
    CHECK(help_command.exit_code == 0);
    CHECK(help_command.out == help);
  }
  auto late = run_segflow("postprocess apply --plan p.json --help", dir.path());
  CHECK(late.exit_code == 0);
  CHECK(late.out.rfind("usage: segflow postprocess", 0) == 0);
  auto as_value = run_segflow("eval --pred --help --gt g --no-such-option", dir.path());
  CHECK(as_value.exit_code == 2);
  CHECK(contains(as_value.err, "unknown option --no-such-option"));
}

TEST_CASE("each form's parser accepts exactly the options of its table, and an unknown one is one line") {
  TempDir dir("help_parser");
  const json table = command_table(dir.path());
  std::size_t forms = 0, options = 0;
  for (const json& c : table["commands"]) {
    const std::string name = c["name"];
    CAPTURE(name);
    for (const json& form : c["forms"]) {
      const std::string selector = form["selector"];
      CAPTURE(selector);
      // Every option of the form given (a value where it takes one), then one the parser does
      // not know: the error names that last one, so the parser took all the others, and lists
      // what it knows.
      std::string args = name + " " + selector;
      for (const json& o : form["options"]) {
        args.append(" ").append(o["flag"].get<std::string>());
        if (!o["value"].is_null()) args += " x";
      }
      auto r = run_segflow(args + " --no-such-option", dir.path());
      CHECK(r.exit_code == 2);
      CHECK(r.out.empty());
      CHECK_MESSAGE(r.err.rfind("segflow " + name + ": unknown option --no-such-option (known:", 0) == 0,
                    r.err);
      CHECK(line_count(r.err) == 1);
      const std::set<std::string> flags = form_flags(form);
      CHECK(known_flags(r.err) == flags);
      ++forms;
      options += flags.size();
    }
  }
  MESSAGE(forms << " forms, " << options << " options checked against their parsers");
  CHECK(options >= 100);
}

TEST_CASE("segflow --version prints segflow's version, LibTorch's and whether CUDA is compiled in") {
  TempDir dir("help_version");
  auto r = run_segflow("--version", dir.path());
  REQUIRE(r.exit_code == 0);
  CHECK(r.err.empty());
  std::ifstream cmake(source_path("CMakeLists.txt"));
  const std::string lists{std::istreambuf_iterator<char>(cmake), std::istreambuf_iterator<char>()};
  std::smatch project;
  REQUIRE(std::regex_search(lists, project, std::regex(R"(project\(segflow VERSION ([0-9.]+))")));
  // The Python torch whose LibTorch segflow is built against (SEGFLOW_PYTHON).
  const std::string torch = run_python(
      "import torch\nprint(torch.__version__.split('+')[0], 'with' if torch.version.cuda else 'without')",
      {});
  std::istringstream t(torch);
  std::string torch_version, cuda;
  t >> torch_version >> cuda;
  CHECK(r.out == "segflow " + project[1].str() + " (LibTorch " + torch_version + ", " + cuda + " CUDA)\n");
  CHECK(nlohmann::json::parse(run_segflow("help --json", dir.path()).out)["version"] == project[1].str());
}

TEST_CASE("segflow without a command, an unknown command and help of one are usage errors on stderr") {
  TempDir dir("help_errors");
  auto none = run_segflow("", dir.path());
  CHECK(none.exit_code == 2);
  CHECK(none.out.empty());
  CHECK(contains(none.err, "usage: segflow COMMAND"));
  auto unknown = run_segflow("frobnicate --help", dir.path());
  CHECK(unknown.exit_code == 2);
  CHECK(unknown.err == "segflow: unknown command 'frobnicate' (run 'segflow help')\n");
  auto help_unknown = run_segflow("help frobnicate", dir.path());
  CHECK(help_unknown.exit_code == 2);
  CHECK(help_unknown.err == "segflow help: unknown command 'frobnicate' (run 'segflow help')\n");
  auto bad_value = run_segflow("inspect --json=yes x", dir.path());
  CHECK(bad_value.exit_code == 2);
  CHECK(bad_value.err == "segflow inspect: --json: takes no value\n");
}

TEST_CASE("docs/reference/cli.md has a section per command that names every option of it") {
  TempDir dir("help_docs");
  const json table = command_table(dir.path());
  std::ifstream f(source_path("docs/reference/cli.md"));
  const std::string doc{std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
  // "## `segflow NAME`" up to the next "## ".
  std::map<std::string, std::string> sections;
  const std::regex heading(R"(\n## `segflow ([a-z]+)`\n)");
  for (auto it = std::sregex_iterator(doc.begin(), doc.end(), heading); it != std::sregex_iterator(); ++it) {
    const std::size_t from = static_cast<std::size_t>(it->position(0) + it->length(0));
    sections[(*it)[1]] = doc.substr(from, doc.find("\n## ", from) - from);
  }
  std::set<std::string> names;
  for (const json& c : table["commands"]) {
    const std::string name = c["name"];
    names.insert(name);
    CAPTURE(name);
    REQUIRE_MESSAGE(sections.count(name), "no section ## `segflow " << name << "`");
    for (const json& form : c["forms"])
      for (const json& o : form["options"]) {
        const std::string flag = o["flag"];
        CHECK_MESSAGE(std::regex_search(sections[name], std::regex(flag + "(?![a-z0-9-])")),
                      "cli.md's section of segflow " << name << " does not name " << flag);
      }
  }
  for (const auto& [name, text] : sections)
    CHECK_MESSAGE(names.count(name), "cli.md documents no command " << name);
}

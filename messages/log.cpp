#include "messages/log.hpp"

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <mutex>

namespace segflow::log {

namespace {
spdlog::level::level_enum to_spd(Level l) {
  switch (l) {
    case Level::trace:
      return spdlog::level::trace;
    case Level::debug:
      return spdlog::level::debug;
    case Level::info:
      return spdlog::level::info;
    case Level::warn:
      return spdlog::level::warn;
    case Level::error:
      return spdlog::level::err;
    case Level::off:
      return spdlog::level::off;
  }
  return spdlog::level::info;
}

std::shared_ptr<spdlog::logger> default_logger() {
  static std::once_flag once;
  std::call_once(once, [] {
    auto l = spdlog::stderr_color_mt("segflow");
    l->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%^%l%$] %v");
    spdlog::set_default_logger(l);
  });
  return spdlog::default_logger();
}
}  // namespace

bool parse_level(std::string_view t, Level& out) {
  static const std::pair<std::string_view, Level> names[] = {{"trace", Level::trace}, {"debug", Level::debug},
                                                             {"info", Level::info},   {"warn", Level::warn},
                                                             {"error", Level::error}, {"off", Level::off}};
  for (auto& [n, l] : names)
    if (n == t) {
      out = l;
      return true;
    }
  return false;
}

void set_level(Level level) { default_logger()->set_level(to_spd(level)); }

void trace(std::string_view m) { default_logger()->trace("{}", m); }
void debug(std::string_view m) { default_logger()->debug("{}", m); }
void info(std::string_view m) { default_logger()->info("{}", m); }
void warn(std::string_view m) { default_logger()->warn("{}", m); }
void error(std::string_view m) { default_logger()->error("{}", m); }

void open_named(const std::string& name, const std::filesystem::path& file, bool also_stderr) {
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  if (spdlog::get(name)) return;
  std::vector<spdlog::sink_ptr> sinks;
  sinks.push_back(std::make_shared<spdlog::sinks::basic_file_sink_mt>(file.string(), false));
  if (also_stderr) sinks.push_back(std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
  auto l = std::make_shared<spdlog::logger>(name, sinks.begin(), sinks.end());
  l->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%n] [%^%l%$] %v");
  l->set_level(default_logger()->level());
  l->flush_on(spdlog::level::info);
  spdlog::register_logger(l);
}

void to(const std::string& name, Level level, std::string_view m) {
  auto l = spdlog::get(name);
  (l ? l : default_logger())->log(to_spd(level), "{}", m);
}

void close_named(const std::string& name) {
  if (auto l = spdlog::get(name)) l->flush();
  spdlog::drop(name);
}

}  // namespace segflow::log

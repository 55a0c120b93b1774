#pragma once
// Logging facade over spdlog. spdlog's headers stay in log.cpp: LibTorch bundles its own
// {fmt}, which clashes with the one Debian's spdlog is built on, so no file that includes
// LibTorch may include spdlog. Messages are plain strings.

#include <filesystem>
#include <string_view>

namespace segflow::log {

enum class Level { trace, debug, info, warn, error, off };

/// Parses "trace|debug|info|warn|error|off"; false when unknown.
bool parse_level(std::string_view text, Level& out);
/// Sets the level of the default (stderr) logger. Thread-safe.
void set_level(Level level);

void trace(std::string_view msg);
void debug(std::string_view msg);
void info(std::string_view msg);
void warn(std::string_view msg);
void error(std::string_view msg);

/// A named logger writing to `file` (and stderr when `also_stderr`), e.g. one per job.
/// Creating the same name twice returns the existing logger. Thread-safe.
void open_named(const std::string& name, const std::filesystem::path& file, bool also_stderr);
/// Logs to the named logger, or the default one when it does not exist.
void to(const std::string& name, Level level, std::string_view msg);
/// Flushes and drops a named logger.
void close_named(const std::string& name);

}  // namespace segflow::log

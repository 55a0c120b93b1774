#include "daemon/job_state.hpp"

#include <array>
#include <utility>

namespace segflow::daemon {

namespace {

// clang-format off
constexpr std::array<std::pair<JobState, const char*>, 6> kStates = {{
    {JobState::queued,    "queued"},
    {JobState::running,   "running"},
    {JobState::paused,    "paused"},
    {JobState::stopped,   "stopped"},
    {JobState::completed, "completed"},
    {JobState::failed,    "failed"},
}};
constexpr std::array<std::pair<JobKind, const char*>, 3> kKinds = {{
    {JobKind::train, "train"},
    {JobKind::infer, "infer"},
    {JobKind::plan,  "plan"},
}};
// clang-format on

template <class E, std::size_t N>
const char* name_of(const std::array<std::pair<E, const char*>, N>& table, E value) noexcept {
  for (const auto& [v, name] : table)
    if (v == value) return name;
  return "unknown";
}

template <class E, std::size_t N>
Result<E> parse_name(const std::array<std::pair<E, const char*>, N>& table, std::string_view text,
                     const char* what) {
  std::string names;
  for (const auto& [v, name] : table) {
    if (text == name) return v;
    names += (names.empty() ? "" : ", ") + std::string(name);
  }
  return invalid_argument(std::string(what) + ": expected one of " + names + ", got '" + std::string(text) +
                          "'");
}

}  // namespace

const char* to_string(JobState state) noexcept { return name_of(kStates, state); }
const char* to_string(JobKind kind) noexcept { return name_of(kKinds, kind); }

Result<JobState> parse_job_state(std::string_view text) { return parse_name(kStates, text, "job state"); }
Result<JobKind> parse_job_kind(std::string_view text) { return parse_name(kKinds, text, "job kind"); }

bool is_final(JobState state) noexcept {
  return state == JobState::stopped || state == JobState::completed || state == JobState::failed;
}

}  // namespace segflow::daemon

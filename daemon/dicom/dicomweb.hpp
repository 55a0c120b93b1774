#pragma once
// The DICOMweb services segflowd uses (PS3.18), over a WebClient: STOW-RS to send a result
// (one instance per request), QIDO-RS to list the series of a study and WADO-RS to retrieve a
// series as stored (transfer-syntax=*), with the multipart/related bodies they carry.
//
// A STOW-RS answer is read as PS3.18 10.5.3 says: the HTTP status and, in the DICOM JSON
// body, the FailedSOPSequence (0008,1198) with each instance's FailureReason (0008,1197).
// An instance in it is refused, and not retried, unless its reason says the server ran out
// of resources (A7xx, 0213); so is one a success answer lists neither as stored
// (ReferencedSOPSequence, when the answer has it) nor as failed. 5xx, 401/403/404
// (credentials or url, fixed in the config and taken at the next start), 408 and 429 are
// retried; other 4xx refuse the instance.
//
// Threading: free functions; each call uses only its client.

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "daemon/dicom/web_client.hpp"
#include "messages/status.hpp"

namespace segflow::daemon::dicom {

/// What a STOW-RS attempt did with an instance.
enum class StowResult : std::uint8_t {
  stored,   ///< the server answered success (warnings included)
  refused,  ///< the server refused it for good: not retried
  retry,    ///< no answer, or one that may change: retried with back-off
};
/// "stored", "refused", "retry".
const char* to_string(StowResult r);

struct StowOutcome {
  StowResult result = StowResult::retry;
  std::string detail;  ///< why ("HTTP 200 (OK): FailedSOPSequence: 1.2.3: FailureReason 0x0110 (...)")
};

/// Sends one DICOM Part 10 file by STOW-RS (POST <url>/studies) and reads the answer.
StowOutcome stow_instance(WebClient& client, const std::filesystem::path& file,
                          const std::string& sop_instance_uid);

/// One series of a study, as QIDO-RS lists it.
struct WebSeries {
  std::string uid;              ///< SeriesInstanceUID
  std::string modality;         ///< Modality ("" when not returned)
  std::int64_t instances = -1;  ///< NumberOfSeriesRelatedInstances (-1 when not returned)
};

/// QIDO-RS: the series of `study` (GET <url>/studies/<study>/series), only `series` when
/// given. An error's code says what to do: io_error (no answer, 5xx, 408, 429: retry),
/// not_found (no such study or series), anything else (refused for good).
Result<std::vector<WebSeries>> qido_series(WebClient& client, const std::string& study,
                                           const std::string& series = "");

/// WADO-RS: retrieves a series as stored (GET <url>/studies/<study>/series/<series>, Accept
/// multipart/related; type="application/dicom"; transfer-syntax=*) into `body_file`, then
/// hands each part's bytes to `on_part` in order; returns the number of parts. Errors as
/// qido_series, and corrupt_data for a body that is not multipart.
Result<std::int64_t> wado_series(WebClient& client, const std::string& study, const std::string& series,
                                 const std::filesystem::path& body_file,
                                 const std::function<Status(std::string_view part)>& on_part);

/// A multipart/related body holding `part` as one part of type `type`; `boundary` gets the
/// boundary chosen (one that does not occur in `part`).
std::string multipart_body(std::string_view part, const std::string& type, std::string& boundary);

/// The parts of a multipart body (their content, headers removed) of the given Content-Type
/// (whose boundary parameter is read); an error names what is malformed.
Result<std::vector<std::string_view>> multipart_parts(std::string_view body, const std::string& content_type);

}  // namespace segflow::daemon::dicom

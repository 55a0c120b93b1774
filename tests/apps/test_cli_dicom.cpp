// `segflow inspect` on real DICOM series as a user runs it: the Siemens CT series of the
// totalsegmentator sdist (lossless JPEG 2000, UIDs only in the meta header) against
// SimpleITK, and the read report (skipped localizers, slice-spacing evenness) in its JSON.
#include <doctest/doctest.h>

#include <dcmtk/config/osconfig.h>
#include <dcmtk/dcmdata/dcdatset.h>
#include <dcmtk/dcmdata/dcdeftag.h>
#include <dcmtk/dcmdata/dcfilefo.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>

#include "dicom_test_data.hpp"
#include "test_util.hpp"

namespace fs = std::filesystem;
using namespace segflow::testing;

namespace {

/// Runs `segflow inspect PATH --json`: exit code, the JSON on stdout, stderr's text.
struct Inspect {
  int exit_code = -1;
  nlohmann::json json;
  std::string err;
};
Inspect inspect(const fs::path& path, const TempDir& tmp) {
  const fs::path err = tmp / "stderr.txt";
  auto r = run_command(shell_quote(segflow_bin()) + " inspect " + shell_quote(path.string()) + " --json 2>" +
                       shell_quote(err.string()));
  Inspect out;
  out.exit_code = r.exit_code;
  out.err = read_file(err);
  INFO(r.out << out.err);
  if (r.exit_code == 0) out.json = nlohmann::json::parse(r.out);
  return out;
}

}  // namespace

TEST_CASE("segflow inspect on the real JPEG 2000 CT series agrees with SimpleITK on geometry and values") {
  const fs::path dir = testdata_path("totalsegmentator/example_ct_dicom");
  TempDir tmp("cli_dicom_j2k");
  const Inspect i = inspect(dir, tmp);
  REQUIRE_MESSAGE(i.exit_code == 0, i.err);
  const auto& j = i.json;
  const auto ref = reference_read("sitk", dir);
  INFO(j.dump() << "\n" << ref.dump());
  for (int k = 0; k < 3; ++k) {
    CHECK(j["size"][k].get<std::int64_t>() == ref["size"][k].get<std::int64_t>());
    CHECK(j["spacing"][k].get<double>() == doctest::Approx(ref["spacing"][k].get<double>()).epsilon(1e-9));
    CHECK(std::abs(j["origin"][k].get<double>() - ref["origin"][k].get<double>()) <= 1e-6);
  }
  for (int k = 0; k < 9; ++k)
    CHECK(std::abs(j["direction"][k].get<double>() - ref["direction"][k].get<double>()) <= 1e-9);
  CHECK(j["size"] == nlohmann::json({512, 512, 20}));
  // Lossless: the same HU values, so the same minimum, maximum and mean.
  CHECK(j["min"].get<double>() == ref["min"].get<double>());
  CHECK(j["max"].get<double>() == ref["max"].get<double>());
  CHECK(j["mean"].get<double>() == doctest::Approx(ref["mean"].get<double>()).epsilon(1e-9));
  CHECK(j["format"] == "dicom-folder");
  CHECK(j["modality"] == "CT");
  CHECK(j["dicom_series_identity"] == "FrameOfReferenceUID + orientation + geometry");
  CHECK(j["slice_spacing_max_deviation_mm"].get<double>() < 1e-9);
  CHECK(j["skipped_stacks"].empty());
}

TEST_CASE("segflow inspect of a DICOM folder with localizers and jittered positions reports both") {
  TempDir tmp("cli_dicom_report");
  const fs::path dir = tmp / "series";
  copy_series(ct5n_series(), dir);
  copy_series(mr_scouts_series(), dir, "scout_");
  // Round the CT positions GE-style: steps of 2.5 mm wander by a few hundredths.
  int k = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().filename().string().rfind("scout_", 0) == 0) continue;
    edit_dicom_file(e.path(), [&](DcmDataset& ds) {
      Float64 p[3];
      for (unsigned long c = 0; c < 3; ++c)
        REQUIRE(ds.findAndGetFloat64(DCM_ImagePositionPatient, p[c], c).good());
      char buf[96];
      std::snprintf(buf, sizeof buf, "%.6f\\%.6f\\%.6f", p[0], p[1], p[2] + (k++ % 2 ? 0.04 : -0.04));
      REQUIRE(ds.putAndInsertString(DCM_ImagePositionPatient, buf).good());
    });
  }
  const Inspect i = inspect(dir, tmp);
  REQUIRE_MESSAGE(i.exit_code == 0, i.err);
  const auto& j = i.json;
  INFO(j.dump(2));
  CHECK(j["size"] == nlohmann::json({16, 16, 5}));
  CHECK(j["modality"] == "CT");
  CHECK(j["slice_spacing_max_deviation_mm"].get<double>() > 0.01);
  CHECK(j["slice_spacing_max_deviation_mm"].get<double>() < 0.2);
  REQUIRE(j["skipped_stacks"].size() == 7);
  for (const auto& s : j["skipped_stacks"]) {
    CHECK(s["slices"] == 1);
    CHECK(s["reason"].get<std::string>().find("fewer than the 5 of the stack read") != std::string::npos);
  }
  // And a warning line each on stderr.
  CHECK(i.err.find("slice spacing is not uniform") != std::string::npos);
  CHECK(i.err.find("skipped 7 other stack(s)") != std::string::npos);
  // SimpleITK on the CT files alone: the same z spacing (the mean step) and origin.
  TempDir only("cli_dicom_ct_only");
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().rfind("scout_", 0) != 0)
      fs::copy_file(e.path(), only / e.path().filename().string());
  const auto ref = reference_read("sitk", only.path());
  for (int c = 0; c < 3; ++c) {
    CHECK(j["spacing"][c].get<double>() == doctest::Approx(ref["spacing"][c].get<double>()).epsilon(1e-6));
    CHECK(std::abs(j["origin"][c].get<double>() - ref["origin"][c].get<double>()) <= 1e-6);
  }
}

// Channel grouping by nnU-Net's "_NNNN" suffix (pipeline/io/dataset.hpp group_channels): the
// one rule of the MSD layout's imagesTr/ and of `segflow infer` on a folder of scans.
#include <doctest/doctest.h>

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "pipeline/io/dataset.hpp"
#include "test_util.hpp"

namespace fs = std::filesystem;
using segflow::pipeline::ChannelCase;
using segflow::pipeline::group_channels;
using segflow::pipeline::has_channel_suffix;
using segflow::pipeline::SkippedFile;
using segflow::testing::TempDir;
using segflow::testing::write_file;

TEST_CASE("files are grouped into cases by their channel suffix, channels in order, gaps skipped and named") {
  CHECK(has_channel_suffix("case_0000"));
  CHECK(has_channel_suffix("liver_12_0003"));
  CHECK_FALSE(has_channel_suffix("case_000"));
  CHECK_FALSE(has_channel_suffix("case0000"));
  const std::vector<std::pair<std::string, fs::path>> files = {
      {"b_0001", "b_0001.nii.gz"}, {"a_0000", "a_0000.nii.gz"}, {"b_0000", "b_0000.nii.gz"},
      {"c_0001", "c_0001.nii.gz"}, {"single", "single.nii.gz"}, {"a_0001", "a_0001.nii.gz"},
  };
  std::vector<SkippedFile> skipped;
  const std::vector<ChannelCase> cases = group_channels(files, skipped);
  REQUIRE(cases.size() == 3);
  CHECK(cases[0].id == "a");
  CHECK(cases[0].channels == std::vector<fs::path>{"a_0000.nii.gz", "a_0001.nii.gz"});
  CHECK(cases[1].id == "b");
  CHECK(cases[1].channels == std::vector<fs::path>{"b_0000.nii.gz", "b_0001.nii.gz"});
  CHECK(cases[2].id == "single");
  CHECK(cases[2].channels == std::vector<fs::path>{"single.nii.gz"});
  REQUIRE(skipped.size() == 1);
  CHECK(skipped[0].path == fs::path("c_0001.nii.gz"));
  CHECK(skipped[0].reason == "case c: channel _0000 is missing (channels must be _0000, _0001, ...)");
}

TEST_CASE("an MSD dataset scan groups imagesTr channels with the same rule and lists a case with a gap") {
  TempDir dir("dataset_channels");
  for (const char* f : {"imagesTr/p1_0000.nii.gz", "imagesTr/p1_0001.nii.gz", "imagesTr/p2_0000.nii.gz",
                        "imagesTr/p2_0002.nii.gz", "labelsTr/p1.nii.gz", "labelsTr/p2.nii.gz"}) {
    fs::create_directories((dir / f).parent_path());
    write_file(dir / f, "");
  }
  REQUIRE_OK_AND_ASSIGN(auto idx, segflow::pipeline::scan_dataset(dir.path(), {false}));
  REQUIRE(idx.cases.size() == 1);
  CHECK(idx.cases[0].id == "p1");
  CHECK(idx.cases[0].images.size() == 2);
  CHECK(idx.cases[0].label == dir / "labelsTr/p1.nii.gz");
  REQUIRE(idx.skipped.size() == 1);
  CHECK(idx.skipped[0].reason == "case p2: channel _0001 is missing (channels must be _0000, _0001, ...)");
}

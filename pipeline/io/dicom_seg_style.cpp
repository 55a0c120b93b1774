#include "pipeline/io/dicom_seg_style.hpp"
#include "messages/file_util.hpp"
#include "pipeline/io/segment_codes.hpp"

#include <dcmtk/config/osconfig.h>  // first among DCMTK headers
#include <dcmtk/dcmdata/dcdatset.h>
#include <dcmtk/dcmdata/dcdeftag.h>
#include <dcmtk/dcmdata/dcfilefo.h>
#include <dcmtk/dcmdata/dcitem.h>
#include <dcmtk/dcmdata/dcsequen.h>
#include <dcmtk/dcmiod/cielabutil.h>

#include <algorithm>
#include <cmath>

namespace segflow::pipeline {

namespace fs = std::filesystem;

namespace {

/// Sets `concept` in the first item of `seq` in `item` (created when missing).
bool put_code(DcmItem& item, const DcmTagKey& seq, const CodedConcept& code) {
  DcmItem* c = nullptr;
  if (item.findOrCreateSequenceItem(seq, c, 0).bad() || c == nullptr) return false;
  return c->putAndInsertString(DCM_CodeValue, code.value.c_str()).good() &&
         c->putAndInsertString(DCM_CodingSchemeDesignator, code.scheme.c_str()).good() &&
         c->putAndInsertString(DCM_CodeMeaning, code.meaning.c_str()).good();
}

/// The segment's category and type (and laterality) codes from its name (segment_codes).
bool put_codes(DcmItem& item, const std::string& name) {
  const SegmentCodes codes = segment_codes(name);
  if (!put_code(item, DCM_SegmentedPropertyCategoryCodeSequence, codes.category) ||
      !put_code(item, DCM_SegmentedPropertyTypeCodeSequence, codes.type))
    return false;
  if (!codes.modifier) return true;
  DcmItem* type = nullptr;
  return item.findAndGetSequenceItem(DCM_SegmentedPropertyTypeCodeSequence, type, 0).good() &&
         type != nullptr && put_code(*type, DCM_SegmentedPropertyTypeModifierCodeSequence, *codes.modifier);
}

}  // namespace

std::array<std::uint8_t, 3> default_segment_colour(std::int64_t v) {
  // Distinct, readable on a grey CT background (no grey, no near-black).
  static constexpr std::array<std::array<std::uint8_t, 3>, 12> kPalette = {{{221, 130, 101},
                                                                            {157, 108, 162},
                                                                            {185, 102, 83},
                                                                            {241, 214, 145},
                                                                            {128, 174, 128},
                                                                            {216, 101, 79},
                                                                            {111, 184, 210},
                                                                            {230, 220, 70},
                                                                            {255, 128, 0},
                                                                            {0, 151, 206},
                                                                            {200, 80, 200},
                                                                            {60, 200, 120}}};
  const std::int64_t i = v <= 0 ? 0 : (v - 1) % static_cast<std::int64_t>(kPalette.size());
  return kPalette[static_cast<std::size_t>(i)];
}

std::array<std::uint16_t, 3> rgb_to_dicom_lab(const std::array<std::uint8_t, 3>& rgb) {
  double L = 0, a = 0, b = 0;
  IODCIELabUtil::rgb2DicomLab(L, a, b, rgb[0] / 255.0, rgb[1] / 255.0, rgb[2] / 255.0);
  const auto q = [](double x) { return static_cast<std::uint16_t>(std::clamp(std::lround(x), 0L, 65535L)); };
  return {q(L), q(a), q(b)};
}

Status write_dicom_seg(const fs::path& file, const Image& labels, const DicomSeriesInfo& series,
                       const std::vector<SegmentStyle>& styles) {
  const std::string where = file.string();
  const fs::path tmp = temp_path_for(file);  // the SEG as written, before the style goes in
  SEGFLOW_RETURN_IF_ERROR(write_dicom_seg(tmp, labels, series));
  std::error_code ec;
  const auto cleanup = [&] { fs::remove(tmp, ec); };
  DcmFileFormat ff;
  OFCondition c = ff.loadFile(tmp.c_str());
  if (c.bad()) {
    cleanup();
    return io_error(where + ": cannot read back the written SEG: " + c.text());
  }
  DcmDataset* ds = ff.getDataset();
  DcmSequenceOfItems* seq = nullptr;
  if (ds->findAndGetSequence(DCM_SegmentSequence, seq).bad() || !seq) {
    cleanup();
    return internal_error(where + ": SegmentSequence (0062,0002): missing in the written SEG");
  }
  for (unsigned long i = 0; i < seq->card(); ++i) {
    DcmItem* item = seq->getItem(i);
    Uint16 number = 0;
    if (!item || item->findAndGetUint16(DCM_SegmentNumber, number).bad()) continue;
    std::string name;
    if (number < styles.size()) name = styles[number].label;
    const auto rgb = number < styles.size() ? styles[number].rgb : default_segment_colour(number);
    if (!name.empty()) {
      std::replace(name.begin(), name.end(), '\\', '/');  // the value separator is not allowed in LO
      if (name.size() > 64) name.resize(64);
      if (item->putAndInsertString(DCM_SegmentLabel, name.c_str()).bad()) {
        cleanup();
        return internal_error(where + ": SegmentLabel of segment " + std::to_string(number) +
                              ": cannot set '" + name + "'");
      }
      if (!put_codes(*item, name)) {
        cleanup();
        return internal_error(where + ": segment " + std::to_string(number) + " ('" + name +
                              "'): cannot set its category and type codes");
      }
    }
    const auto lab = rgb_to_dicom_lab(rgb);
    const Uint16 values[3] = {lab[0], lab[1], lab[2]};
    if (item->putAndInsertUint16Array(DCM_RecommendedDisplayCIELabValue, values, 3).bad()) {
      cleanup();
      return internal_error(where + ": RecommendedDisplayCIELabValue of segment " + std::to_string(number) +
                            ": cannot set");
    }
  }
  Status st = replace_file_atomically(file, [&](const fs::path& styled) -> Status {
    const OFCondition saved = ff.saveFile(styled.c_str(), ds->getOriginalXfer());
    if (saved.bad()) return io_error(where + ": cannot write: " + saved.text());
    return Status::ok();
  });
  cleanup();
  return st;
}

}  // namespace segflow::pipeline

#pragma once
// What a DICOM SEG segment is, as codes: the SegmentedPropertyCategory and -Type (and a
// laterality modifier) that viewers and archives read, from the class name a model carries.
// A table of common anatomy and findings with their SNOMED CT codes (the concepts DICOM's
// CID 7150/7166 and pydicom's code dictionary use); a name the table does not know gets the
// generic Tissue/Tissue code and keeps its name as the segment's label.

#include <optional>
#include <string>

namespace segflow::pipeline {

/// One coded concept (CodeValue, CodingSchemeDesignator, CodeMeaning).
struct CodedConcept {
  std::string value;
  std::string scheme;
  std::string meaning;
};

/// A segment's codes.
struct SegmentCodes {
  CodedConcept category;
  CodedConcept type;
  std::optional<CodedConcept> modifier;  ///< laterality (Right/Left) when the name says it
  bool known = false;                    ///< false: the generic Tissue code
};

/// The codes of a class named `name`. Case, '_', '-' and spaces do not matter; a "left" or
/// "right" word becomes the laterality modifier ("kidney_left" = Kidney, modifier Left);
/// common synonyms are known ("tumour", "gall bladder", "ivc", "spinal column").
SegmentCodes segment_codes(const std::string& name);

}  // namespace segflow::pipeline

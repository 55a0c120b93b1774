// Segment codes from class names (pipeline/io/segment_codes.hpp). That the codes are the ones
// pydicom's SNOMED CT dictionary holds is checked on written SEGs (tests/apps/test_infer.cpp);
// here: how names are matched.
#include <doctest/doctest.h>

#include "pipeline/io/segment_codes.hpp"

namespace sp = segflow::pipeline;

TEST_CASE("a class name is matched whatever its case, separators or plural, and synonyms share a code") {
  const sp::SegmentCodes liver = sp::segment_codes("liver");
  CHECK(liver.known);
  CHECK(liver.type.meaning == "Liver");
  CHECK(liver.type.scheme == "SCT");
  CHECK(liver.category.meaning == "Anatomical Structure");
  CHECK_FALSE(liver.modifier.has_value());
  for (const char* n : {"Liver", "LIVER", " liver "})
    CHECK(sp::segment_codes(n).type.value == liver.type.value);
  CHECK(sp::segment_codes("lungs").type.meaning == "Lung");
  CHECK(sp::segment_codes("Inferior_Vena-Cava").type.value == sp::segment_codes("ivc").type.value);
  CHECK(sp::segment_codes("gall bladder").type.value == sp::segment_codes("gallbladder").type.value);
  CHECK(sp::segment_codes("tumour").type.value == sp::segment_codes("tumor").type.value);
  CHECK(sp::segment_codes("tumor").category.meaning == "Morphologically Abnormal Structure");
}

TEST_CASE("left and right in a name become the laterality modifier of the organ's code") {
  const sp::SegmentCodes left = sp::segment_codes("kidney_left");
  REQUIRE(left.known);
  CHECK(left.type.value == sp::segment_codes("kidney").type.value);
  REQUIRE(left.modifier.has_value());
  CHECK(left.modifier->meaning == "Left");
  const sp::SegmentCodes right = sp::segment_codes("Right Adrenal Gland");
  REQUIRE(right.known);
  CHECK(right.type.meaning == "Adrenal gland");
  REQUIRE(right.modifier.has_value());
  CHECK(right.modifier->meaning == "Right");
  CHECK(right.modifier->value != left.modifier->value);
}

TEST_CASE("a name the table does not know gets the generic Tissue code") {
  for (const char* n : {"label_3", "thing 1", "", "left"}) {
    CAPTURE(n);
    const sp::SegmentCodes c = sp::segment_codes(n);
    CHECK_FALSE(c.known);
    CHECK(c.type.meaning == "Tissue");
    CHECK(c.category.meaning == "Tissue");
    CHECK_FALSE(c.modifier.has_value());
  }
}

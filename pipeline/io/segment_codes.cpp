#include "pipeline/io/segment_codes.hpp"

#include <algorithm>
#include <cctype>
#include <sstream>
#include <string_view>
#include <vector>

namespace segflow::pipeline {

namespace {

struct Row {
  std::string_view name;  ///< normalised: lower case, words separated by one space
  std::string_view code;
  std::string_view meaning;
  bool abnormal;  ///< a finding (Morphologically Abnormal Structure), else an anatomical structure
};

// SNOMED CT codes (scheme "SCT"), as pydicom's code dictionary has them.
constexpr Row kRows[] = {
    {"liver", "10200004", "Liver", false},
    {"spleen", "78961009", "Spleen", false},
    {"kidney", "64033007", "Kidney", false},
    {"pancreas", "15776009", "Pancreas", false},
    {"stomach", "69695003", "Stomach", false},
    {"gallbladder", "28231008", "Gallbladder", false},
    {"gall bladder", "28231008", "Gallbladder", false},
    {"aorta", "15825003", "Aorta", false},
    {"inferior vena cava", "64131007", "Inferior vena cava", false},
    {"ivc", "64131007", "Inferior vena cava", false},
    {"portal vein", "32764006", "Portal vein", false},
    {"portal vein and splenic vein", "32764006", "Portal vein", false},
    {"esophagus", "32849002", "Esophagus", false},
    {"oesophagus", "32849002", "Esophagus", false},
    {"duodenum", "38848004", "Duodenum", false},
    {"colon", "71854001", "Colon", false},
    {"small intestine", "30315005", "Small intestine", false},
    {"small bowel", "30315005", "Small intestine", false},
    {"bladder", "89837001", "Bladder", false},
    {"urinary bladder", "89837001", "Bladder", false},
    {"prostate", "41216001", "Prostate", false},
    {"heart", "80891009", "Heart", false},
    {"lung", "39607008", "Lung", false},
    {"trachea", "44567001", "Trachea", false},
    {"brain", "12738006", "Brain", false},
    {"spinal cord", "2748008", "Spinal cord", false},
    {"spine", "421060004", "Spine", false},
    {"vertebral column", "421060004", "Spine", false},
    {"spinal column", "421060004", "Spine", false},
    {"vertebra", "51282000", "Vertebra", false},
    {"adrenal gland", "23451007", "Adrenal gland", false},
    {"adrenal", "23451007", "Adrenal gland", false},
    {"thyroid", "69748006", "Thyroid", false},
    {"thyroid gland", "69748006", "Thyroid", false},
    {"femur", "71341001", "Femur", false},
    {"humerus", "85050009", "Humerus", false},
    {"rib", "113197003", "Rib", false},
    {"sternum", "56873002", "Sternum", false},
    {"clavicle", "51299004", "Clavicle", false},
    {"skull", "89546000", "Skull", false},
    {"pelvis", "816092008", "Pelvis", false},
    {"bone", "272673000", "Bone", false},
    {"muscle", "71616004", "Muscle", false},
    {"fat", "256674009", "Fat", false},
    {"tumor", "108369006", "Neoplasm", true},
    {"tumour", "108369006", "Neoplasm", true},
    {"neoplasm", "108369006", "Neoplasm", true},
    {"lesion", "52988006", "Lesion", true},
    {"cyst", "367643001", "Cyst", true},
    {"mass", "4147007", "Mass", true},
    {"nodule", "27925004", "Nodule", true},
    {"edema", "79654002", "Edema", true},
    {"necrosis", "6574001", "Necrosis", true},
};

const CodedConcept kTissue{"85756007", "SCT", "Tissue"};
const CodedConcept kAnatomy{"91723000", "SCT", "Anatomical Structure"};
const CodedConcept kAbnormal{"49755003", "SCT", "Morphologically Abnormal Structure"};
const CodedConcept kRight{"24028007", "SCT", "Right"};
const CodedConcept kLeft{"7771000", "SCT", "Left"};

const Row* find_row(const std::string& name) {
  for (const Row& r : kRows)
    if (r.name == name) return &r;
  return nullptr;
}

}  // namespace

SegmentCodes segment_codes(const std::string& name) {
  std::string flat;
  for (char c : name) {
    const auto u = static_cast<unsigned char>(c);
    flat += (c == '_' || c == '-' || std::isspace(u)) ? ' ' : static_cast<char>(std::tolower(u));
  }
  std::vector<std::string> words;
  std::optional<CodedConcept> side;
  std::istringstream in(flat);
  for (std::string w; in >> w;) {
    if (w == "right" || w == "left")
      side = w == "right" ? kRight : kLeft;
    else
      words.push_back(w);
  }
  std::string key;
  for (const auto& w : words) key += (key.empty() ? "" : " ") + w;
  const Row* row = find_row(key);
  if (row == nullptr && key.size() > 1 && key.back() == 's') row = find_row(key.substr(0, key.size() - 1));
  if (row == nullptr) return SegmentCodes{kTissue, kTissue, std::nullopt, false};
  return SegmentCodes{row->abnormal ? kAbnormal : kAnatomy,
                      CodedConcept{std::string(row->code), "SCT", std::string(row->meaning)}, side, true};
}

}  // namespace segflow::pipeline

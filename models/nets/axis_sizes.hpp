#pragma once
// Per-axis sizes of the networks' options (strides, kernel sizes) and the checks every
// U-Net's options share: one value or one per axis in (x, y, z) order, products per axis,
// the size divisors an input must fit, and the option binding that reads them from a
// `model` section.

#include <ATen/core/Tensor.h>

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <initializer_list>
#include <iosfwd>
#include <string>
#include <utility>
#include <vector>

#include "models/nets/layers.hpp"
#include "pipeline/fwd.hpp"

namespace segflow::models {

/// Sizes per spatial axis as segflow's configs write them: one integer for every axis, or
/// one per axis in (x, y, z) order ((x, y) in 2D), like every other size in a segflow config
/// (crop spatial_size, resample spacing, validation roi_size). Tensors are (N, C, Z, Y, X):
/// dims() reverses into tensor order for the layers. (nnU-Net's plans.json and MONAI's
/// sequences list sizes in array order z, y, x: the reverse.)
class AxisSizes {
 public:
  AxisSizes(int64_t value = 1) : xyz_{value} {}  // NOLINT(google-explicit-constructor)
  AxisSizes(std::initializer_list<int64_t> xyz) : xyz_(xyz) {}
  explicit AxisSizes(std::vector<int64_t> xyz) : xyz_(std::move(xyz)) {}

  /// The values as written: one (every axis), or one per axis (x, y[, z]).
  const std::vector<int64_t>& xyz() const { return xyz_; }
  /// The size on axis a (0 = x, 1 = y, 2 = z).
  int64_t axis(size_t a) const { return xyz_.size() == 1 ? xyz_.front() : xyz_.at(a); }
  /// The same sizes in tensor order ((Z, Y, X) / (Y, X)).
  DimSizes dims() const;
  /// True when every axis has the size `v`.
  bool all_equal(int64_t v) const;
  /// As written: "2" or "[2, 2, 1]".
  std::string text() const;

  /// Equal sizes on every axis (a single value compares as that value on every axis).
  friend bool operator==(const AxisSizes& a, const AxisSizes& b);

 private:
  std::vector<int64_t> xyz_;
};

/// "(x, y, z)" or "(x, y)": the order of per-axis sizes, as error messages name it.
const char* axis_order_text(int spatial_dims);
/// An integer when one value was written, else the list (x, y[, z]).
void to_json(nlohmann::json& j, const AxisSizes& sizes);
/// "[2, [2, 2, 1], 2]".
std::string to_string(const std::vector<AxisSizes>& sizes);
/// Writes text().
std::ostream& operator<<(std::ostream& stream, const AxisSizes& sizes);

/// "[1, 2, 3]".
std::string sizes_text(const std::vector<int64_t>& v);

/// "" when `s` has one value or one per axis, each >= 1 (and odd when `odd`); else the
/// message's "expected ..., got ..." part.
std::string axis_sizes_error(const AxisSizes& s, int spatial_dims, bool odd);
/// The first entry of `list` that axis_sizes_error refuses, as "<field>[i]: expected ..., got
/// ..."; "" when every entry is fine.
std::string first_axis_sizes_error(const std::string& field, const std::vector<AxisSizes>& list,
                                   int spatial_dims, bool odd);
/// "" when the product of the strides on every axis is at most 2^20 (entries already checked
/// positive), else the message naming the field and the axis.
std::string divisor_error(const char* field, const std::vector<AxisSizes>& strides, int spatial_dims);
/// Per axis (x, y[, z]): the product of the entries on that axis.
std::vector<int64_t> axis_products(const std::vector<AxisSizes>& list, int spatial_dims);
/// The least common multiple of `v` (1 when empty).
int64_t lcm_of(const std::vector<int64_t>& v);
/// Checks a network input (N, C, *spatial) against the expected dims, channels and the divisor
/// of each axis (x, y[, z]; tensors hold them in reverse); TORCH_CHECK errors naming `who`.
void check_network_input(const char* who, const at::Tensor& x, int spatial_dims, int64_t channels,
                         const std::vector<int64_t>& divisors);

/// Binds `key`: one size for every axis or one per axis in (x, y, z) order (a `model` key).
void bind_axis_sizes(pipeline::OptionParser& p, const char* key, AxisSizes& field, int spatial_dims,
                     const char* doc);
/// Binds `key`: a list (per level or stage) of sizes, each one for every axis or one per axis
/// (x, y, z); a bad entry is named: "model.strides[2]: expected an integer or 3 integers (x, y,
/// z), ...".
void bind_axis_sizes_list(pipeline::OptionParser& p, const char* key, std::vector<AxisSizes>& field,
                          int spatial_dims, const char* doc);

}  // namespace segflow::models

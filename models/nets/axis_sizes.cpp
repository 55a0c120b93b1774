#include "models/nets/axis_sizes.hpp"

#include <nlohmann/json.hpp>

#include <cmath>
#include <numeric>
#include <ostream>
#include <sstream>

#include "pipeline/options.hpp"

namespace segflow::models {

std::string sizes_text(const std::vector<int64_t>& v) {
  std::ostringstream s;
  s << "[";
  for (size_t i = 0; i < v.size(); ++i) s << (i ? ", " : "") << v[i];
  s << "]";
  return s.str();
}

std::string axis_sizes_error(const AxisSizes& s, int spatial_dims, bool odd) {
  const size_t n = s.xyz().size();
  bool ok = n == 1 || n == static_cast<size_t>(spatial_dims);
  for (auto v : s.xyz()) ok = ok && v >= 1 && (!odd || v % 2 == 1);
  if (ok) return "";
  if (n == 1)
    return std::string("expected ") + (odd ? "an odd number >= 1" : "a positive integer") + ", got " +
           s.text();
  return "expected " + std::to_string(spatial_dims) + (odd ? " odd numbers >= 1 " : " positive integers ") +
         axis_order_text(spatial_dims) + ", got " + s.text();
}

std::string first_axis_sizes_error(const std::string& field, const std::vector<AxisSizes>& list,
                                   int spatial_dims, bool odd) {
  for (size_t i = 0; i < list.size(); ++i) {
    const auto e = axis_sizes_error(list[i], spatial_dims, odd);
    if (!e.empty()) return field + "[" + std::to_string(i) + "]: " + e;
  }
  return "";
}

// Products of strides per axis above this are refused (no input is that large; it keeps the
// products and their least common multiple inside int64).
constexpr int64_t kMaxSizeDivisor = int64_t{1} << 20;

std::string divisor_error(const char* field, const std::vector<AxisSizes>& strides, int spatial_dims) {
  for (size_t a = 0; a < static_cast<size_t>(spatial_dims); ++a) {
    int64_t p = 1;
    for (const auto& s : strides) {
      if (s.axis(a) > kMaxSizeDivisor / p)
        return std::string(field) + ": expected a product of at most " + std::to_string(kMaxSizeDivisor) +
               " on " + "xyz"[a] + " (every input size on that axis must be a multiple of it), got " +
               to_string(strides);
      p *= s.axis(a);
    }
  }
  return "";
}

std::vector<int64_t> axis_products(const std::vector<AxisSizes>& list, int spatial_dims) {
  std::vector<int64_t> p(static_cast<size_t>(spatial_dims), 1);
  for (const auto& s : list)
    for (size_t a = 0; a < p.size(); ++a) p[a] *= s.axis(a);
  return p;
}

int64_t lcm_of(const std::vector<int64_t>& v) {
  int64_t l = 1;
  for (auto x : v) l = std::lcm(l, x);
  return l;
}

void check_network_input(const char* who, const at::Tensor& x, int spatial_dims, int64_t channels,
                         const std::vector<int64_t>& divisors) {
  TORCH_CHECK(x.dim() == spatial_dims + 2, who, ": expected a ", spatial_dims + 2,
              "-d input (N, C, *spatial), got shape ", x.sizes());
  TORCH_CHECK(x.size(1) == channels, who, ": expected ", channels, " input channels, got shape ", x.sizes());
  for (int a = 0; a < spatial_dims; ++a) {
    const int64_t size = x.size(x.dim() - 1 - a), divisor = divisors[static_cast<size_t>(a)];
    TORCH_CHECK(size % divisor == 0, who, ": the spatial size on ", "xyz"[a], " (", size,
                ") must be divisible by ", divisor, " (the product of the strides on that axis; per axis ",
                axis_order_text(spatial_dims), ": ", sizes_text(divisors), "), got shape ", x.sizes());
  }
}

// ------------------------------------------------------------------------------- AxisSizes

const char* axis_order_text(int spatial_dims) { return spatial_dims == 3 ? "(x, y, z)" : "(x, y)"; }

DimSizes AxisSizes::dims() const { return DimSizes(std::vector<int64_t>(xyz_.rbegin(), xyz_.rend())); }

bool AxisSizes::all_equal(int64_t v) const {
  for (auto x : xyz_)
    if (x != v) return false;
  return true;
}

std::string AxisSizes::text() const {
  return xyz_.size() == 1 ? std::to_string(xyz_.front()) : sizes_text(xyz_);
}

bool operator==(const AxisSizes& a, const AxisSizes& b) {
  if (a.xyz_.size() == 1) return b.all_equal(a.xyz_.front());
  if (b.xyz_.size() == 1) return a.all_equal(b.xyz_.front());
  return a.xyz_ == b.xyz_;
}

void to_json(nlohmann::json& j, const AxisSizes& sizes) {
  if (sizes.xyz().size() == 1)
    j = sizes.xyz().front();
  else
    j = sizes.xyz();
}

std::ostream& operator<<(std::ostream& stream, const AxisSizes& sizes) { return stream << sizes.text(); }

std::string to_string(const std::vector<AxisSizes>& sizes) {
  std::string s = "[";
  for (size_t i = 0; i < sizes.size(); ++i) s += (i ? ", " : "") + sizes[i].text();
  return s + "]";
}

// ---------------------------------------------------------------------- option binding

namespace {

/// "an integer or 3 integers (x, y, z)".
std::string axis_sizes_expected(int spatial_dims) {
  return "an integer or " + std::to_string(spatial_dims) + " integers " + axis_order_text(spatial_dims);
}

/// `v` as AxisSizes: an integer (YAML may write 2.0), or a list of spatial_dims integers.
/// Values are range-checked by the options' validate(), which names the field.
bool read_axis_sizes(const nlohmann::json& v, int spatial_dims, AxisSizes& out) {
  auto as_integer = [](const nlohmann::json& e, std::int64_t& i) {
    if (e.is_number_integer()) {
      i = e.get<std::int64_t>();
      return true;
    }
    if (!e.is_number_float()) return false;
    const double d = e.get<double>();
    if (d != std::floor(d) || std::abs(d) > 9e15) return false;
    i = static_cast<std::int64_t>(d);
    return true;
  };
  std::int64_t i = 0;
  if (as_integer(v, i)) {
    out = AxisSizes(i);
    return true;
  }
  if (!v.is_array() || v.size() != static_cast<std::size_t>(spatial_dims)) return false;
  std::vector<std::int64_t> xyz;
  for (const auto& e : v) {
    if (!as_integer(e, i)) return false;
    xyz.push_back(i);
  }
  out = AxisSizes(std::move(xyz));
  return true;
}

}  // namespace

void bind_axis_sizes(pipeline::OptionParser& p, const char* key, AxisSizes& field, int spatial_dims,
                     const char* doc) {
  nlohmann::json v = field;
  p.json_value(key, v, "integer or list of integers (x, y, z)", doc);
  if (!p.given(key)) return;
  if (!read_axis_sizes(v, spatial_dims, field))
    return p.fail(key,
                  "expected " + axis_sizes_expected(spatial_dims) + ", got " + pipeline::format_value(v));
  p.set_resolved(key, field);
}

void bind_axis_sizes_list(pipeline::OptionParser& p, const char* key, std::vector<AxisSizes>& field,
                          int spatial_dims, const char* doc) {
  nlohmann::json v = field;
  p.json_value(key, v, "list of (integer or list of integers (x, y, z))", doc);
  if (!p.given(key)) return;
  if (!v.is_array())
    return p.fail(key, "expected a list, each entry " + axis_sizes_expected(spatial_dims) + ", got " +
                           pipeline::format_value(v));
  std::vector<AxisSizes> out;
  for (std::size_t i = 0; i < v.size(); ++i) {
    AxisSizes a;
    if (!read_axis_sizes(v[i], spatial_dims, a))
      return p.fail(
          std::string(key) + "[" + std::to_string(i) + "]",
          "expected " + axis_sizes_expected(spatial_dims) + ", got " + pipeline::format_value(v[i]));
    out.push_back(std::move(a));
  }
  field = std::move(out);
  p.set_resolved(key, field);
}

}  // namespace segflow::models

#include "messages/geometry.hpp"

#include <cmath>
#include <sstream>

namespace segflow {

std::array<double, 3> index_to_physical(const Geometry& g, const std::array<double, 3>& index) {
  std::array<double, 3> p = g.origin;
  for (int r = 0; r < 3; ++r)
    for (int c = 0; c < 3; ++c) p[r] += g.direction[r * 3 + c] * g.spacing[c] * index[c];
  return p;
}

bool geometry_close(const Geometry& a, const Geometry& b, double tol) {
  for (int i = 0; i < 3; ++i) {
    if (std::abs(a.spacing[i] - b.spacing[i]) > tol) return false;
    if (std::abs(a.origin[i] - b.origin[i]) > tol) return false;
  }
  for (int i = 0; i < 9; ++i)
    if (std::abs(a.direction[i] - b.direction[i]) > tol) return false;
  return true;
}

bool direction_is_orthonormal(const std::array<double, 9>& d, double tol) {
  for (int a = 0; a < 3; ++a)
    for (int b = 0; b < 3; ++b) {
      double dot = 0;
      for (int r = 0; r < 3; ++r) dot += d[r * 3 + a] * d[r * 3 + b];
      if (std::abs(dot - (a == b ? 1.0 : 0.0)) > tol) return false;
    }
  return true;
}

namespace {
template <std::size_t N>
void put(std::ostringstream& os, const std::array<double, N>& v) {
  os << '[';
  for (std::size_t i = 0; i < N; ++i) os << (i ? ", " : "") << v[i];
  os << ']';
}
}  // namespace

std::string describe(const Geometry& g) {
  std::ostringstream os;
  os << "spacing=";
  put(os, g.spacing);
  os << " origin=";
  put(os, g.origin);
  os << " direction=";
  put(os, g.direction);
  return os.str();
}

}  // namespace segflow

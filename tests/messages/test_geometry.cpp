// Geometry (messages/geometry.hpp): index to LPS point, closeness, orthonormal directions and
// the text used in error messages.
#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <numbers>
#include <string>

#include "messages/geometry.hpp"
#include "test_util.hpp"

using segflow::Geometry;

namespace {

/// Rotation by `deg` degrees about z, row-major (columns are the x, y, z axes).
std::array<double, 9> rotation_z(double deg) {
  const double a = deg * std::numbers::pi / 180.0, c = std::cos(a), s = std::sin(a);
  return {c, -s, 0, s, c, 0, 0, 0, 1};
}

void check_point(const std::array<double, 3>& got, const std::array<double, 3>& expected) {
  for (int i = 0; i < 3; ++i) CHECK(got[i] == doctest::Approx(expected[i]).epsilon(1e-12));
}

}  // namespace

TEST_CASE("an index maps to origin + direction * spacing * index, in x, y, z order") {
  Geometry g;
  g.spacing = {0.5, 2.0, 3.0};
  g.origin = {-10.0, 20.0, 5.0};
  check_point(segflow::index_to_physical(g, {0, 0, 0}), {-10.0, 20.0, 5.0});
  check_point(segflow::index_to_physical(g, {4, 1, 2}), {-8.0, 22.0, 11.0});
  check_point(segflow::index_to_physical(g, {0.5, 0.5, 0.5}), {-9.75, 21.0, 6.5});  // continuous

  // Rotated 90 degrees about z: the x axis of the grid points along patient y.
  g.direction = rotation_z(90);
  check_point(segflow::index_to_physical(g, {4, 0, 0}), {-10.0, 22.0, 5.0});
  check_point(segflow::index_to_physical(g, {0, 1, 0}), {-12.0, 20.0, 5.0});
}

TEST_CASE("two geometries are close when spacing, origin and direction each agree within the tolerance") {
  Geometry a;
  a.spacing = {1.5, 1.5, 3.0};
  a.origin = {1.0, 2.0, 3.0};
  a.direction = rotation_z(20);
  Geometry b = a;
  CHECK(segflow::geometry_close(a, b));
  b.origin[2] += 5e-5;  // within the default 1e-4
  CHECK(segflow::geometry_close(a, b));
  b.origin[2] += 1e-3;
  CHECK_FALSE(segflow::geometry_close(a, b));
  CHECK(segflow::geometry_close(a, b, 1e-2));

  b = a;
  b.spacing[0] = 1.6;
  CHECK_FALSE(segflow::geometry_close(a, b));
  b = a;
  b.direction = rotation_z(21);
  CHECK_FALSE(segflow::geometry_close(a, b));
}

TEST_CASE("a direction is orthonormal when its columns are unit length and perpendicular") {
  CHECK(segflow::direction_is_orthonormal({1, 0, 0, 0, 1, 0, 0, 0, 1}));
  CHECK(segflow::direction_is_orthonormal(rotation_z(33)));
  CHECK(segflow::direction_is_orthonormal({-1, 0, 0, 0, -1, 0, 0, 0, 1}));        // RAS to LPS flip
  CHECK_FALSE(segflow::direction_is_orthonormal({2, 0, 0, 0, 1, 0, 0, 0, 1}));    // scaled
  CHECK_FALSE(segflow::direction_is_orthonormal({1, 0.2, 0, 0, 1, 0, 0, 0, 1}));  // sheared
  CHECK_FALSE(segflow::direction_is_orthonormal({0, 0, 0, 0, 1, 0, 0, 0, 1}));    // degenerate
  CHECK(segflow::direction_is_orthonormal({1, 5e-4, 0, 0, 1, 0, 0, 0, 1}));       // within 1e-3
  CHECK_FALSE(segflow::direction_is_orthonormal({1, 5e-4, 0, 0, 1, 0, 0, 0, 1}, 1e-4));
}

TEST_CASE("a geometry describes itself as spacing, origin and direction lists") {
  Geometry g;
  g.spacing = {0.75, 0.75, 2.5};
  g.origin = {-120.5, 0, 33};
  CHECK(segflow::describe(g) ==
        "spacing=[0.75, 0.75, 2.5] origin=[-120.5, 0, 33] direction=[1, 0, 0, 0, 1, 0, 0, 0, 1]");
}

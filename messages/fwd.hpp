#pragma once
// Forward declarations of segflow's message and data types.
namespace segflow {
class Status;
template <class T>
class Result;
struct Geometry;
}  // namespace segflow

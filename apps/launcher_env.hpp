#pragma once
// What the launchers (segflow, segflowd) fix in their own environment before anything runs.

namespace segflow::apps {

/// Sets OMP_WAIT_POLICY=passive when the user has not set it, by re-executing this program
/// (execv of /proc/self/exe with the same argv) with the variable added: libgomp reads it
/// once, when it is loaded, which is before main (it is a dependency of LibTorch), so a
/// setenv alone would come too late. Under libgomp's default (throttled spin-waits) a CPU
/// bf16 step slows down severalfold when several OpenMP teams share the cores (bench/RESULTS.md).
/// A value the user set, even an empty one, is kept. Call first thing in main, before any
/// thread starts. Returns only when no re-exec was needed or it failed (then with a warning
/// on stderr and the default policy).
void ensure_omp_wait_policy(char** argv);

}  // namespace segflow::apps

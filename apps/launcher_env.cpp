#include "apps/launcher_env.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace segflow::apps {

void ensure_omp_wait_policy(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr) return;
  if (::setenv("OMP_WAIT_POLICY", "passive", 1) != 0) return;
  // The variable is set now, so the re-executed program returns above: no loop.
  ::execv("/proc/self/exe", argv);
  std::fprintf(stderr,
               "segflow: warning: re-executing with OMP_WAIT_POLICY=passive failed (%s); "
               "set OMP_WAIT_POLICY yourself on a shared CPU machine\n",
               std::strerror(errno));
}

}  // namespace segflow::apps

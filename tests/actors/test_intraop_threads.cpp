// The data path's own threads run their LibTorch ops on one thread each
// (actors/detail/intraop_threads.hpp), also after the trainer has set a larger process-wide
// team: LibTorch's first-use set-up of a thread would otherwise give it that team.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <doctest/doctest.h>

#include <thread>

#include "actors/detail/intraop_threads.hpp"

TEST_CASE("a data-path thread keeps one intra-op thread after the trainer set a team of several") {
  const int before = at::get_num_threads();
  at::set_num_threads(3);  // what a trainer's IntraOpTeam does on its own thread
  int after_op = 0;
  std::thread data_path([&] {
    segflow::actors::detail::use_one_intraop_thread();
    // A parallel op large enough to open a team, as a crop or a flip on a volume does.
    auto x = at::rand({1 << 20});
    (void)(x * x).sum().item<float>();
    after_op = at::get_num_threads();
  });
  data_path.join();
  CHECK(after_op == 1);
  CHECK(at::get_num_threads() == 3);  // the calling thread's team is its own
  at::set_num_threads(before);
}

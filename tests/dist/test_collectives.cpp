// Collectives over loopback Gloo on 2 and 3 processes, against references each rank
// computes from every rank's (deterministic) data; and what a rank that dies, stops or
// never comes does to the others.
#include <chrono>
#include <cmath>
#include <csignal>
#include <thread>

#include "core/cuda.h"
#include "dist/launch_env.h"
#include "dist/process_group.h"
#include "rank_testing.h"
#include "testing.h"
#include "tolerance.h"

using namespace kiln;
using kiln::testing::RankJob;

namespace {

// Rank r's element i: multiples of 1/16 in [-6.25, 6.25], exact in bf16 (at most 8
// significant bits), so bf16 sums of 3 are exact in f32 and round once, like the reference.
double exact_value(int rank, int64_t i) { return static_cast<double>((i * 31 + rank * 17) % 201 - 100) / 16; }
// Rank r's element i for f32 and f64: not exact, so sums round.
double rough_value(int rank, int64_t i) {
  return std::sin(static_cast<double>(i) * 0.37 + rank * 1.91) * 10 + 0.001 * static_cast<double>(rank);
}
double value(DType dtype, int rank, int64_t i) {
  return dtype == DType::bf16 ? exact_value(rank, i) : rough_value(rank, i);
}

Tensor rank_tensor(DType dtype, int rank, int64_t n) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = value(dtype, rank, i);
  return from_vector<double>(v, {n}).to(dtype);
}

// The value as the tensor of `dtype` holds it.
double stored(DType dtype, double v) { return testing::values(from_vector<double>({v}, {1}).to(dtype))[0]; }

double unit_roundoff(DType dtype) { return dtype == DType::f64 ? 0x1p-53 : testing::kF32Roundoff; }

void check_all_reduce(DType dtype, dist::ReduceOp op, int64_t n, int rank, int world) {
  Tensor t = rank_tensor(dtype, rank, n);
  dist::all_reduce(t, op).wait();
  const std::vector<double> got = testing::values(t);
  for (int64_t i = 0; i < n; ++i) {
    double sum = 0, magnitude = 0, max = -INFINITY;
    for (int r = 0; r < world; ++r) {
      const double x = stored(dtype, value(dtype, r, i));
      sum += x;
      magnitude += std::fabs(x);
      max = std::max(max, x);
    }
    const double got_i = got[static_cast<size_t>(i)];
    INFO(fmt::format("{}", dtype) << " " << (op == dist::ReduceOp::sum ? "sum" : op == dist::ReduceOp::avg ? "avg" : "max")
               << " of " << n << ", element " << i << " on rank " << rank);
    if (op == dist::ReduceOp::max) {
      REQUIRE(got_i == max);
    } else if (dtype == DType::bf16) {
      // Reduced in f32 (exact here) and rounded once to bf16, avg divided in f32 first.
      const float f32_sum = static_cast<float>(sum);
      const double expected = op == dist::ReduceOp::sum ? stored(dtype, f32_sum)
                                                        : stored(dtype, f32_sum / static_cast<float>(world));
      REQUIRE(got_i == expected);
    } else {
      // world - 1 additions in some order (gamma(world - 1) of the magnitudes, Higham 4.4),
      // one rounding to the dtype and, for avg, one of the division: gamma(world + 1).
      const double bound = testing::sum_error_bound(world + 1, unit_roundoff(dtype)) * magnitude;
      const double expected = op == dist::ReduceOp::sum ? sum : sum / world;
      REQUIRE(std::fabs(got_i - expected) <= (op == dist::ReduceOp::sum ? bound : bound / world));
    }
  }
}

std::chrono::milliseconds test_timeout() {
  const int ms = testing::env_int("KILN_TEST_TIMEOUT_MS");
  return std::chrono::milliseconds(ms > 0 ? ms : 30000);
}

struct GroupScope {
  explicit GroupScope(dist::ProcessGroupOptions options = {.backend = "gloo"}) {
    options.timeout = test_timeout();
    dist::init_process_group(options);
  }
  ~GroupScope() { dist::destroy_process_group(); }
};

}  // namespace

// ---- the ranks' side (hidden: run by the tests below in child processes) ----

TEST_CASE("rank: collectives", "[.rank]") {
  GroupScope group;
  const int rank = dist::get_rank(), world = dist::get_world_size();
  REQUIRE(world == dist::read_launch_env()->world_size);  // kiln-run's WORLD_SIZE, or mpirun's OMPI_COMM_WORLD_SIZE
  for (int64_t n : {1, 13, 4099}) {
    for (DType dtype : {DType::f32, DType::f64, DType::bf16})
      for (dist::ReduceOp op : {dist::ReduceOp::sum, dist::ReduceOp::avg, dist::ReduceOp::max})
        check_all_reduce(dtype, op, n, rank, world);
    for (DType dtype : {DType::f32, DType::bf16}) {
      Tensor b = rank_tensor(dtype, rank, n);
      dist::broadcast(b, world - 1).wait();
      REQUIRE(testing::values(b) == testing::values(rank_tensor(dtype, world - 1, n)));

      Tensor out = zeros({world * n, 1}, {.dtype = dtype});
      dist::all_gather(out, rank_tensor(dtype, rank, n).reshape({n, 1})).wait();
      for (int r = 0; r < world; ++r)
        REQUIRE(testing::values(out.narrow(0, r * n, n)) == testing::values(rank_tensor(dtype, r, n)));

      // reduce_scatter: every rank's [world * n] input, summed; this rank's n.
      Tensor in = rank_tensor(DType::bf16, rank, world * n).to(dtype);  // exact values: exact sums
      Tensor slice = zeros({n}, {.dtype = dtype});
      dist::reduce_scatter(slice, in, dist::ReduceOp::sum).wait();
      Tensor expected = zeros({world * n}, {.dtype = DType::f64});
      for (int r = 0; r < world; ++r) expected.add_(rank_tensor(DType::bf16, r, world * n).to(DType::f64));
      REQUIRE(testing::values(slice) == testing::values(expected.narrow(0, rank * n, n).to(dtype)));
    }
  }
  // Several in flight at once, waited in reverse: they run in the order issued.
  std::vector<Tensor> tensors;
  std::vector<dist::Work> works;
  for (int k = 0; k < 5; ++k) {
    tensors.push_back(full({7}, static_cast<double>(rank + k), {.dtype = DType::f64}));
    works.push_back(dist::all_reduce(tensors.back()));
  }
  for (int k = 4; k >= 0; --k) {
    works[static_cast<size_t>(k)].wait();
    REQUIRE(works[static_cast<size_t>(k)].is_completed());
    REQUIRE(testing::values(tensors[static_cast<size_t>(k)])[0] == world * (world - 1) / 2.0 + world * k);
  }
  const dist::CollectiveCounts counts = dist::default_group().counts();
  REQUIRE(counts.all_reduce == 3 * 3 * 3 + 5);  // sizes x dtypes x ops, and the 5 in flight
  REQUIRE(counts.reduce_scatter == 3 * 2);
  // Bad input: nothing is sent, every rank throws the same way.
  Tensor strided = zeros({4, 3}).t();
  REQUIRE_THROWS_WITH(dist::all_reduce(strided), Catch::Contains("all_reduce") && Catch::Contains("not contiguous"));
  REQUIRE_THROWS_WITH(dist::all_reduce(zeros({3}, {.dtype = DType::i64}), dist::ReduceOp::avg),
                      Catch::Contains("cannot avg"));
  REQUIRE_THROWS_WITH(dist::all_gather(zeros({5}), zeros({2})), Catch::Contains("all_gather: output f32[5]"));
  REQUIRE_THROWS_WITH(dist::broadcast(zeros({2}), world), Catch::Contains("root"));
  dist::barrier().wait();
}

TEST_CASE("rank: a rank dies after the first all_reduce", "[.rank]") {
  GroupScope group;
  const int rank = dist::get_rank(), world = dist::get_world_size();
  Tensor t = ones({1000});
  dist::all_reduce(t).wait();
  if (rank == world - 1) {
    // Not at once: a process killed with unread data in its sockets resets them, and the
    // peers could lose the last bytes of the all_reduce that did complete.
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    std::raise(SIGKILL);
  }
  const auto start = std::chrono::steady_clock::now();
  try {
    for (int i = 0; i < 100; ++i) dist::all_reduce(t).wait();
    FAIL("all_reduce went on without rank " << world - 1);
  } catch (const Error& e) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    INFO(e.what());
    CHECK(s < test_timeout().count() / 1000.0);
    CHECK_THAT(e.what(), Catch::Contains("all_reduce(f32[1000] cpu, sum)") &&
                             Catch::Contains("on rank " + std::to_string(rank) + " of " + std::to_string(world)));
    // The peer that went away is named when this rank's own connection to it broke.
    const std::string message = e.what();
    if (message.find("the connection to rank") != std::string::npos)
      CHECK_THAT(message, Catch::Contains("the connection to rank " + std::to_string(world - 1)));
  }
  // The group is broken now: the next collective says so at once.
  REQUIRE_THROWS_WITH(dist::all_reduce(t).wait(), Catch::Contains("broken"));
}

TEST_CASE("rank: a rank stops calling collectives", "[.rank]") {
  GroupScope group;
  const int rank = dist::get_rank(), world = dist::get_world_size();
  if (rank == world - 1) {
    std::this_thread::sleep_for(test_timeout() * 2);
    return;
  }
  REQUIRE_THROWS_WITH(dist::all_reduce(ones({10})).wait(),
                      Catch::Contains("all_reduce") && Catch::Contains("timeout"));
}

TEST_CASE("rank: a rank never arrives", "[.rank]") {
  const auto start = std::chrono::steady_clock::now();
  // Rank 0, whose store it is, names the missing rank; rank 1 names it too, or sees the
  // store go when rank 0 gave up first.
  try {
    dist::init_process_group({.backend = "gloo", .timeout = test_timeout()});
    FAIL("init_process_group returned without rank 2");
  } catch (const Error& e) {
    const std::string message = e.what();
    if (testing::env_int("RANK") == 0) CHECK_THAT(message, Catch::Contains("rank 2 of 3 did not arrive within"));
    else CHECK_THAT(message, Catch::Contains("rank 2 of 3 did not arrive within") || Catch::Contains("went away"));
  }
  // The wait, then a reconnect to a store that may be gone (each bounded by the timeout).
  CHECK(std::chrono::steady_clock::now() - start < test_timeout() * 3 + std::chrono::seconds(2));
}

// ---- the tests ----

TEST_CASE("collectives on 2 and 3 ranks match a plain reference (f32, f64, bf16, odd sizes)", "[dist]") {
  for (int world : {2, 3}) {
    INFO(world << " ranks");
    testing::require_ranks_pass({.test_case = "rank: collectives", .world_size = world});
  }
}

TEST_CASE("a killed rank makes the others fail with an error naming the collective", "[dist]") {
  const auto start = std::chrono::steady_clock::now();
  const std::vector<testing::RankExit> exits = testing::run_ranks(
      {.test_case = "rank: a rank dies after the first all_reduce", .world_size = 3,
       .env = {{"KILN_TEST_TIMEOUT_MS", "10000"}}, .limit_s = 30});
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r << " (signal " << exits[static_cast<size_t>(r)].signal << ") said:\n" << exits[static_cast<size_t>(r)].output);
    CHECK(exits[static_cast<size_t>(r)].status == 0);
  }
  CHECK(exits[2].signal == SIGKILL);
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(10));
}

TEST_CASE("a rank that stops makes the others time out", "[dist]") {
  testing::require_ranks_pass({.test_case = "rank: a rank stops calling collectives", .world_size = 3,
                               .env = {{"KILN_TEST_TIMEOUT_MS", "1500"}}, .limit_s = 30});
}

TEST_CASE("a rank that never arrives makes init_process_group fail naming it", "[dist]") {
  testing::require_ranks_pass({.test_case = "rank: a rank never arrives", .world_size = 3, .ranks = {0, 1},
                               .env = {{"KILN_TEST_TIMEOUT_MS", "1500"}}, .limit_s = 30});
}

TEST_CASE("a group of one rank needs no launcher", "[dist]") {
  dist::ProcessGroup group({.backend = "gloo", .timeout = std::chrono::seconds(10), .rank = 0, .world_size = 1});
  Tensor t = from_vector<float>({1, 2, 3});
  group.all_reduce(t, dist::ReduceOp::avg).wait();
  CHECK(testing::values(t) == std::vector<double>{1, 2, 3});
  Tensor out = zeros({3});
  group.all_gather(out, t).wait();
  CHECK(testing::values(out) == std::vector<double>{1, 2, 3});
  group.barrier().wait();
}

// srun starts the tasks with SLURM_* variables only; MASTER_PORT comes from the job script
// (README: --export or export), MASTER_ADDR may be left out on one node.
TEST_CASE("collectives on 2 ranks placed by Slurm's variables", "[dist]") {
  testing::require_ranks_pass({.test_case = "rank: collectives", .world_size = 2, .launcher = "slurm"});
}

TEST_CASE("a process no launcher started is a job of one rank", "[dist]") {
  if (dist::read_launch_env().has_value()) {
    WARN("skipped: this test runs under a launcher");
    return;
  }
  dist::init_process_group({.backend = "gloo", .timeout = std::chrono::seconds(10)});
  CHECK((dist::get_rank() == 0 && dist::get_world_size() == 1));
  REQUIRE_THROWS_WITH(dist::init_process_group(), Catch::Contains("already initialized (rank 0 of 1)"));
  dist::destroy_process_group();
  CHECK_FALSE(dist::is_initialized());
  REQUIRE_THROWS_WITH(dist::init_process_group({.world_size = 2}), Catch::Contains("world_size 2 asked for without .rank"));
}

TEST_CASE("init_process_group names a backend it does not have", "[dist]") {
  // Without a GPU (or without NCCL in the build, or its library) nccl says why; with one,
  // tests/dist/test_nccl.cpp runs it.
  const std::string why = dist::nccl_unavailable_reason();
  if (!why.empty()) {
    REQUIRE_THROWS_WITH(dist::ProcessGroup({.backend = "nccl", .rank = 0, .world_size = 1}),
                        Catch::Contains("init_process_group: backend nccl cannot run here: " + why) &&
                            Catch::Contains("backend gloo runs on CPU tensors"));
    if (!cuda::is_available()) CHECK_THAT(why, Catch::Contains("no CUDA GPU") || Catch::Contains("without NCCL"));
  }
  REQUIRE_THROWS_WITH(dist::ProcessGroup({.backend = "mpi", .rank = 0, .world_size = 1}),
                      Catch::Contains("unknown backend 'mpi': expected gloo, nccl or auto"));
  REQUIRE_THROWS_WITH(dist::default_group(), Catch::Contains("init_process_group() first"));
}

TEST_CASE("backend auto serves CPU tensors by Gloo, and NCCL only where it can run", "[dist]") {
  dist::ProcessGroup group({.backend = "auto", .timeout = std::chrono::seconds(10), .rank = 0, .world_size = 1});
  CHECK(group.backend() == (dist::nccl_unavailable_reason().empty() ? "gloo+nccl" : "gloo"));
  Tensor t = full({3}, 2.0);
  group.all_reduce(t, dist::ReduceOp::avg).wait();
  CHECK(testing::values(t) == std::vector<double>{2, 2, 2});
  // NCCL's version where its library loads (a build with NCCL, GPU or not).
  const std::string version = dist::nccl_version();
  if (!version.empty()) CHECK_THAT(version, Catch::Matches("2\\.[0-9]+\\.[0-9]+"));
}

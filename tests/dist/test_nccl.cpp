// The NCCL backend on CUDA tensors. These need a GPU (and a build with NCCL): elsewhere each
// says why it skips. `make gpu-check` runs them (kiln-tests-dist "[nccl]"). One GPU gives a
// job of one rank, which still runs every collective through NCCL's kernels; the 2-rank
// cases need 2 GPUs (NCCL refuses two ranks of one communicator on one device).
//
// References: world size 1 makes every reduction the identity on the data (sum and max of
// one term, avg divides by 1), so results are compared bit for bit; with 2 ranks the sums
// of two terms are exact for the values used (multiples of 1/16 below 2^7).
#include <chrono>
#include <csignal>
#include <thread>

#include "core/cuda.h"
#include "dist/data_parallel.h"
#include "dist/process_group.h"
#include "rank_testing.h"
#include "testing.h"

using namespace kiln;

namespace {

// Why this process cannot run NCCL, or empty.
std::string skip_reason(int gpus = 1) {
  std::string why = dist::nccl_unavailable_reason();
  if (why.empty() && cuda::device_count() < gpus)
    why = fmt::format("{} GPUs needed, {} visible", gpus, cuda::device_count());
  return why;
}

#define KILN_SKIP_WITHOUT_NCCL(gpus)                             \
  if (const std::string why = skip_reason(gpus); !why.empty()) { \
    WARN("skipped: " << why);                                    \
    return;                                                      \
  }

const Device kGpu = Device::cuda(0);

bool have_gloo() {
  try {
    dist::ProcessGroup probe(
        {.backend = "gloo", .timeout = std::chrono::seconds(10), .rank = 0, .world_size = 1});
    return true;
  } catch (const Error&) {
    return false;
  }
}

// Exact values: multiples of 1/16 in [-6.25, 6.25].
Tensor exact(int64_t n, int seed, DType dtype) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    v[static_cast<size_t>(i)] = static_cast<double>((i * 31 + seed * 17) % 201 - 100) / 16;
  return from_vector<double>(v, {n}).to(dtype);
}

std::vector<double> host(const Tensor& t) { return testing::values(t.to(Device::cpu())); }

}  // namespace

TEST_CASE("NCCL: every collective on one rank equals its reference", "[nccl]") {
  KILN_SKIP_WITHOUT_NCCL(1);
  dist::ProcessGroup group(
      {.backend = "nccl", .timeout = std::chrono::seconds(60), .rank = 0, .world_size = 1});
  CHECK(group.backend() == "nccl");
  for (int64_t n : {1, 13, 4099}) {
    for (DType dtype : {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32, DType::i64}) {
      INFO(fmt::format("{}", dtype) << " x " << n);
      const bool floating = is_floating(dtype);
      for (dist::ReduceOp op : {dist::ReduceOp::sum, dist::ReduceOp::avg, dist::ReduceOp::max}) {
        if (!floating && op == dist::ReduceOp::avg) continue;
        const Tensor reference = exact(n, 1, dtype);
        // Written by a kiln op on the device's stream just before: the collective waits for it.
        Tensor t = (reference.to(kGpu) * 1).contiguous();
        group.all_reduce(t, op).wait();
        REQUIRE(host(t) == testing::values(reference));
      }
      Tensor b = exact(n, 2, dtype).to(kGpu);
      group.broadcast(b, 0).wait();
      REQUIRE(host(b) == testing::values(exact(n, 2, dtype)));
      Tensor out = zeros({n}, {.dtype = dtype, .device = kGpu});
      group.all_gather(out, exact(n, 3, dtype).to(kGpu)).wait();
      REQUIRE(host(out) == testing::values(exact(n, 3, dtype)));
      Tensor slice = zeros({n}, {.dtype = dtype, .device = kGpu});
      group.reduce_scatter(slice, exact(n, 4, dtype).to(kGpu), dist::ReduceOp::sum).wait();
      REQUIRE(host(slice) == testing::values(exact(n, 4, dtype)));
    }
  }
  // Several in flight, waited in reverse; each took some time on the device.
  std::vector<Tensor> tensors;
  std::vector<dist::Work> works;
  for (int k = 0; k < 5; ++k) {
    tensors.push_back(
        full({1 << 16}, static_cast<double>(k), {.dtype = DType::f32, .device = kGpu}));
    works.push_back(group.all_reduce(tensors.back()));
  }
  for (int k = 4; k >= 0; --k) {
    works[static_cast<size_t>(k)].wait();
    CHECK(works[static_cast<size_t>(k)].is_completed());
    CHECK(works[static_cast<size_t>(k)].seconds() > 0);
    CHECK(host(tensors[static_cast<size_t>(k)])[0] == k);
  }
  group.barrier().wait();
  CHECK(group.counts().all_reduce == 3 * (3 * 4 + 2 * 2) + 5);
  CHECK(group.counts().barrier == 1);
  // CPU tensors belong to gloo.
  Tensor cpu = zeros({2});
  REQUIRE_THROWS_WITH(group.all_reduce(cpu).wait(),
                      Catch::Contains("backend nccl runs on CUDA tensors"));
}

TEST_CASE("NCCL: backend auto sends CUDA tensors to NCCL and CPU tensors to Gloo", "[nccl]") {
  KILN_SKIP_WITHOUT_NCCL(1);
  if (!have_gloo()) {
    WARN("skipped: this kiln was built without Gloo");
    return;
  }
  dist::ProcessGroup group(
      {.backend = "auto", .timeout = std::chrono::seconds(60), .rank = 0, .world_size = 1});
  CHECK(group.backend() == "gloo+nccl");
  Tensor g = full({5}, 3.0, {.dtype = DType::f32, .device = kGpu});
  Tensor c = full({5}, 4.0, {.dtype = DType::f32});
  dist::Work wg = group.all_reduce(g, dist::ReduceOp::avg);
  dist::Work wc = group.all_reduce(c, dist::ReduceOp::avg);
  wg.wait();
  wc.wait();
  CHECK(host(g) == std::vector<double>(5, 3.0));
  CHECK(testing::values(c) == std::vector<double>(5, 4.0));
  // A gloo group names the backend a CUDA tensor needs.
  dist::ProcessGroup gloo(
      {.backend = "gloo", .timeout = std::chrono::seconds(10), .rank = 0, .world_size = 1});
  REQUIRE_THROWS_WITH(gloo.all_reduce(g),
                      Catch::Contains("backend gloo runs on CPU tensors") &&
                          Catch::Contains("use backend nccl or auto for CUDA tensors"));
}

TEST_CASE("NCCL: a data-parallel step on CUDA equals one process", "[nccl]") {
  KILN_SKIP_WITHOUT_NCCL(1);
  dist::ProcessGroup group(
      {.backend = "nccl", .timeout = std::chrono::seconds(60), .rank = 0, .world_size = 1});
  for (bool views : {false, true}) {
    INFO((views ? "gradients as bucket views" : "copies into the buckets"));
    manual_seed(3);
    models::MLP plain({6, 32, 3});
    manual_seed(3);
    models::MLP replica({6, 32, 3});
    plain.to(kGpu);
    replica.to(kGpu);
    // Several buckets, so several all-reduces overlap backward.
    dist::DistributedDataParallel ddp(
        replica, {.bucket_cap_mb = 0.0002, .group = &group, .gradient_as_bucket_view = views});
    optim::SGD opt_plain(plain.parameters(), {.lr = 0.1, .momentum = 0.9});
    optim::SGD opt_replica(replica.parameters(), {.lr = 0.1, .momentum = 0.9});
    optim::Accumulation acc({.batch = 8, .micro_batch = 4});
    ddp.attach(acc);
    for (int step = 0; step < 3; ++step) {
      manual_seed(static_cast<uint64_t>(10 + step));
      const Tensor x = randn({8, 6}).to(kGpu), y = randn({8, 3}).to(kGpu);
      mse_loss(plain(x), y).backward();
      const int64_t before = group.counts().all_reduce;
      for (const optim::MicroBatch& mb : acc.split_shard(x, y, {.samples = 8, .world_size = 1})) {
        auto sync = ddp.no_sync(!mb.is_last);
        mb.scale(mse_loss(replica(mb.x), mb.y)).backward();
        mb.finish();
      }
      CHECK(group.counts().all_reduce - before == ddp.bucket_count());
      opt_plain.step();
      opt_replica.step();
      opt_plain.zero_grad();
      opt_replica.zero_grad();
      // Two micro-batches' halves against the whole batch: the same terms summed in
      // another order (8 samples), so f32 rounding apart: 1e-5 relative, as the CPU tests.
      const auto a = plain.parameters(), b = replica.parameters();
      for (size_t i = 0; i < a.size(); ++i) {
        const std::vector<double> u = host(a[i]), v = host(b[i]);
        double diff = 0, norm = 0;
        for (size_t k = 0; k < u.size(); ++k) {
          diff += (u[k] - v[k]) * (u[k] - v[k]);
          norm += u[k] * u[k];
        }
        INFO("step " << step << ", parameter " << i);
        CHECK(std::sqrt(diff / norm) <= 1e-5);
      }
    }
    CHECK(ddp.sync_stats().all_reduce_s > 0);
  }
}

// ---- two ranks, two GPUs ----

TEST_CASE("rank: NCCL collectives", "[.rank]") {
  dist::init_process_group({.backend = "nccl", .timeout = std::chrono::seconds(20)});
  const int rank = dist::get_rank(), world = dist::get_world_size();
  const Device gpu = Device::cuda(rank);
  for (DType dtype : {DType::f32, DType::bf16, DType::i64}) {
    Tensor t = exact(1000, rank, dtype).to(gpu);
    dist::all_reduce(t).wait();
    Tensor expected = zeros({1000}, {.dtype = DType::f64});
    for (int r = 0; r < world; ++r) expected.add_(exact(1000, r, dtype).to(DType::f64));
    REQUIRE(host(t) == testing::values(expected.to(dtype)));
    Tensor out = zeros({world * 1000}, {.dtype = dtype, .device = gpu});
    dist::all_gather(out, exact(1000, rank, dtype).to(gpu)).wait();
    for (int r = 0; r < world; ++r)
      REQUIRE(host(out.narrow(0, r * 1000, 1000)) == testing::values(exact(1000, r, dtype)));
  }
  dist::barrier().wait();
  if (std::getenv("KILN_TEST_KILL_LAST") != nullptr) {
    if (rank == world - 1) std::raise(SIGKILL);
    const auto start = std::chrono::steady_clock::now();
    Tensor t = ones({1 << 20}, {.device = gpu});
    REQUIRE_THROWS_WITH(
        dist::all_reduce(t).wait(),
        Catch::Contains("all_reduce(") && Catch::Contains("rank " + std::to_string(rank) + " of "));
    REQUIRE(std::chrono::steady_clock::now() - start < std::chrono::seconds(25));
    std::_Exit(0);  // the communicator is aborted; the process group cannot close cleanly
  }
  dist::destroy_process_group();
}

TEST_CASE("NCCL: collectives on 2 ranks equal their reference", "[nccl]") {
  KILN_SKIP_WITHOUT_NCCL(2);
  testing::require_ranks_pass(
      {.test_case = "rank: NCCL collectives", .world_size = 2, .limit_s = 120});
}

TEST_CASE("NCCL: a rank killed mid-job makes the other's collective fail within the timeout",
          "[nccl]") {
  KILN_SKIP_WITHOUT_NCCL(2);
  const std::vector<testing::RankExit> exits =
      testing::run_ranks({.test_case = "rank: NCCL collectives",
                          .world_size = 2,
                          .env = {{"KILN_TEST_KILL_LAST", "1"}},
                          .limit_s = 120});
  INFO("rank 0 said:\n" << exits[0].output);
  CHECK(exits[0].status == 0);
  CHECK(exits[1].signal == SIGKILL);
}

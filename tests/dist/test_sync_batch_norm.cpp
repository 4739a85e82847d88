// SyncBatchNorm on 2 and 3 processes against BatchNorm in one process with the whole batch
// (CPU tensors, Gloo), and on 2 GPUs through NCCL where a machine has them ([nccl]).
//
// Tolerances (f64): every rank's statistics are sums of at most 11 x 16 shifted terms,
// added in another order than batch_norm's kernels (and from the shifted one-pass moments
// rather than the kernel's own formula), and the gradients sum as many; any two orders
// are within summation_bound(176, 2^-53) ~ 4e-14 relative to the terms' magnitudes, which
// for unit-variance data stay within a few times the results: 1e-10 holds with a wide
// margin, and a statistic taken over one rank's shard alone misses it by 1e-2 or more.
// f32 (bf16 inputs are checked as f32 after rounding) is held to 1e-4, the same bound at
// 2^-24 (2e-5) with the variance's one-pass cancellation (|mean| < 1 here) on top.
#include <cmath>
#include <cstdlib>
#include <sstream>

#include "core/cuda.h"
#include "dist/data_parallel.h"
#include "dist/sync_batch_norm.h"
#include "rank_testing.h"
#include "testing.h"

using namespace kiln;

namespace {

// This rank's contiguous share of n samples (n = 7 over 3 ranks: 3, 2, 2).
std::pair<int64_t, int64_t> shard(int64_t n, int rank, int world) {
  const int64_t share = n / world + (rank < n % world ? 1 : 0);
  const int64_t start = rank * (n / world) + std::min<int64_t>(rank, n % world);
  return {start, share};
}

double max_relative(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = testing::values(a.to(Device::cpu())), y = testing::values(b.to(Device::cpu()));
  REQUIRE(x.size() == y.size());
  double diff = 0, norm = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    diff = std::max(diff, std::abs(x[i] - y[i]));
    norm = std::max(norm, std::abs(y[i]));
  }
  return diff / std::max(norm, 1e-300);
}

// One layer, three training steps and one eval step, on input of `shape` (N first), the
// layers and the data on `device` (a rank's own GPU for NCCL).
void check_layer(const Shape& shape, DType dtype, bool affine, int rank, int world, Device device = Device::cpu()) {
  INFO("input " << shape_str(shape) << " " << fmt::format("{}", dtype) << (affine ? " affine" : "") << " on "
                << fmt::format("{}", device));
  const double tol = dtype == DType::f64 ? 1e-10 : 1e-4;
  const int64_t channels = shape[1];
  nn::BatchNormOptions options{.momentum = 0.3, .affine = affine};
  std::shared_ptr<nn::BatchNormBase> reference, local;
  if (shape.size() == 4) {
    reference = std::make_shared<nn::BatchNorm2d>(channels, options);
  } else {
    reference = std::make_shared<nn::BatchNorm1d>(channels, options);
  }
  local = std::make_shared<dist::SyncBatchNorm>(channels, options);
  if (affine) {
    NoGradGuard no_grad;
    manual_seed(5);
    const Tensor w = randn({channels}), b = randn({channels});
    for (auto* m : {reference.get(), local.get()}) {
      m->weight().copy_(w);
      m->bias().copy_(b);
    }
  }
  reference->to(dtype);
  local->to(dtype);
  reference->to(device);
  local->to(device);
  for (int step = 0; step < 3; ++step) {
    INFO("step " << step);
    const int64_t n = step == 2 ? world + 1 : 7;  // the last batch short: some ranks get 1 sample
    Shape full = shape;
    full[0] = n;
    manual_seed(100 + step);
    // Mean 0.5 and scale 2 per channel: the shift by the running mean matters.
    const Tensor x = (randn(full) * 2 + 0.5).to(dtype).to(device), g = randn(full).to(dtype).to(device);
    const auto [start, share] = shard(n, rank, world);
    const Tensor xr = x.narrow(0, start, share).detach().requires_grad_(true);
    const Tensor xf = x.detach().requires_grad_(true);
    const Tensor y_ref = (*reference)(xf);
    sum(y_ref * g).backward();
    const Tensor y = (*local)(xr);
    sum(y * g.narrow(0, start, share)).backward();
    CHECK(y.dtype() == dtype);
    CHECK(max_relative(y, y_ref.narrow(0, start, share)) <= tol);
    CHECK(max_relative(xr.grad(), xf.grad().narrow(0, start, share)) <= tol);
    CHECK(max_relative(local->running_mean(), reference->running_mean()) <= tol);
    CHECK(max_relative(local->running_var(), reference->running_var()) <= tol);
    CHECK(local->num_batches_tracked().item<int64_t>() == step + 1);
    if (affine) {
      // The parameters' gradients are this rank's share; summed over ranks, the whole batch's.
      for (auto get : {&nn::BatchNormBase::weight, &nn::BatchNormBase::bias}) {
        Tensor gsum = ((*local).*get)().grad().clone();
        dist::all_reduce(gsum, dist::ReduceOp::sum).wait();
        CHECK(max_relative(gsum, ((*reference).*get)().grad()) <= tol);
        ((*local).*get)().set_grad(Tensor());
        ((*reference).*get)().set_grad(Tensor());
      }
    }
  }
  // Eval: the running statistics, no collective.
  local->eval();
  reference->eval();
  const int64_t before = dist::default_group().counts().all_reduce;
  manual_seed(9);
  Shape one = shape;
  one[0] = 2;
  const Tensor x = randn(one).to(dtype).to(device);
  CHECK(max_relative((*local)(x), (*reference)(x)) <= tol);
  CHECK(dist::default_group().counts().all_reduce == before);
}

}  // namespace

TEST_CASE("rank: sync batch norm", "[.rank]") {
  dist::init_process_group({.backend = "gloo", .timeout = std::chrono::seconds(30)});
  const int rank = dist::get_rank(), world = dist::get_world_size();
  check_layer({7, 3, 4, 4}, DType::f64, true, rank, world);
  check_layer({7, 3, 4, 4}, DType::f32, true, rank, world);
  check_layer({7, 5}, DType::f64, false, rank, world);
  check_layer({7, 2, 6}, DType::f64, true, rank, world);

  // One all-reduce per layer forward and one per layer backward.
  dist::SyncBatchNorm bn(3);
  const int64_t before = dist::default_group().counts().all_reduce;
  const Tensor x = randn({2, 3, 2, 2}).requires_grad_(true);
  sum(bn(x)).backward();
  CHECK(dist::default_group().counts().all_reduce - before == 2);
  CHECK_THAT(bn.str(), Catch::Matchers::Contains("sync over " + std::to_string(world) + " ranks"));

  // Traced by kiln::compile: refused, naming the layer.
  auto compiled = compiler::compile([&bn](const std::vector<Tensor>& a) -> std::vector<Tensor> { return {bn(a[0])}; });
  CHECK_THROWS_WITH(compiled({randn({2, 3, 2, 2})}), Catch::Matchers::Contains("SyncBatchNorm: cannot run under kiln::compile"));

  // convert_sync_batchnorm reaches the layers a model calls through its members.
  manual_seed(1);
  nn::Sequential model(nn::Conv2d(2, 4, 3, {.padding = 1}), nn::BatchNorm2d(4), nn::ReLU());
  CHECK(dist::convert_sync_batchnorm(model) == 1);
  const int64_t at = dist::default_group().counts().all_reduce;
  model(randn({2, 2, 4, 4}));
  CHECK(dist::default_group().counts().all_reduce - at == 1);
  dist::destroy_process_group();
}

TEST_CASE("SyncBatchNorm on 2 and 3 ranks equals BatchNorm over the whole batch", "[dist]") {
  for (int world : {2, 3}) {
    INFO(world << " ranks");
    testing::require_ranks_pass({.test_case = "rank: sync batch norm", .world_size = world});
  }
}

// The layer on CUDA tensors, each rank on its own GPU, the all-reduces through NCCL.
TEST_CASE("rank: sync batch norm on CUDA", "[.rank]") {
  dist::init_process_group({.backend = "nccl", .timeout = std::chrono::seconds(30)});
  const int rank = dist::get_rank(), world = dist::get_world_size();
  const Device gpu = Device::cuda(rank);
  check_layer({7, 3, 4, 4}, DType::f64, true, rank, world, gpu);
  check_layer({7, 3, 4, 4}, DType::f32, true, rank, world, gpu);
  check_layer({7, 5}, DType::f64, false, rank, world, gpu);
  dist::destroy_process_group();
}

TEST_CASE("SyncBatchNorm on CUDA on 2 ranks (2 GPUs, NCCL) equals BatchNorm over the whole batch", "[nccl]") {
  std::string why = dist::nccl_unavailable_reason();
  if (why.empty() && cuda::device_count() < 2)
    why = fmt::format("2 GPUs needed, {} visible", cuda::device_count());
  if (why.empty() && find_op("batch_norm").kernels[static_cast<size_t>(DeviceType::cuda)] == nullptr)
    why = "this kiln was built without cuDNN, so BatchNorm (the reference) has no CUDA kernel";
  if (!why.empty()) {
    WARN("skipped: " << why);
    return;
  }
  testing::require_ranks_pass({.test_case = "rank: sync batch norm on CUDA", .world_size = 2, .limit_s = 120});
}

TEST_CASE("SyncBatchNorm in a job of one rank, or with no process group, is BatchNorm", "[dist]") {
  manual_seed(3);
  const Tensor x = randn({4, 3, 2, 2}) * 3 + 1;
  nn::BatchNorm2d plain(3);
  dist::SyncBatchNorm synced(3);
  CHECK_THAT(synced.str(), Catch::Matchers::Contains("SyncBatchNorm(3"));
  KILN_CHECK_EQUAL(synced(x), plain(x));
  KILN_CHECK_EQUAL(synced.running_var(), plain.running_var());
}

// dist::sync_batch_norm through a group of one rank against kiln::batch_norm on the same
// device, forward and backward: on the CPU through Gloo (runs everywhere), on CUDA through
// NCCL ([nccl]: needs a GPU and a build with NCCL and cuDNN; elsewhere it says why it
// skips; `make gpu-check` runs it). One rank still takes every all-reduce of the layer
// through the backend: the statistics' sums on the device in the forward, their gradients
// in the backward.
//
// Tolerances: at world size 1 the all-reduce is the identity, so what differs is the
// arithmetic: sync_batch_norm sums n = N x spatial shifted terms (x - running_mean) with
// kiln's sum and takes the one-pass variance from them, batch_norm's kernels (the CPU's, or
// cuDNN's) their own order and formula; autograd's backward of the composed ops against
// the kernels' backward likewise. Any two orders of n terms differ by at most
// n * 2^-p relative to the sum of the terms' magnitudes (p = 24 in f32, 53 in f64): with
// n <= 128 here, 7.6e-6 in f32 and 1.4e-14 in f64, and the one-pass variance loses about
// E[d^2] / var = 1.06 more for data of mean 0.5 and scale 2 shifted by the running mean.
// The values compared are within a few times their maximum of those sums' scale, so 1e-4
// (f32) and 1e-10 (f64) of the largest hold with a wide margin, while normalizing by one
// wrong statistic (the biased variance, say: a factor sqrt(n / (n - 1)), 4e-3 at n = 128)
// fails them.
#include <chrono>
#include <cmath>
#include <optional>

#include "core/cuda.h"
#include "dist/process_group.h"
#include "dist/sync_batch_norm.h"
#include "testing.h"

using namespace kiln;

namespace {

std::vector<double> host(const Tensor& t) { return testing::values(t.to(Device::cpu())); }

// max |a - b| over max |b|.
double max_relative(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = host(a), y = host(b);
  REQUIRE(x.size() == y.size());
  double diff = 0, norm = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    diff = std::max(diff, std::abs(x[i] - y[i]));
    norm = std::max(norm, std::abs(y[i]));
  }
  return diff / std::max(norm, 1e-300);
}

// Three training steps of batch norm on `device` (the running statistics move, so the
// shift by the running mean matters), sync_batch_norm through `group` against batch_norm.
void check_against_batch_norm(dist::ProcessGroup& group, Device device, const Shape& shape,
                              DType dtype, bool affine, bool channels_last = false) {
  INFO("input " << shape_str(shape) << " " << fmt::format("{}", dtype) << " on "
                << fmt::format("{}", device) << (affine ? ", affine" : "")
                << (channels_last ? ", channels-last" : ""));
  const double tol = dtype == DType::f64 ? 1e-10 : 1e-4;
  const int64_t channels = shape[1];
  const TensorOptions on{.dtype = dtype, .device = device};
  manual_seed(5);
  const Tensor w0 = randn({channels}).to(dtype).to(device),
               b0 = randn({channels}).to(dtype).to(device);
  Tensor w_ref, b_ref, w, b;
  if (affine) {
    w_ref = w0.clone().requires_grad_(true);
    b_ref = b0.clone().requires_grad_(true);
    w = w0.clone().requires_grad_(true);
    b = b0.clone().requires_grad_(true);
  }
  Tensor mean_ref = zeros({channels}, on), var_ref = ones({channels}, on);
  Tensor mean = zeros({channels}, on), var = ones({channels}, on);
  const double momentum = 0.3, eps = 1e-5;
  for (int step = 0; step < 3; ++step) {
    INFO("step " << step);
    manual_seed(100 + step);
    // Mean 0.5 and scale 2 per channel, drawn on the CPU; the last batch of 2 samples.
    Shape full = shape;
    if (step == 2) full[0] = 2;
    Tensor x = (randn(full) * 2 + 0.5).to(dtype).to(device);
    if (channels_last) x = x.contiguous(MemoryFormat::channels_last);
    const Tensor g = randn(full).to(dtype).to(device);
    const Tensor x_ref = x.detach().requires_grad_(true), x_sync = x.detach().requires_grad_(true);

    const Tensor y_ref = batch_norm(x_ref, w_ref, b_ref, mean_ref, var_ref, true, momentum, eps);
    sum(y_ref * g).backward();
    const int64_t before = group.counts().all_reduce;
    const Tensor y = dist::sync_batch_norm(x_sync, w, b, mean, var, momentum, eps, group);
    sum(y * g).backward();
    // One all-reduce forward (the sums and the count), one backward (their gradients).
    CHECK(group.counts().all_reduce - before == 2);

    CHECK(y.device() == device);
    CHECK(y.dtype() == dtype);
    CHECK(max_relative(y, y_ref) <= tol);
    CHECK(max_relative(x_sync.grad(), x_ref.grad()) <= tol);
    CHECK(max_relative(mean, mean_ref) <= tol);
    CHECK(max_relative(var, var_ref) <= tol);
    if (affine) {
      CHECK(max_relative(w.grad(), w_ref.grad()) <= tol);
      CHECK(max_relative(b.grad(), b_ref.grad()) <= tol);
      for (const Tensor& p : {w, b, w_ref, b_ref}) p.set_grad(Tensor());
    }
  }
}

// The cases both devices run: BatchNorm2d's, BatchNorm1d's on [N, C] and on [N, C, L].
void check_cases(dist::ProcessGroup& group, Device device) {
  check_against_batch_norm(group, device, {8, 3, 4, 4}, DType::f32, true);
  check_against_batch_norm(group, device, {8, 3, 4, 4}, DType::f64, true);
  check_against_batch_norm(group, device, {8, 5}, DType::f64, false);
  check_against_batch_norm(group, device, {8, 2, 6}, DType::f32, true);
}

}  // namespace

TEST_CASE("sync_batch_norm through Gloo on one rank equals batch_norm on the CPU", "[dist]") {
  std::optional<dist::ProcessGroup> group;
  try {
    group.emplace(dist::ProcessGroupOptions{
        .backend = "gloo", .timeout = std::chrono::seconds(30), .rank = 0, .world_size = 1});
  } catch (const Error& e) {
    WARN("skipped: " << e.what());
    return;
  }
  check_cases(*group, Device::cpu());
  check_against_batch_norm(*group, Device::cpu(), {8, 3, 4, 4}, DType::f32, true,
                           /*channels_last=*/true);
  // A parameter that does not fit is named with both tensors, before any collective.
  const int64_t before = group->counts().all_reduce;
  CHECK_THROWS_WITH(dist::sync_batch_norm(ones({4, 3, 2, 2}), ones({4}), Tensor(), Tensor(),
                                          Tensor(), 0.1, 1e-5, *group),
                    Catch::Contains("SyncBatchNorm: weight f32[4] cpu does not fit input "
                                    "f32[4,3,2,2] cpu: expected [3] on cpu"));
  CHECK(group->counts().all_reduce == before);
}

TEST_CASE("sync_batch_norm through NCCL on one GPU equals batch_norm on CUDA", "[nccl]") {
  if (const std::string why = dist::nccl_unavailable_reason(); !why.empty()) {
    WARN("skipped: " << why);
    return;
  }
  if (find_op("batch_norm").kernels[static_cast<size_t>(DeviceType::cuda)] == nullptr) {
    WARN(
        "skipped: this kiln was built without cuDNN, so batch_norm (the reference) has no CUDA "
        "kernel");
    return;
  }
  dist::ProcessGroup group(
      {.backend = "nccl", .timeout = std::chrono::seconds(60), .rank = 0, .world_size = 1});
  REQUIRE(group.backend() == "nccl");
  check_cases(group, Device::cuda(0));
  // cuDNN takes channels-last input as it is (NHWC descriptors).
  check_against_batch_norm(group, Device::cuda(0), {8, 3, 4, 4}, DType::f32, true,
                           /*channels_last=*/true);
}

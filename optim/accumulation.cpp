#include "optim/accumulation.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <utility>

#include "core/error.h"
#include "core/ops/elementwise.h"

namespace kiln::optim {

Tensor MicroBatch::scale(const Tensor& loss) const {
  KILN_CHECK(loss.defined(), "MicroBatch::scale: the loss is undefined");
  KILN_CHECK(weight.defined(), "MicroBatch::scale: this micro-batch has no weight (not made by Accumulation::split)");
  // The weight is cast to the loss's dtype so that an f32 loss stays f32.
  return loss * weight.to(loss.dtype()).to(loss.device());
}

void MicroBatch::finish() const {
  if (!is_last || !last_step_callbacks) return;
  for (const std::function<void()>& fn : *last_step_callbacks) fn();
}

Accumulation::Accumulation(AccumulationOptions options)
    : options_(options), callbacks_(std::make_shared<std::vector<std::function<void()>>>()) {
  KILN_CHECK(options_.batch > 0, "Accumulation: batch must be positive, got batch={} micro_batch={}",
             options_.batch, options_.micro_batch);
  KILN_CHECK(options_.micro_batch > 0,
             "Accumulation: micro_batch must be positive, got batch={} micro_batch={}",
             options_.batch, options_.micro_batch);
}

std::vector<int64_t> Accumulation::sizes(int64_t n) const {
  KILN_CHECK(n > 0 && n <= options_.batch,
             "Accumulation::sizes: a global batch of {} samples; need 0 < n <= batch={}", n,
             options_.batch);
  std::vector<int64_t> out;
  for (int64_t start = 0; start < n; start += options_.micro_batch)
    out.push_back(std::min(options_.micro_batch, n - start));
  return out;
}

std::vector<MicroBatch> Accumulation::split(const Tensor& x, const Tensor& y) const {
  KILN_CHECK(x.defined() && x.dim() >= 1,
             "Accumulation::split: x must be a tensor with a batch dim, got {}",
             x.defined() ? shape_str(x.shape()) : std::string("an undefined tensor"));
  return split(x, y, sizes(x.size(0)));
}

std::vector<MicroBatch> Accumulation::split_shard(const Tensor& x, const Tensor& y, const GlobalBatch& global) const {
  KILN_CHECK(x.defined() && x.dim() >= 1,
             "Accumulation::split: x must be a tensor with a batch dim, got {}",
             x.defined() ? shape_str(x.shape()) : std::string("an undefined tensor"));
  KILN_CHECK(global.world_size >= 1 && global.samples >= x.size(0) && global.samples > 0,
             "Accumulation::split_shard: x {} holds {} samples of a global batch of {} over {} ranks; need world_size "
             ">= 1 and at least this rank's samples in the global batch",
             shape_str(x.shape()), x.size(0), global.samples, global.world_size);
  std::vector<MicroBatch> out = split(x, y, sizes(x.size(0)));
  for (MicroBatch& mb : out)
    mb.weight = scalar_tensor(static_cast<double>(mb.size) * static_cast<double>(global.world_size) /
                                  static_cast<double>(global.samples),
                              DType::f64, x.device());
  return out;
}

std::vector<MicroBatch> Accumulation::split(const Tensor& x, const Tensor& y,
                                            const std::vector<int64_t>& sizes) const {
  KILN_CHECK(x.defined() && x.dim() >= 1,
             "Accumulation::split: x must be a tensor with a batch dim, got {}",
             x.defined() ? shape_str(x.shape()) : std::string("an undefined tensor"));
  const int64_t n = x.size(0);
  if (y.defined()) {
    KILN_CHECK(y.dim() >= 1 && y.size(0) == n,
               "Accumulation::split: x {} ({}, {}) and y {} ({}, {}) need the same batch size "
               "along dim 0",
               shape_str(x.shape()), x.dtype(), x.device(), shape_str(y.shape()), y.dtype(),
               y.device());
  }
  KILN_CHECK(n > 0 && n <= options_.batch,
             "Accumulation::split: x {} holds {} samples; need 0 < n <= batch={}",
             shape_str(x.shape()), n, options_.batch);
  KILN_CHECK(!sizes.empty(), "Accumulation::split: no micro-batch sizes given for {} samples", n);
  int64_t total = 0;
  for (int64_t s : sizes) {
    KILN_CHECK(s > 0, "Accumulation::split: micro-batch sizes [{}] must be positive",
               fmt::join(sizes, ","));
    total += s;
  }
  KILN_CHECK(total == n,
             "Accumulation::split: micro-batch sizes [{}] add up to {}, but x {} holds {} samples",
             fmt::join(sizes, ","), total, shape_str(x.shape()), n);

  std::vector<MicroBatch> out;
  out.reserve(sizes.size());
  const int64_t count = static_cast<int64_t>(sizes.size());
  int64_t start = 0;
  for (int64_t i = 0; i < count; ++i) {
    const int64_t size = sizes[static_cast<size_t>(i)];
    MicroBatch mb;
    mb.x = x.narrow(0, start, size);
    if (y.defined()) mb.y = y.narrow(0, start, size);
    mb.weight = scalar_tensor(static_cast<double>(size) / static_cast<double>(n), DType::f64,
                              x.device());
    mb.index = i;
    mb.count = count;
    mb.start = start;
    mb.size = size;
    mb.is_last = i == count - 1;
    mb.last_step_callbacks = callbacks_;
    out.push_back(std::move(mb));
    start += size;
  }
  return out;
}

void Accumulation::on_last_micro_step(std::function<void()> fn) {
  KILN_CHECK(static_cast<bool>(fn), "Accumulation::on_last_micro_step: the callback is empty");
  callbacks_->push_back(std::move(fn));
}

MicroBatchChoice choose_micro_batch(int64_t batch, int64_t budget_bytes,
                                    const std::function<int64_t(int64_t)>& measure, int64_t smallest) {
  KILN_CHECK(batch > 0 && budget_bytes > 0, "choose_micro_batch: batch {} and budget {} bytes must be positive",
             batch, budget_bytes);
  KILN_CHECK(smallest > 0, "choose_micro_batch: smallest {} must be positive", smallest);
  MicroBatchChoice choice;
  for (int64_t b = std::min(smallest, batch);; b = std::min(b * 2, batch)) {
    const int64_t peak = measure(b);
    choice.measured.emplace_back(b, peak);
    if (peak > budget_bytes) break;
    choice.micro_batch = b;
    if (b == batch) break;
  }
  KILN_CHECK(choice.micro_batch > 0,
             "micro-batch auto: a step of {} needs {} bytes, more than the memory budget of {} bytes",
             choice.measured.front().first == 1 ? std::string("one sample")
                                                : fmt::format("{} samples", choice.measured.front().first),
             choice.measured.front().second, budget_bytes);
  return choice;
}

std::vector<int64_t> balanced_sizes(int64_t n, int64_t micro_batch) {
  KILN_CHECK(n > 0 && micro_batch > 0, "balanced_sizes: n {} and micro_batch {} must be positive", n, micro_batch);
  const int64_t k = (n + micro_batch - 1) / micro_batch;
  std::vector<int64_t> sizes(static_cast<size_t>(k), n / k);
  for (int64_t i = 0; i < n % k; ++i) ++sizes[static_cast<size_t>(i)];
  return sizes;
}

}  // namespace kiln::optim

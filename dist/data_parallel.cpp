#include "dist/data_parallel.h"

#include <fmt/format.h>

#include <chrono>

#include "core/error.h"
#include "core/grad_mode.h"
#include "core/ops/factory.h"
#include "core/registry.h"

namespace kiln::dist {
namespace {

ProcessGroup& group_of(const DataParallelOptions& options) {
  return options.group != nullptr ? *options.group : default_group();
}

}  // namespace

DistributedDataParallel::DistributedDataParallel(nn::Module& module, DataParallelOptions options)
    : module_(module), group_(group_of(options)), views_(options.gradient_as_bucket_view) {
  KILN_CHECK(options.bucket_cap_mb > 0, "DistributedDataParallel: bucket_cap_mb must be positive, got {}",
             options.bucket_cap_mb);
  std::vector<std::pair<std::string, Tensor>> named = module_.named_parameters();
  if (!named.empty()) device_ = named.front().second.device();
  for (const auto& [name, p] : named) {
    KILN_CHECK(p.device() == device_,
               "DistributedDataParallel: parameter {} is {} on {}, but {} is on {}; a replica lives on one device",
               name, p.meta_str(), p.device(), named.front().first, device_);
    KILN_CHECK(is_floating(p.dtype()), "DistributedDataParallel: parameter {} is {}, not floating", name,
               p.meta_str());
  }

  // Rank 0's values everywhere: one broadcast per tensor, all in flight, then waited.
  {
    NoGradGuard no_grad;
    std::vector<std::pair<Tensor, Tensor>> copies;  // (target, contiguous buffer broadcast)
    std::vector<Work> works;
    auto send = [&](const Tensor& t) {
      if (t.numel() == 0) return;
      Tensor buffer = t.is_contiguous() ? t.detach() : t.contiguous().detach();
      if (!buffer.same(t)) copies.emplace_back(t, buffer);
      works.push_back(group_.broadcast(buffer, 0));
    };
    for (const auto& [name, p] : named) send(p);
    if (options.broadcast_buffers)
      for (const Tensor& b : module_.buffers()) send(b);
    for (const Work& w : works) w.wait();
    for (auto& [target, buffer] : copies) target.detach().copy_(buffer);
  }

  // Slots in reverse order of registration (roughly the order backward makes gradients);
  // frozen parameters take no part.
  for (size_t k = named.size(); k-- > 0;) {
    if (!named[k].second.requires_grad()) continue;
    Slot slot;
    slot.param = named[k].second;
    slot.name = named[k].first;
    slots_.push_back(std::move(slot));
  }
  cap_bytes_ = options.bucket_cap_mb * 1024 * 1024;
  std::vector<size_t> order(slots_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  assign_buckets(order);
  for (size_t i = 0; i < slots_.size(); ++i)
    slots_[i].hook = slots_[i].param.register_post_accumulate_grad_hook([this, i](const Tensor&) { on_gradient(i); });
}

void DistributedDataParallel::assign_buckets(const std::vector<size_t>& order) {
  buckets_.clear();
  std::vector<int64_t> bucket_elements;
  double bucket_bytes = 0;
  for (size_t i : order) {
    Slot& slot = slots_[i];
    const double bytes = static_cast<double>(slot.param.numel()) * static_cast<double>(slot.param.itemsize());
    const bool fits = !buckets_.empty() && bucket_bytes + bytes <= cap_bytes_ &&
                      slots_[buckets_.back().slots.front()].param.dtype() == slot.param.dtype();
    if (!fits) {
      buckets_.emplace_back();
      bucket_elements.push_back(0);
      bucket_bytes = 0;
    }
    slot.bucket = buckets_.size() - 1;
    slot.offset = bucket_elements.back();
    bucket_elements.back() += slot.param.numel();
    bucket_bytes += bytes;
    buckets_.back().slots.push_back(i);
  }
  for (size_t b = 0; b < buckets_.size(); ++b)
    buckets_[b].flat =
        zeros({bucket_elements[b]}, {.dtype = slots_[buckets_[b].slots.front()].param.dtype(), .device = device_});
  if (!views_) return;
  // Gradients as views: a gradient that exists moves into its place in the new bucket.
  NoGradGuard no_grad;
  for (size_t i = 0; i < slots_.size(); ++i) {
    const Tensor grad = slots_[i].param.grad();
    if (!grad.defined()) continue;
    Tensor place = bucket_view(i);
    place.copy_(grad);
    slots_[i].param.set_grad(place);
  }
}

Tensor DistributedDataParallel::bucket_view(size_t i) const {
  const Slot& slot = slots_[i];
  return buckets_[slot.bucket].flat.narrow(0, slot.offset, slot.param.numel()).view(slot.param.shape());
}

bool DistributedDataParallel::is_bucket_view(size_t i, const Tensor& grad) const {
  const Slot& slot = slots_[i];
  const Tensor& flat = buckets_[slot.bucket].flat;
  return grad.defined() && grad.is_contiguous() && grad.shape() == slot.param.shape() &&
         grad.data_ptr() == static_cast<const char*>(flat.data_ptr()) + slot.offset * flat.itemsize();
}

// After the first synchronized step: buckets in the order the gradients really became
// ready (rank 0's, broadcast, so that every rank starts its buckets in the same order).
void DistributedDataParallel::rebuild_buckets() {
  rebuilt_ = true;
  std::vector<int64_t> order;
  std::vector<bool> seen(slots_.size(), false);
  for (size_t i : ready_order_) {
    order.push_back(static_cast<int64_t>(i));
    seen[i] = true;
  }
  for (const Bucket& b : buckets_)
    for (size_t i : b.slots)
      if (!seen[i]) order.push_back(static_cast<int64_t>(i));
  ready_order_.clear();
  Tensor shared = from_vector<int64_t>(order, {static_cast<int64_t>(order.size())});
  if (!device_.is_cpu()) {
    Tensor on_device = shared.to(device_);  // the group's transport for the parameters' device
    group_.broadcast(on_device, 0).wait();
    shared = on_device.to(Device::cpu());
  } else {
    group_.broadcast(shared, 0).wait();
  }
  const int64_t* p = shared.data_ptr<int64_t>();
  std::vector<size_t> agreed(p, p + order.size());
  assign_buckets(agreed);
}

DistributedDataParallel::~DistributedDataParallel() {
  for (Slot& s : slots_) s.param.remove_hook(s.hook);
  for (Bucket& b : buckets_) {
    if (!b.started) continue;
    try {
      b.work.wait();  // the worker still writes into the bucket
    } catch (const Error&) {
    }
  }
}

DistributedDataParallel::NoSync::NoSync(DistributedDataParallel& ddp, bool active)
    : ddp_(ddp), previous_(ddp.sync_enabled_) {
  if (active) ddp_.sync_enabled_ = false;
}

DistributedDataParallel::NoSync::~NoSync() { ddp_.sync_enabled_ = previous_; }

void DistributedDataParallel::on_gradient(size_t i) {
  // A tracer records this backward (kiln::compile): the program it makes would not hold
  // the all-reduce, so the step is synced by finish_sync after it instead.
  if (!sync_enabled_ || op_hook_installed()) return;
  std::lock_guard lock(mutex_);
  if (!round_open_) {
    round_open_ = true;
    hooks_synced_ = false;
  }
  Slot& slot = slots_[i];
  KILN_CHECK(!slot.ready,
             "DistributedDataParallel: parameter {} got a second gradient in one synchronized step; run the backward "
             "passes before the last one under no_sync(), and when some parameters get no gradient in a step "
             "(unused layers) call finish_sync() after backward (attach() does it on the last micro-step)",
             slot.name);
  copy_in(i);
  if (!rebuilt_) ready_order_.push_back(i);
  start_ready_buckets();
  if (next_bucket_ == buckets_.size()) {
    complete_round();
    hooks_synced_ = true;
  }
}

void DistributedDataParallel::copy_in(size_t i) {
  Slot& slot = slots_[i];
  Bucket& bucket = buckets_[slot.bucket];
  NoGradGuard no_grad;
  Tensor place = bucket_view(i);
  const Tensor grad = slot.param.grad();
  if (!grad.defined()) {
    place.zero_();  // no gradient on this rank: it adds nothing to the sum
  } else if (!views_ || !is_bucket_view(i, grad)) {
    place.copy_(grad);
    ++stats_.gradients_copied_in;
  }
  // Gradients as views: from now on backward accumulates into the bucket itself (until
  // zero_grad sets the gradient to none, or something replaces it).
  if (views_ && !is_bucket_view(i, grad)) slot.param.set_grad(place);
  slot.ready = true;
  ++bucket.ready;
}

void DistributedDataParallel::start_ready_buckets() {
  while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].ready == buckets_[next_bucket_].slots.size()) {
    Bucket& bucket = buckets_[next_bucket_++];
    bucket.work = group_.all_reduce(bucket.flat, ReduceOp::avg);
    bucket.started = true;
  }
}

void DistributedDataParallel::complete_round() {
  for (size_t i = 0; i < slots_.size(); ++i)
    if (!slots_[i].ready) copy_in(i);
  start_ready_buckets();
  std::string error;
  const auto waiting = std::chrono::steady_clock::now();
  for (Bucket& bucket : buckets_) {
    try {
      bucket.work.wait();
    } catch (const Error& e) {
      if (error.empty()) error = e.what();
    }
    stats_.all_reduce_s += bucket.work.seconds();
    bucket.started = false;
    bucket.ready = 0;
  }
  stats_.exposed_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - waiting).count();
  ++stats_.steps;
  for (Slot& slot : slots_) slot.ready = false;
  next_bucket_ = 0;
  round_open_ = false;
  if (!error.empty()) fail("DistributedDataParallel: syncing the gradients failed: {}", error);
  NoGradGuard no_grad;
  for (size_t i = 0; i < slots_.size(); ++i) {
    Slot& slot = slots_[i];
    const Tensor grad = slot.param.grad();
    if (views_ && is_bucket_view(i, grad)) continue;  // the all-reduce wrote it in place
    const Tensor average = bucket_view(i);
    if (grad.defined()) grad.detach().copy_(average);
    else slot.param.set_grad(average.clone());
    ++stats_.gradients_copied_out;
  }
  if (!rebuilt_) rebuild_buckets();
}

void DistributedDataParallel::finish_sync() {
  std::lock_guard lock(mutex_);
  if (hooks_synced_ && !round_open_) {
    hooks_synced_ = false;  // backward already synced this step
    return;
  }
  complete_round();
  hooks_synced_ = false;
}

void DistributedDataParallel::attach(optim::Accumulation& acc) {
  acc.on_last_micro_step([this] { finish_sync(); });
}

std::vector<std::vector<std::string>> DistributedDataParallel::bucket_names() const {
  std::vector<std::vector<std::string>> out;
  for (const Bucket& b : buckets_) {
    out.emplace_back();
    for (size_t i : b.slots) out.back().push_back(slots_[i].name);
  }
  return out;
}

int64_t DistributedDataParallel::global_samples(int64_t local_samples) {
  Tensor count = full({1}, local_samples, {.dtype = DType::i64, .device = device_});
  group_.all_reduce(count).wait();
  return count.to(Device::cpu()).item<int64_t>();
}

}  // namespace kiln::dist

#pragma once
// Data-parallel training: every rank holds a replica of the model, runs forward and
// backward on its shard of each global batch, and the gradients are averaged over the
// ranks before the optimizer steps, so every replica takes the same step.
//
//   dist::init_process_group({.backend = "gloo"});
//   models::MLP model({16, 64, 4});
//   dist::DistributedDataParallel ddp(model);        // rank 0's parameters and buffers everywhere
//   optim::SGD opt(model.parameters(), {.lr = 0.1});
//   optim::Accumulation acc({.batch = 32, .micro_batch = 8});
//   ddp.attach(acc);                                 // mb.finish() on the last micro-step waits
//   for (...) {                                      // x, y: this rank's shard of N samples
//     for (const optim::MicroBatch& mb : acc.split_shard(x, y, {.samples = N, .world_size = W})) {
//       auto sync = ddp.no_sync(!mb.is_last);        // all-reduce on the last micro-step only
//       mb.scale(mse_loss(model(mb.x), mb.y)).backward();
//       mb.finish();
//     }
//     opt.step();
//     opt.zero_grad();
//   }
//
// Buckets: the parameters, in reverse order of registration (roughly the order backward
// produces their gradients), are packed into flat buckets of at most bucket_cap_mb MiB
// (one dtype each); after the first synchronized step they are packed again in the order
// the gradients really came (rank 0's, broadcast once). A post-accumulate hook on every parameter copies its gradient into its
// bucket; the moment a bucket's last gradient is in, its all-reduce (avg) starts on the
// group's worker thread while backward goes on. Buckets start in index order on every rank.
// When the last bucket has started the hook waits for all of them and writes the averages
// back into the .grad tensors, so `loss.backward()` returns with synchronized gradients.
//
// finish_sync() completes what the hooks did not: buckets whose parameters got no gradient
// (they count as zeros), and whole steps the hooks never saw, which is what happens to a
// step compiled by kiln::compile (a replayed program runs no hooks; while it is traced the
// hooks hold back). There every bucket is copied, all-reduced and copied back after the
// step: correct, but nothing overlaps the backward (the cost is the whole all-reduce time
// plus two copies of the gradients per step). attach() makes Accumulation's last
// micro-step call it.
//
// Devices: the replica's parameters all on the CPU (a gloo or auto group) or all on one
// CUDA device (nccl or auto; NCCL all-reduces the buckets on the group's stream, after the
// kiln stream's copies into them).
//
// Gradients as views (gradient_as_bucket_view, as PyTorch's): each parameter's .grad is a
// view into its bucket, so backward accumulates straight into the bucket and the
// all-reduce averages the gradients in place: no copy in, no copy out. A gradient that is
// not such a view when its hook runs (the first backward, or every step after
// zero_grad(set_to_none = true), which drops the views: backward then makes a fresh .grad)
// is copied into the bucket once and .grad re-pointed at its view; with
// zero_grad(set_to_none = false) the views stay and a step copies nothing. Values are the
// copying path's, bit for bit. Keep no reference to an old .grad across steps.
// Batch norm over every rank's batch: dist/sync_batch_norm.h. Frozen parameters
// (requires_grad false) take no part.
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "dist/process_group.h"
#include "models/module.h"
#include "optim/accumulation.h"

namespace kiln::dist {

// Where a step's gradient sync went, summed over the steps since the last reset.
struct SyncStats {
  int64_t steps = 0;         // synchronized steps
  double all_reduce_s = 0;   // the buckets' all-reduces, as long as each ran on the group's worker
  double exposed_s = 0;      // time the training thread waited for them: what did not overlap
  int64_t gradients_copied_in = 0;   // gradients copied into a bucket (none with views kept)
  int64_t gradients_copied_out = 0;  // averages copied back into .grad (none with views)
};

struct DataParallelOptions {
  double bucket_cap_mb = 25;      // a bucket's gradients take at most this many MiB (one parameter may exceed it)
  bool broadcast_buffers = true;  // copy rank 0's buffers (running statistics) at construction too
  ProcessGroup* group = nullptr;  // the default group when null
  bool gradient_as_bucket_view = false;  // .grad tensors are views into the buckets (no copies)
};

class DistributedDataParallel {
 public:
  // Broadcasts rank 0's parameters (and buffers) into every rank's module, then registers
  // the gradient hooks. The module must outlive this object; every rank must construct it
  // with the same parameters in the same order.
  explicit DistributedDataParallel(nn::Module& module, DataParallelOptions options = {});
  ~DistributedDataParallel();
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  Tensor forward(const Tensor& x) { return module_.forward(x); }
  Tensor operator()(const Tensor& x) { return module_.forward(x); }
  nn::Module& module() { return module_; }
  ProcessGroup& group() { return group_; }

  // While the returned guard lives (and `active`), backward passes only accumulate into
  // .grad: no all-reduce (accumulation micro-steps other than the last).
  class NoSync {
   public:
    NoSync(DistributedDataParallel& ddp, bool active);
    ~NoSync();
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    DistributedDataParallel& ddp_;
    bool previous_;
  };
  NoSync no_sync(bool active = true) { return NoSync(*this, active); }

  // Waits for this step's buckets, all-reducing those the hooks did not start, and writes
  // the averaged gradients back. A no-op right after hooks synchronized a whole step.
  void finish_sync();
  // Makes acc's last micro-step (MicroBatch::finish) call finish_sync.
  void attach(optim::Accumulation& acc);

  int64_t bucket_count() const { return static_cast<int64_t>(buckets_.size()); }
  // The sync's time since construction or the last reset_sync_stats().
  SyncStats sync_stats() const { return stats_; }
  void reset_sync_stats() { stats_ = {}; }
  // The parameter names of each bucket, in bucket order (the order gradients came in the
  // first synchronized step, once it ran).
  std::vector<std::vector<std::string>> bucket_names() const;
  // The sum of every rank's local_samples (an all-reduce): a global batch's N.
  int64_t global_samples(int64_t local_samples);

 private:
  struct Slot {
    Tensor param;
    std::string name;
    size_t bucket = 0;
    int64_t offset = 0;  // in elements, within the bucket
    int hook = 0;
    bool ready = false;  // its gradient is in the bucket this round
  };
  struct Bucket {
    Tensor flat;  // 1-d, the bucket's dtype
    std::vector<size_t> slots;
    size_t ready = 0;
    Work work;
    bool started = false;
  };

  void assign_buckets(const std::vector<size_t>& order);
  Tensor bucket_view(size_t slot) const;  // the slot's place in its bucket, shaped as the parameter
  bool is_bucket_view(size_t slot, const Tensor& grad) const;
  void rebuild_buckets();
  void on_gradient(size_t slot);
  void copy_in(size_t slot);
  void start_ready_buckets();
  void complete_round();

  nn::Module& module_;
  ProcessGroup& group_;
  bool views_ = false;  // gradient_as_bucket_view
  Device device_ = Device::cpu();  // the parameters'
  std::vector<Slot> slots_;
  std::vector<Bucket> buckets_;
  double cap_bytes_ = 0;
  std::vector<size_t> ready_order_;  // the slots in the order the first step's hooks saw them
  bool rebuilt_ = false;             // the buckets follow that order (after the first sync)
  size_t next_bucket_ = 0;      // buckets start in order: the next to start
  bool round_open_ = false;     // a hook saw a gradient since the last sync
  bool hooks_synced_ = false;   // the hooks completed a round that finish_sync has not seen
  bool sync_enabled_ = true;
  SyncStats stats_;
  std::recursive_mutex mutex_;
};

}  // namespace kiln::dist

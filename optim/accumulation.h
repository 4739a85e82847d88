#pragma once
// Exact gradient accumulation: a global batch of n samples is cut into micro-batches that
// are run one after the other, each adding its gradient into the parameters' .grad, and
// the optimizer steps once after the last one.
//
//   optim::Accumulation acc({.batch = 64, .micro_batch = 16});
//   model.zero_grad();
//   for (const optim::MicroBatch& mb : acc.split(x, y)) {
//     Tensor loss = mse_loss(model(mb.x), mb.y);   // mean over the micro-batch
//     mb.scale(loss).backward();                   // loss * mb.weight
//     mb.finish();                                 // runs on_last_micro_step hooks when last
//   }
//   optimizer.step();
//
// Why the weight is (micro-batch size) / n and not 1 / k: the full batch's mean loss is
// (1/n) sum_i l_i = sum_j (n_j / n) * mean_j, where mean_j is micro-batch j's mean loss
// and n_j its size. Dividing every mean_j by k instead is only right when all n_j are
// equal. With n = 10 and micro-batches of 4, the pieces are 4, 4 and 2: 1/k = 1/3 gives
// each of the last two samples weight 1/6 and the others 1/12, where every sample should
// get 1/10. The last, shorter global batch of an epoch (n < batch) and explicit uneven
// sizes hit this too, so the weights always use the n of the batch actually given.
//
// The weight is a 0-d f64 tensor rather than a double so that a compiled training step can
// take it as an input: one traced step serves every micro-batch size.
//
// What is NOT exact: layers whose forward mixes samples of a batch. Batch norm in train
// mode normalizes with the micro-batch's mean and variance, not the global batch's, so
// the accumulated gradient differs from the full batch's (and the running statistics are
// updated once per micro-step, with micro-batch statistics). The difference is small when
// micro-batches are large and alike; it is not zero. Losses whose "mean" divides by
// something other than the sample count (cross entropy with class weights or ignored
// targets) are likewise only exact when that divisor is proportional to the sample count.
//
// Data parallel (kiln::dist::DistributedDataParallel): W ranks each hold n_r of a global
// batch's N samples, and the gradients are averaged over the W ranks. split_shard with
// GlobalBatch{.samples = N, .world_size = W} and the weights are W * size / N, so the
// average (1/W) sum_r sum_j (W n_rj / N) mean_rj is again the whole global batch's mean,
// even when the n_r differ (the last, short global batch of an epoch). Weights of
// size / n_r would be exact only when every rank holds as many samples.
//
// Data-parallel hook: MicroBatch::is_last marks the micro-step after which the gradients
// of this global batch are complete, where a data-parallel trainer all-reduces them.
// Callbacks registered with on_last_micro_step run when finish() is called on that
// micro-batch, once per global batch; finish() on the others does nothing.
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace kiln::optim {

struct AccumulationOptions {
  int64_t batch = 0;        // the nominal global batch size B (> 0); a given batch may be shorter
  int64_t micro_batch = 0;  // the micro-batch size b (> 0); the last piece may be shorter
};

// One slice of a global batch; x and y are views (narrow along dim 0) of the batch given.
struct MicroBatch {
  Tensor x;
  Tensor y;             // undefined when split was given an undefined y
  Tensor weight;        // 0-d f64: size / n, where n is the global batch's sample count
  int64_t index = 0;    // position among the micro-batches, from 0
  int64_t count = 0;    // number of micro-batches of this global batch
  int64_t start = 0;    // first sample's index in the global batch
  int64_t size = 0;     // number of samples
  bool is_last = false;  // the last micro-batch of the global batch

  // loss * weight in loss's dtype: the term whose gradient this micro-step accumulates.
  Tensor scale(const Tensor& loss) const;
  // Runs the on_last_micro_step callbacks (in registration order) when is_last; a no-op
  // otherwise. Call it after this micro-step's backward.
  void finish() const;

  // The callbacks of the Accumulation that made this micro-batch (shared, so a MicroBatch
  // stays usable after its Accumulation is gone).
  std::shared_ptr<const std::vector<std::function<void()>>> last_step_callbacks;
};

// This rank's place in a data-parallel global batch (see the comment at the top).
struct GlobalBatch {
  int64_t samples = 0;     // N: the global batch's samples over all ranks (>= this rank's)
  int64_t world_size = 1;  // W: the ranks whose gradients are averaged
};

// Splits global batches into weighted micro-batches whose summed gradient is exactly the
// gradient of the global batch's mean loss (see the comment at the top of this file).
class Accumulation {
 public:
  // Throws kiln::Error unless batch > 0 and micro_batch > 0.
  explicit Accumulation(AccumulationOptions options);

  const AccumulationOptions& options() const { return options_; }

  // The micro-batch sizes for a global batch of n samples (0 < n <= batch): micro_batch
  // repeated, the last one shorter when micro_batch does not divide n; ceil(n / b) sizes.
  std::vector<int64_t> sizes(int64_t n) const;
  // The number of micro-steps for a global batch of n samples: ceil(n / micro_batch).
  int64_t steps(int64_t n) const { return static_cast<int64_t>(sizes(n).size()); }

  // Cuts x (and y, when defined) along dim 0 into micro-batches of sizes(n), n = x.size(0).
  std::vector<MicroBatch> split(const Tensor& x, const Tensor& y) const;
  // The same with explicit sizes, each > 0, adding up to x.size(0) (at most batch).
  std::vector<MicroBatch> split(const Tensor& x, const Tensor& y,
                                const std::vector<int64_t>& sizes) const;
  // Data parallel: x and y hold this rank's shard of a global batch, cut into sizes(n);
  // weights are global.world_size * size / global.samples.
  std::vector<MicroBatch> split_shard(const Tensor& x, const Tensor& y, const GlobalBatch& global) const;

  // Registers fn to run when finish() is called on the last micro-batch of a global batch
  // (the place to all-reduce gradients). Micro-batches share this Accumulation's list, so
  // fn also runs for micro-batches split before this call whose finish() comes later.
  void on_last_micro_step(std::function<void()> fn);

 private:
  AccumulationOptions options_;
  std::shared_ptr<std::vector<std::function<void()>>> callbacks_;
};

// `--micro-batch auto`: the largest micro-batch whose step fits in budget_bytes. Runs
// measure(b) (one real forward and backward of b samples, returning the peak bytes it
// allocated) for b = smallest, 2 * smallest, ... below batch and then batch itself, and
// stops at the first b that does not fit. Sizes are tried in increasing order and the
// answer is the last that fit, so a larger budget never gives a smaller micro-batch.
// Throws kiln::Error when even `smallest` samples do not fit. (Models with batch norm
// pass smallest = 2: in training mode it needs more than one value per channel.)
struct MicroBatchChoice {
  int64_t micro_batch = 0;
  std::vector<std::pair<int64_t, int64_t>> measured;  // (micro-batch, peak bytes), in the order tried
};
MicroBatchChoice choose_micro_batch(int64_t batch, int64_t budget_bytes,
                                    const std::function<int64_t(int64_t)>& measure, int64_t smallest = 1);
// The sizes of k = ceil(n / micro_batch) micro-batches as even as possible (they differ by
// at most one), e.g. 9 by 4 -> {3, 3, 3} where sizes() gives {4, 4, 1}: as exact, and no
// micro-batch of one sample for batch norm to reject when n >= 2 * k.
std::vector<int64_t> balanced_sizes(int64_t n, int64_t micro_batch);

}  // namespace kiln::optim

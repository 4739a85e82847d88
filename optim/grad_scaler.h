#pragma once
// Dynamic loss scaling for mixed-precision training, as torch.amp.GradScaler: the loss is
// multiplied by a scale before backward so that small f16 gradients do not flush to zero,
// the gradients are divided by it again before the optimizer uses them, and a step whose
// gradients overflowed is skipped and the scale backed off.
//
//   optim::GradScaler scaler;                    // init scale 2^16, growth 2 every 2000
//   for (...) {                                  //   clean steps, backoff 0.5
//     { autocast amp({.device_type = DeviceType::cuda}); loss = ...; }
//     scaler.scale(loss).backward();             // every micro-step of an accumulation
//     scaler.unscale_(opt);                      // optional: before clipping
//     optim::clip_grad_norm_(params, 1.0);
//     scaler.step(opt);                          // skipped when a gradient is inf or NaN
//     scaler.update();
//     opt.zero_grad();
//   }
//
// Nothing here reads a value back on the host: the scale, the growth tracker and each
// optimizer's found_inf are 0-d tensors on the gradients' device; the check and the
// unscale are one multi-tensor op (amp_unscale_, core/ops/amp_ops.h); the optimizers' update
// kernels read found_inf themselves (Optimizer::step(found_inf)); the new scale is computed
// by amp_update_scale_. So a traced step with scaling holds for every outcome (overflow or
// not) and a CUDA step does not wait for the GPU. (AdamW's step counts of CUDA parameters
// are the one exception: they live on the host, see Optimizer::step.)
//
// Differences from PyTorch: one device per optimizer (gradients on several devices are an
// error); a skipped first SGD step makes the momentum buffers (see optim/sgd.cpp).
#include <cstdint>
#include <map>
#include <string>

#include "core/tensor.h"
#include "optim/optimizer.h"

namespace kiln::optim {

struct GradScalerOptions {
  double init_scale = 65536.0;  // 2^16
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;  // clean steps between growths
  bool enabled = true;             // disabled: scale() returns the loss, step() steps, update() does nothing
  // Where the scale is made (at construction); scale() moves it to the loss's device when
  // that differs. A compiled step must find it in place: give the training device.
  Device device = Device::cpu();
};

class GradScaler {
 public:
  explicit GradScaler(GradScalerOptions options = {});

  bool is_enabled() const { return options_.enabled; }

  // loss * scale, in the loss's dtype (computed in f32).
  Tensor scale(const Tensor& loss);

  // Divides the gradients of opt's parameters by the scale, in place, and records whether any
  // was infinite or NaN. Once per optimizer between update()s; step() calls it when the
  // caller has not. f16 parameters are an error (their gradients would lose what the scale
  // kept: keep f32 master weights, as autocast does).
  void unscale_(Optimizer& opt);

  // opt.step(found_inf): unscales first unless unscale_ ran; a step whose gradients held an
  // infinity or a NaN leaves parameters, optimizer state and step counts as they were.
  void step(Optimizer& opt);

  // After the step(s) of an iteration: backs the scale off (times backoff_factor) when any
  // optimizer found an infinity or a NaN, grows it (times growth_factor) after
  // growth_interval clean steps in a row, and readies every optimizer for the next
  // iteration.
  void update();
  // Sets the scale to new_scale instead (the growth tracker is left as it is).
  void update(double new_scale);

  // The current scale (read on the host); 1 when disabled.
  double get_scale() const;
  // The scale tensor itself (undefined when disabled).
  const Tensor& scale_tensor() const { return scale_; }
  // Clean steps since the scale last changed.
  int64_t growth_tracker() const;

  // {"scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker"} as
  // PyTorch names them (0-d CPU tensors); empty when disabled.
  std::map<std::string, Tensor> state_dict() const;
  // Restores what state_dict gave; an empty dict (from a disabled scaler) or a missing key
  // is an error. Does nothing when disabled.
  void load_state_dict(const std::map<std::string, Tensor>& dict);

 private:
  enum class Stage : uint8_t { ready, unscaled, stepped };
  struct PerOptimizer {
    Stage stage = Stage::ready;
    bool checked = false;  // unscale_ saw gradients this iteration
    // 0-d f32 on the gradients' device, set by unscale_. Kept across iterations and zeroed
    // in place, so that a compiled step updates a tensor it did not make.
    Tensor found_inf;
  };

  void place(const Device& device);
  // Every optimizer back to the start of an iteration (their found_inf tensors are kept).
  void ready_all();

  GradScalerOptions options_;
  Tensor scale_;           // 0-d f32
  Tensor growth_tracker_;  // 0-d i32, on scale_'s device
  std::map<const Optimizer*, PerOptimizer> per_optimizer_;
};

}  // namespace kiln::optim

#pragma once
// The loss scaler's ops (optim/grad_scaler.h), as registry ops so that a traced training
// step records them and the work stays on the tensors' device: nothing is read back on the
// host. They are PyTorch's _amp_foreach_non_finite_check_and_unscale_ and
// _amp_update_scale_.
//
//   amp_unscale_(grad x N, found_inf, inv_scale) {count}: multiplies every gradient by
//       inv_scale in place (in f32 for f16/bf16 gradients, rounded once) and sets found_inf
//       to 1 when any gradient held an infinity or a NaN; found_inf is otherwise left as it
//       was, so calls for several groups accumulate into one flag.
//   amp_unscale(same inputs) -> (new grad x N, new found_inf)
//   amp_update_scale_(scale, growth_tracker, found_inf) {growth_factor, backoff_factor,
//       growth_interval}: with found_inf set, scale *= backoff_factor and the tracker
//       restarts at 0; otherwise the tracker counts one more clean step, and when it reaches
//       growth_interval, scale *= growth_factor (kept only when the result is finite) and
//       the tracker restarts.
//   amp_update_scale(same inputs) -> (new scale, new growth_tracker)
//
// Gradients are floating tensors on one device; found_inf, inv_scale and scale are 0-d f32
// tensors and growth_tracker a 0-d i32 tensor on that device.
#include <span>
#include <vector>

#include "core/tensor.h"

namespace kiln {

// Records no autograd graph.
void amp_unscale_(std::span<const Tensor> grads, const Tensor& found_inf, const Tensor& inv_scale);
struct AmpUnscaled {
  std::vector<Tensor> grads;
  Tensor found_inf;
};
AmpUnscaled amp_unscale(std::span<const Tensor> grads, const Tensor& found_inf, const Tensor& inv_scale);

struct AmpScaleUpdate {
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
};
void amp_update_scale_(const Tensor& scale, const Tensor& growth_tracker, const Tensor& found_inf,
                       const AmpScaleUpdate& update);
struct AmpScaleState {
  Tensor scale, growth_tracker;
};
AmpScaleState amp_update_scale(const Tensor& scale, const Tensor& growth_tracker, const Tensor& found_inf,
                               const AmpScaleUpdate& update);

}  // namespace kiln

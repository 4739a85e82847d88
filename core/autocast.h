#pragma once
// Autocast (mixed precision), as torch.autocast: inside a `kiln::autocast` scope, an op
// called on tensors of the scope's device type first casts its floating inputs as its
// registry entry's cast_policy says (core/registry.h): `lower` to the scope's dtype (bf16
// on the CPU, f16 on CUDA by default), `f32` to f32, `promote` to the widest floating dtype
// among them; `none` leaves them. f64 inputs are left alone, as PyTorch leaves them. The
// casts are ordinary `cast` op calls, so autograd records them (parameters and their .grad
// stay f32: master weights) and the compiler's tracer sees them. A parameter (a leaf that
// requires grad) is cast once per outermost scope and per version of its storage: an
// optimizer step, which writes it in place, makes the next use cast it again. Scopes are
// per thread and nest; {.enabled = false} switches autocast off inside one. Calls that
// write into a given tensor (add_, copy_) are not cast, and nor are the ops a kernel calls.
//
//   { kiln::autocast amp({.dtype = DType::bf16}); Tensor loss = loss_fn(model(x), y); }
//   loss.backward();  // outside the scope, as in PyTorch
#include <optional>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"
#include "core/tensor.h"

namespace kiln {

struct OpDef;

struct AutocastOptions {
  DeviceType device_type = DeviceType::cpu;
  std::optional<DType> dtype = std::nullopt;  // f16 or bf16; default bf16 on the CPU, f16 on CUDA
  bool enabled = true;
};

class autocast {
 public:
  explicit autocast(AutocastOptions options = {});
  ~autocast();
  autocast(const autocast&) = delete;
  autocast& operator=(const autocast&) = delete;

 private:
  DeviceType device_;
  std::optional<DType> previous_;
};

// The dtype autocast lowers to on `device` in this thread; nothing when it is off there.
std::optional<DType> autocast_dtype(DeviceType device);

// For the dispatcher (core/registry.cpp): the inputs of a top-level call of `op` as
// autocast casts them (the same inputs when it is off or the op's policy is none).
std::vector<Tensor> autocast_inputs(const OpDef& op, std::vector<Tensor> inputs);

}  // namespace kiln

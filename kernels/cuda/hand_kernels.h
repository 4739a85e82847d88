#pragma once
// Hand-written CUDA kernels: the ops whose work is neither an elementwise map nor a plain
// reduction (an index picked per row, an arg-reduction, a loss summed in the CPU's order).
// A family is one extern "C" __global__ function written in CUDA C++ with the placeholders
// NAME (the function's name), SCALAR (the element type) and COMPUTE (the type arithmetic
// happens in: float for the 16-bit floats, the element type otherwise), instantiated per
// dtype, compiled by NVRTC for the device's architecture on first use and kept loaded.
// Every source starts with core/half.h, so kiln::Half and kiln::BFloat16 are there.
//
// Families register themselves, so hand_written_kernels() lists every instantiation and a
// test compiles them all to sm_90 without a GPU. This header includes no CUDA header: the
// tests see only the sources.
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/ops/factory.h"
#include "core/tensor.h"

namespace kiln::cuda {

struct LoadedKernel;

// One instantiation: the function `name` defined in `source`.
struct KernelSource {
  std::string name;
  std::string source;
};

class KernelFamily {
 public:
  // `base` names the family (functions are kiln_<base>_<dtype>); `dtypes` are the
  // instantiations the kernels may ask for.
  KernelFamily(std::string base, std::string source, std::vector<DType> dtypes);
  KernelFamily(const KernelFamily&) = delete;
  KernelFamily& operator=(const KernelFamily&) = delete;

  // The source of the instantiation for `dtype` (a kiln::Error for a dtype not listed).
  KernelSource instance(DType dtype) const;
  // That instantiation compiled for `device`'s architecture and loaded (once per process).
  const LoadedKernel& get(DType dtype, int device) const;

  // Launches the instantiation for `dtype` on `device`'s current stream with `threads`
  // threads in blocks of kBlock (nothing when threads is 0). Each argument's type must have
  // the size of the kernel's parameter: long long for 64-bit integers, int, double, pointers.
  template <class... Args>
  void launch(DType dtype, int device, long long threads, Args... args) const {
    void* pointers[] = {static_cast<void*>(&args)...};
    launch_raw(dtype, device, threads, pointers);
  }
  void launch_raw(DType dtype, int device, long long threads, void** args) const;

  static constexpr int kBlock = 256;

  const std::string& base() const { return base_; }
  const std::vector<DType>& dtypes() const { return dtypes_; }

 private:
  std::string base_, source_;
  std::vector<DType> dtypes_;
};

// A kernel's output: the out tensor, or a contiguous buffer of its shape and dtype that
// finish() copies into it (the hand-written kernels write dense memory).
struct Contiguous {
  Tensor out, buffer;
  explicit Contiguous(const Tensor& o)
      : out(o), buffer(o.is_contiguous() ? o : empty(o.shape(), {.dtype = o.dtype(), .device = o.device()})) {}
  void* ptr() const { return buffer.data_ptr(); }
  void finish() const {
    if (!buffer.same(out)) Tensor(out).copy_(buffer);
  }
};

// Every instantiation of every registered family.
std::vector<KernelSource> hand_written_kernels();

// For tests on machines without a GPU: while a hook is set, every KernelFamily launch is
// given to it (the instantiation, blocks, threads per block, the kernel's arguments)
// instead of the device, so an op's CUDA kernel can run on CPU tensors with an emulator
// executing the family's source (tests/cuda/cuda_emulator.h). Returns the previous hook.
using KernelLaunchHook = void (*)(const KernelSource& kernel, long long grid, int block, void** args);
KernelLaunchHook set_kernel_launch_hook(KernelLaunchHook hook);

}  // namespace kiln::cuda

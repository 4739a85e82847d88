#include "kernels/cuda/hand_kernels.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>

#include <fmt/format.h>

#include "core/error.h"
#include "kernels/cuda/nvrtc.h"
#include "kernels/cuda/runtime.h"

namespace kiln::cuda {
namespace {

// Families in construction order; they are namespace-scope objects that live until exit.
std::vector<const KernelFamily*>& families() {
  static auto* list = new std::vector<const KernelFamily*>;
  return *list;
}
std::mutex& families_mutex() {
  static auto* m = new std::mutex;
  return *m;
}

const char* scalar_type(DType t) {
  switch (t) {
    case DType::f32: return "float";
    case DType::f64: return "double";
    case DType::f16: return "kiln::Half";
    case DType::bf16: return "kiln::BFloat16";
    case DType::i64: return "long long";
    case DType::i32: return "int";
    case DType::u8: return "unsigned char";
    case DType::boolean: return "bool";
  }
  return "?";
}

const char* compute_type(DType t) { return is_reduced_float(t) ? "float" : scalar_type(t); }

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size()))
    s.replace(at, from.size(), to);
  return s;
}

}  // namespace

KernelFamily::KernelFamily(std::string base, std::string source, std::vector<DType> dtypes)
    : base_(std::move(base)), source_(std::move(source)), dtypes_(std::move(dtypes)) {
  std::lock_guard lock(families_mutex());
  families().push_back(this);
}

KernelSource KernelFamily::instance(DType dtype) const {
  KILN_CHECK(std::find(dtypes_.begin(), dtypes_.end(), dtype) != dtypes_.end(),
             "cuda kernel {}: no instantiation for dtype {}", base_, dtype);
  KernelSource k;
  k.name = fmt::format("kiln_{}_{}", base_, name(dtype));
  // The placeholders are words the sources use for nothing else.
  std::string src = replace_all(source_, "COMPUTE", compute_type(dtype));
  src = replace_all(src, "SCALAR", scalar_type(dtype));
  src = replace_all(src, "NAME", k.name);
  k.source = "#include \"core/half.h\"\n" + src;
  return k;
}

const LoadedKernel& KernelFamily::get(DType dtype, int device) const {
  static std::mutex mutex;
  static std::map<std::string, LoadedKernel> loaded;  // "<name> <arch>" -> kernel
  const std::string arch = device_properties(device).arch();
  const KernelSource k = instance(dtype);
  std::lock_guard lock(mutex);
  auto it = loaded.find(k.name + " " + arch);
  if (it == loaded.end()) {
    const CudaBinary binary = compile_cuda(k.source, k.name, {.arch = arch});
    it = loaded.emplace(k.name + " " + arch, load_kernel(binary.cubin, k.name)).first;
  }
  return it->second;
}

namespace {
std::atomic<KernelLaunchHook> launch_hook{nullptr};
}  // namespace

KernelLaunchHook set_kernel_launch_hook(KernelLaunchHook hook) { return launch_hook.exchange(hook); }

void KernelFamily::launch_raw(DType dtype, int device, long long threads, void** args) const {
  if (threads <= 0) return;
  const long long grid = (threads + kBlock - 1) / kBlock;
  if (const KernelLaunchHook hook = launch_hook.load()) return hook(instance(dtype), grid, kBlock, args);
  cuda::launch(get(dtype, device), {grid, kBlock, 0}, args, device);
}

std::vector<KernelSource> hand_written_kernels() {
  std::lock_guard lock(families_mutex());
  std::vector<KernelSource> all;
  for (const KernelFamily* f : families())
    for (DType t : f->dtypes()) all.push_back(f->instance(t));
  return all;
}

}  // namespace kiln::cuda

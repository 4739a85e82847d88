#include "compiler/codegen/cuda.h"

#include <algorithm>

#include <fmt/format.h>

#include "compiler/codegen/render.h"
#include "core/error.h"

namespace kiln::compiler::codegen {
namespace {

constexpr int kMaxBlock = 256;      // the __launch_bounds__ of every kernel
constexpr int kWarp = 32;
constexpr int64_t kMaxGrid = 65536;  // enough blocks to fill any GPU; the loops stride past it
constexpr int kVector = 4;           // elements per thread on a pointwise kernel's vector path

// kVector elements of T as one load or store: 16 bytes for f32, 8 for f16 and bf16 (f64:
// two 16-byte accesses). {0} is kVector.
constexpr const char* kVectorTypes = R"(template <class T> struct alignas(sizeof(T) * {0} < 16 ? sizeof(T) * {0} : 16) kiln_vec {{
  T v[{0}];
}};
template <class T> __device__ inline bool kiln_aligned(const T* p) {{
  return reinterpret_cast<unsigned long long>(p) % alignof(kiln_vec<T>) == 0;
}}
)";

// Warp shuffles move 32- and 64-bit values; bool and unsigned char go through unsigned int.
constexpr const char* kShuffle = R"(template <class T> __device__ inline T kiln_shfl_down(T v, int delta) {
  return __shfl_down_sync(0xffffffffu, v, delta);
}
__device__ inline bool kiln_shfl_down(bool v, int delta) {
  return __shfl_down_sync(0xffffffffu, static_cast<unsigned>(v), delta) != 0u;
}
__device__ inline unsigned char kiln_shfl_down(unsigned char v, int delta) {
  return static_cast<unsigned char>(__shfl_down_sync(0xffffffffu, static_cast<unsigned>(v), delta));
}
)";

class CudaRenderer : KernelRenderer {
 public:
  explicit CudaRenderer(const Kernel& k) : KernelRenderer(k, kCudaSyntax) {}

  std::string render() {
    out_ += fmt::format("// kiln kernel {}: generated from the kernel IR for CUDA; depends on structure only.\n",
                        k_.name);
    out_ += "#include \"core/half.h\"\n#include \"kernels/scalar.h\"\n\n";
    out_ += fmt::format("struct KilnArgs {{ long long v[{}]; }};\n", std::max(1, arg_layout(k_).count));
    if (k_.num_reduced > 0) out_ += kShuffle;
    else out_ += fmt::format(fmt::runtime(kVectorTypes), kVector);
    out_ += "\n";
    std::vector<std::string> params;
    for (const Buffer& buf : k_.buffers) {
      const std::string t = storage_type(buf.dtype);
      params.push_back(buf.output ? fmt::format("{}* const {}", t, buf.name)
                                  : fmt::format("const {}* const {}", t, buf.name));
    }
    params.push_back("const KilnArgs args");
    out_ += fmt::format("extern \"C\" __global__ void __launch_bounds__({}) {}({}) {{\n", kMaxBlock,
                        cuda_symbol(k_), fmt::join(params, ", "));
    declare_arguments(1, "args.v[{}]");
    if (k_.num_reduced == 0) pointwise();
    else reduction();
    out_ += "}\n";
    return std::move(out_);
  }

 private:
  // Declares i<begin>..i<end-1> from the linear index `linear` over those dims (row-major),
  // `bound` (an expression) exceeding it. While the bound fits 32 bits, the divisions are
  // 32-bit: a 64-bit one is a long subroutine on the GPU, and a 4-d kernel does three per
  // element (merged dims make most sizes 1, which does not make dividing cheaper).
  void unravel(int depth, const std::string& linear, int32_t begin, int32_t end, const std::string& bound) {
    if (begin >= end) return;
    if (end - begin == 1) {
      line(depth, fmt::format("const long long i{} = {};", begin, linear));
      return;
    }
    std::vector<std::string> names;
    for (int32_t d = begin; d < end; ++d) names.push_back(fmt::format("i{}", d));
    line(depth, fmt::format("long long {};", fmt::join(names, ", ")));
    // The divisions in `type`, each size converted by `size` ("{}": n<d>).
    auto divide = [&](const std::string& type, const std::string& rest, const char* size) {
      line(depth + 1, fmt::format("{} {} = {};", type, rest, type == "long long" ? linear : convert(type, linear)));
      for (int32_t d = end - 1; d > begin; --d) {
        const std::string n = fmt::format(fmt::runtime(size), fmt::format("n{}", d));
        line(depth + 1, fmt::format("i{} = {} % {};", d, rest, n));
        line(depth + 1, fmt::format("{} /= {};", rest, n));
      }
      line(depth + 1, fmt::format("i{} = {};", begin, rest));
    };
    line(depth, fmt::format("if ({} <= 0xffffffffLL) {{", bound));
    divide("unsigned int", linear + "_rest32", "static_cast<unsigned int>({})");
    line(depth, "} else {");
    divide("long long", linear + "_rest", "{}");
    line(depth, "}");
  }

  // The pointwise loop. When the innermost size is a multiple of kVector and every buffer
  // that walks the innermost dim does so with stride 1 from a kVector-aligned start (its
  // offset, its other strides and its address aligned), each thread takes kVector
  // consecutive elements: one vector load per such buffer, the body once per lane, one
  // vector store per output. Buffers broadcast along the innermost dim read one element
  // for the whole vector. Otherwise (or for rank 0) one element per thread. (For 8-byte
  // types the vector is 16-byte aligned, so an offset of 2 elements would do; the check
  // asks for 4 in every type, which is stricter, never wrong.) The launch gives a thread
  // per kVector elements whenever the sizes allow the path, so a call that fails the
  // run-time check walks its elements with a quarter of the threads.
  void pointwise() {
    line(1, fmt::format("const long long total = {};", product(0, k_.rank)));
    line(1, "const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;");
    line(1, "const long long first = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;");
    if (k_.rank > 0) vector_loop();
    line(1, "for (long long linear = first; linear < total; linear += stride) {");
    unravel(2, "linear", 0, k_.rank, "total");
    body(2, false);
    stores(2, false);
    line(1, "}");
  }

  void vector_loop() {
    const int32_t last = k_.rank - 1;
    std::vector<std::string> fits = {fmt::format("n{} % {} == 0", last, kVector)};
    vector_buffer_.assign(k_.buffers.size(), false);
    for (size_t b = 0; b < k_.buffers.size(); ++b) {
      const Buffer& buf = k_.buffers[b];
      if (buf.broadcasts(last)) continue;
      vector_buffer_[b] = true;
      const std::string& n = buf.name;
      fits.push_back(fmt::format("{}_s{} == 1 && {}_off % {} == 0", n, last, n, kVector));
      for (int32_t d = 0; d < last; ++d)
        if (!buf.broadcasts(d)) fits.push_back(fmt::format("(n{} == 1 || {}_s{} % {} == 0)", d, n, d, kVector));
      fits.push_back(fmt::format("kiln_aligned({})", n));
    }
    line(1, fmt::format("if ({}) {{", fmt::join(fits, " &&\n      ")));
    line(2, fmt::format("for (long long group = first; group < total / {}; group += stride) {{", kVector));
    line(3, fmt::format("const long long linear = group * {};", kVector));
    unravel(3, "linear", 0, k_.rank, "total");
    for (size_t b = 0; b < k_.buffers.size(); ++b) {
      if (!vector_buffer_[b]) continue;
      const Buffer& buf = k_.buffers[b];
      const std::string vec = fmt::format("kiln_vec<{}>", storage_type(buf.dtype));
      if (buf.output)
        line(3, fmt::format("{} {}_v;", vec, buf.name));
      else
        line(3, fmt::format("const {} {}_v = *reinterpret_cast<const {}*>({} + ({}));", vec, buf.name, vec, buf.name,
                            offset(buf, true)));
    }
    for (lane_ = 0; lane_ < kVector; ++lane_) {
      line(3, "{");
      body(4, false, true);
      stores(4, true);
      line(3, "}");
    }
    lane_ = -1;
    for (size_t b = 0; b < k_.buffers.size(); ++b) {
      if (!vector_buffer_[b] || !k_.buffers[b].output) continue;
      const Buffer& buf = k_.buffers[b];
      line(3, fmt::format("*reinterpret_cast<kiln_vec<{}>*>({} + ({})) = {}_v;", storage_type(buf.dtype), buf.name,
                          offset(buf, true), buf.name));
    }
    line(2, "}");
    line(2, "return;");
    line(1, "}");
    vector_buffer_.clear();
  }

  void reduction() {
    const int32_t kept = k_.rank - k_.num_reduced;
    for (size_t e = 0; e < k_.exprs.size(); ++e)
      if (k_.exprs[e].kind == ExprKind::reduce)
        line(1, fmt::format("__shared__ {} partial{}[{}];", register_type(k_.exprs[e].dtype), e, kMaxBlock / kWarp));
    line(1, fmt::format("const long long outer = {};", product(0, kept)));
    line(1, fmt::format("const long long inner = {};", product(kept, k_.rank)));
    line(1, "const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;");
    line(1, "for (long long kept = blockIdx.x; kept < outer; kept += gridDim.x) {");
    unravel(2, "kept", 0, kept, "outer");
    declare_accumulators(2);
    line(2, "for (long long reduced = threadIdx.x; reduced < inner; reduced += blockDim.x) {");
    unravel(3, "reduced", kept, k_.rank, "inner");
    body(3, false);
    combine_reductions(3, "v{1}");
    stores(3, false, true);
    line(2, "}");
    // The block's partial results: within each warp, then across the warps' first lanes.
    warp_combine(2);
    line(2, "if (lane == 0) {");
    for_each_reduce([&](size_t e) { line(3, fmt::format("partial{}[warp] = acc{};", e, e)); });
    line(2, "}");
    line(2, "__syncthreads();");
    line(2, "if (warp == 0) {");
    for_each_reduce([&](size_t e) {
      line(3, fmt::format("acc{} = lane < warps ? partial{}[lane] : {};", e, e,
                          literal(k_.exprs[e].value, k_.exprs[e].dtype)));
    });
    warp_combine(3);
    line(3, "if (lane == 0) {");
    body(4, true);
    stores(4, false);
    line(3, "}");
    line(2, "}");
    line(2, "__syncthreads();  // the partials are read before the next kept index writes them");
    line(1, "}");
  }

  template <class F> void for_each_reduce(F f) {
    for (size_t e = 0; e < k_.exprs.size(); ++e)
      if (k_.exprs[e].kind == ExprKind::reduce) f(e);
  }

  void warp_combine(int depth) {
    line(depth, "for (int delta = 16; delta > 0; delta /= 2) {");
    combine_reductions(depth + 1, "kiln_shfl_down(acc{0}, delta)");
    line(depth, "}");
  }
};

int64_t product_of(std::span<const int64_t> args, int32_t begin, int32_t end) {
  int64_t p = 1;
  for (int32_t d = begin; d < end; ++d) p *= args[static_cast<size_t>(d)];
  return p;
}

}  // namespace

std::string cuda_symbol(const Kernel& kernel) { return "k_" + kernel.name; }

std::string render_cuda(const Kernel& kernel) { return CudaRenderer(kernel).render(); }

int64_t cuda_pointwise_threads(const Kernel& kernel, std::span<const int64_t> args) {
  const int64_t total = product_of(args, 0, kernel.rank);
  const bool vector = kernel.rank > 0 && args[static_cast<size_t>(kernel.rank - 1)] % kVector == 0;
  return vector ? total / kVector : total;
}

CudaLaunch cuda_launch_shape(const Kernel& kernel, std::span<const int64_t> args, const LaunchTuning& tuning) {
  KILN_CHECK(static_cast<int64_t>(args.size()) >= kernel.rank,
             "cuda_launch_shape: kernel {} has {} iteration sizes, got {} arguments", kernel.name, kernel.rank,
             args.size());
  for (int32_t d = 0; d < kernel.rank; ++d)
    KILN_CHECK(args[static_cast<size_t>(d)] >= 0, "cuda_launch_shape: kernel {}: size {} of dim {} is negative",
               kernel.name, args[static_cast<size_t>(d)], d);
  const int32_t kept = kernel.rank - kernel.num_reduced;
  if (kernel.num_reduced == 0) {
    const int64_t threads = cuda_pointwise_threads(kernel, args);
    if (threads == 0) return {.grid = 0, .block = kMaxBlock, .shared_bytes = 0};
    const int block = tuning.block > 0 ? tuning.block : kMaxBlock;
    const int64_t cap = tuning.block > 0 && tuning.max_grid > 0 ? tuning.max_grid : kMaxGrid;
    return {.grid = std::max<int64_t>(1, std::min((threads + block - 1) / block, cap)), .block = block,
            .shared_bytes = 0};
  }
  const int64_t outer = product_of(args, 0, kept), inner = product_of(args, kept, kernel.rank);
  int block = kWarp;
  while (block < kMaxBlock && block < inner) block *= 2;
  return {.grid = std::min(outer, kMaxGrid), .block = block, .shared_bytes = 0};
}

}  // namespace kiln::compiler::codegen

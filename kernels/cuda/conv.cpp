// CUDA kernels of conv2d, conv2d_backward_input and conv2d_backward_weight through cuDNN's
// legacy convolution API (cudnnConvolutionForward / BackwardData / BackwardFilter, in
// cuDNN 9's cudnn_cnn library).
//
// Layout: every tensor of one call is either contiguous NCHW or channels_last (NHWC
// memory): channels_last when the activation (forward and backward_weight: the input;
// backward_input: grad_out) is stored so and is not also contiguous, NCHW otherwise. Other
// strides (slices, transposes, broadcasts) are copied into that layout first: cuDNN's
// algorithms take arbitrary strides in the descriptor but many refuse them at run time,
// and one layout per call keeps the algorithm cache small.
//
// Algorithms: cudnnGet*Algorithm_v7's heuristic ranking, tried in order until one runs
// (some refuse a configuration only at run time), skipping any whose workspace exceeds
// kMaxWorkspace; the first that runs is cached per (direction, shapes, layout, dtype,
// attributes, math type, device). With set_cudnn_benchmark(true) the first call of a shape
// times every algorithm instead (cudnnFind*AlgorithmEx on the call's own buffers) and the
// fastest that runs is cached under its own key; a search that fails (out of memory, say)
// falls back to the heuristics. No determinism is asked for: non-deterministic algorithms
// (atomics in backward_filter) count like the others, as in PyTorch without
// use_deterministic_algorithms.
//
// Math: f32 uses TF32 tensor cores only when kiln::cuda::allow_tf32() is true; PyTorch's
// default for convolutions is TF32 on (torch.backends.cudnn.allow_tf32), ours follows the
// matmul flag (off) for now. "Off" is CUDNN_FMA_MATH: CUDNN_DEFAULT_MATH lets cuDNN use TF32
// for f32 on Ampere and later. f16 and bf16 use tensor cores with f32 accumulation; f64
// uses the default.
#include <algorithm>
#include <atomic>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/ops/conv.h"
#include "kernels/cuda/cudnn.h"

namespace kiln::cuda {
namespace {

using Span = std::span<const Tensor>;

constexpr size_t kMaxWorkspace = size_t{1} << 30;

enum class Direction { forward, backward_data, backward_filter };

const char* name_of(Direction d) {
  switch (d) {
    case Direction::forward: return "conv2d";
    case Direction::backward_data: return "conv2d_backward_input";
    default: return "conv2d_backward_weight";
  }
}

cudnnMathType_t math_type(DType t) {
  if (t == DType::f16 || t == DType::bf16) return CUDNN_TENSOR_OP_MATH;
  if (t == DType::f32) return allow_tf32() ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH;
  return CUDNN_DEFAULT_MATH;
}

// One call's descriptors: x the input side, w the weight side, y the output side, whatever
// the direction reads and writes.
struct ConvCall {
  Direction dir;
  DType dtype;
  cudnnMathType_t math;
  dnn::TensorDesc x, y;
  dnn::FilterDesc w;
  dnn::ConvDesc conv;
  std::string key;
};

void describe(ConvCall& c, const Conv2dGeometry& g, const Tensor& x, const Tensor& y, bool channels_last) {
  const char* op = name_of(c.dir);
  c.x.set(x, op);
  c.y.set(y, op);
  c.w.set(c.dtype, g.weight_shape(), channels_last, op);
  dnn::check(cudnnSetConvolution2dDescriptor(c.conv.get(), static_cast<int>(g.pad_h), static_cast<int>(g.pad_w),
                                             static_cast<int>(g.stride_h), static_cast<int>(g.stride_w),
                                             static_cast<int>(g.dilation_h), static_cast<int>(g.dilation_w),
                                             CUDNN_CROSS_CORRELATION, dnn::compute_type(c.dtype)),
             op);
  dnn::check(cudnnSetConvolutionGroupCount(c.conv.get(), static_cast<int>(g.groups)), op);
  dnn::check(cudnnSetConvolutionMathType(c.conv.get(), c.math), op);
  c.key = fmt::format("{} {} {} {}x{}x{}x{} {}x{}x{}x{} s{}x{} p{}x{} d{}x{} g{} m{} dev{}", static_cast<int>(c.dir),
                      name(c.dtype), channels_last ? "nhwc" : "nchw", g.batch,
                      g.in_channels, g.in_h, g.in_w, g.out_channels, g.in_channels / g.groups, g.kernel_h,
                      g.kernel_w, g.stride_h, g.stride_w, g.pad_h, g.pad_w, g.dilation_h, g.dilation_w, g.groups,
                      static_cast<int>(c.math), x.device().index);
}

struct Candidate {
  int algo = 0;
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
};

// Whether an algorithm the heuristics offer may run under our math type: with TF32 off,
// an f32 convolution takes no tensor-core algorithm.
bool math_allowed(const ConvCall& c, cudnnMathType_t algo_math) {
  if (c.dtype == DType::f32 && c.math == CUDNN_FMA_MATH)
    return algo_math != CUDNN_TENSOR_OP_MATH && algo_math != CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION;
  return true;
}

// Appends the usable results of a heuristics query or a timed search, in cuDNN's order
// (best first): those that succeeded, fit max_bytes of workspace and respect the math type.
// A timed algorithm runs in the math type it was timed with, except f32 without TF32,
// which always runs CUDNN_FMA_MATH (CUDNN_DEFAULT_MATH would allow TF32 again); one timed
// with down-conversion (f32 data on f16 tensor cores) is never adopted, as we never ask for it.
template <class Perf>
void keep(const ConvCall& c, const Perf* perf, int count, size_t max_bytes, bool timed, std::vector<Candidate>& out) {
  for (int i = 0; i < count; ++i) {
    const Perf& p = perf[i];
    if (p.status != CUDNN_STATUS_SUCCESS || p.memory > max_bytes || !math_allowed(c, p.mathType)) continue;
    if (timed && p.mathType == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION) continue;
    const cudnnMathType_t math = timed && c.math != CUDNN_FMA_MATH ? p.mathType : c.math;
    out.push_back({static_cast<int>(p.algo), math});
  }
}

std::vector<Candidate> candidates(cudnnHandle_t h, const ConvCall& c) {
  const char* op = name_of(c.dir);
  std::vector<Candidate> out;
  int count = 0;
  switch (c.dir) {
    case Direction::forward: {
      cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
      dnn::check(cudnnGetConvolutionForwardAlgorithm_v7(h, c.x.get(), c.w.get(), c.conv.get(), c.y.get(),
                                                        CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &count, perf),
                 op);
      keep(c, perf, count, kMaxWorkspace, false, out);
      break;
    }
    case Direction::backward_data: {
      cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
      dnn::check(cudnnGetConvolutionBackwardDataAlgorithm_v7(h, c.w.get(), c.y.get(), c.conv.get(), c.x.get(),
                                                             CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &count, perf),
                 op);
      keep(c, perf, count, kMaxWorkspace, false, out);
      break;
    }
    case Direction::backward_filter: {
      cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
      dnn::check(cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, c.x.get(), c.y.get(), c.conv.get(), c.w.get(),
                                                               CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &count,
                                                               perf),
                 op);
      keep(c, perf, count, kMaxWorkspace, false, out);
      break;
    }
  }
  KILN_CHECK(!out.empty(), "{}: cuDNN offers no algorithm for this convolution ({})", op, c.key);
  return out;
}

// The workspace bytes of `algo`, or nullopt-like SIZE_MAX when cuDNN refuses the algorithm.
size_t workspace_bytes(cudnnHandle_t h, const ConvCall& c, int algo) {
  size_t bytes = 0;
  cudnnStatus_t s = CUDNN_STATUS_SUCCESS;
  switch (c.dir) {
    case Direction::forward:
      s = cudnnGetConvolutionForwardWorkspaceSize(h, c.x.get(), c.w.get(), c.conv.get(), c.y.get(),
                                                  static_cast<cudnnConvolutionFwdAlgo_t>(algo), &bytes);
      break;
    case Direction::backward_data:
      s = cudnnGetConvolutionBackwardDataWorkspaceSize(h, c.w.get(), c.y.get(), c.conv.get(), c.x.get(),
                                                       static_cast<cudnnConvolutionBwdDataAlgo_t>(algo), &bytes);
      break;
    case Direction::backward_filter:
      s = cudnnGetConvolutionBackwardFilterWorkspaceSize(h, c.x.get(), c.y.get(), c.conv.get(), c.w.get(),
                                                         static_cast<cudnnConvolutionBwdFilterAlgo_t>(algo), &bytes);
      break;
  }
  return s == CUDNN_STATUS_SUCCESS ? bytes : SIZE_MAX;
}

// Runs one algorithm: y = conv(x, w) (forward), x = conv^T(y, w) (backward_data) or
// w = grad(x, y) (backward_filter), each pointer the tensor of the same role.
cudnnStatus_t execute(cudnnHandle_t h, const ConvCall& c, int algo, const Tensor& ws, size_t ws_bytes, void* x,
                      void* w, void* y) {
  const dnn::Scale one(1.0), zero(0.0);
  const void* a = one.for_type(c.dtype);
  const void* b = zero.for_type(c.dtype);
  void* wsp = ws.defined() ? ws.data_ptr() : nullptr;
  switch (c.dir) {
    case Direction::forward:
      return cudnnConvolutionForward(h, a, c.x.get(), x, c.w.get(), w, c.conv.get(),
                                     static_cast<cudnnConvolutionFwdAlgo_t>(algo), wsp, ws_bytes, b, c.y.get(), y);
    case Direction::backward_data:
      return cudnnConvolutionBackwardData(h, a, c.w.get(), w, c.y.get(), y, c.conv.get(),
                                          static_cast<cudnnConvolutionBwdDataAlgo_t>(algo), wsp, ws_bytes, b,
                                          c.x.get(), x);
    default:
      return cudnnConvolutionBackwardFilter(h, a, c.x.get(), x, c.y.get(), y, c.conv.get(),
                                            static_cast<cudnnConvolutionBwdFilterAlgo_t>(algo), wsp, ws_bytes, b,
                                            c.w.get(), w);
  }
}

std::atomic<bool> g_benchmark{false};
thread_local bool t_benchmark = false;  // ThreadCudnnBenchmark
std::atomic<int64_t> g_searches{0};

// Memory a timed search leaves free for everything else (cuDNN's own scratch, other streams).
constexpr size_t kSearchMargin = size_t{256} << 20;

// The workspace a timed search may use: kMaxWorkspace (which bounds every algorithm the
// heuristics offer, so their choice always fits) but no more than the device's free memory
// less kSearchMargin. Memory the caching allocator holds in its cache is not counted free,
// which errs on the small side.
size_t search_workspace_cap() {
  size_t free_bytes = 0, total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) {
    cudaGetLastError();  // clear it: a failed query is no reason to fail the convolution
    return 0;
  }
  return std::min(kMaxWorkspace, free_bytes > kSearchMargin ? free_bytes - kSearchMargin : 0);
}

// Times every algorithm on the call's own buffers (cudnnFind*AlgorithmEx writes the
// output, y, x or w by direction, which the real call overwrites right after) and returns
// the usable ones, fastest first. Empty when the search fails (no memory for the workspace,
// a cuDNN error): the caller then takes the heuristics' choice.
std::vector<Candidate> timed_candidates(cudnnHandle_t h, const ConvCall& c, Device device, void* x, void* w, void* y) {
  g_searches.fetch_add(1);
  std::vector<Candidate> out;
  try {
    const size_t cap = search_workspace_cap();
    const Tensor ws = cap ? dnn::workspace(static_cast<int64_t>(cap), device) : Tensor();
    void* wsp = ws.defined() ? ws.data_ptr() : nullptr;
    auto find = [&](auto& perf, int requested, auto&& call) {
      int count = 0;
      if (call(requested, &count, perf) == CUDNN_STATUS_SUCCESS) keep(c, perf, count, cap, true, out);
    };
    switch (c.dir) {
      case Direction::forward: {
        cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
        find(perf, CUDNN_CONVOLUTION_FWD_ALGO_COUNT, [&](int n, int* count, auto* p) {
          return cudnnFindConvolutionForwardAlgorithmEx(h, c.x.get(), x, c.w.get(), w, c.conv.get(), c.y.get(), y, n,
                                                        count, p, wsp, cap);
        });
        break;
      }
      case Direction::backward_data: {
        cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
        find(perf, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, [&](int n, int* count, auto* p) {
          return cudnnFindConvolutionBackwardDataAlgorithmEx(h, c.w.get(), w, c.y.get(), y, c.conv.get(), c.x.get(),
                                                             x, n, count, p, wsp, cap);
        });
        break;
      }
      case Direction::backward_filter: {
        cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
        find(perf, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, [&](int n, int* count, auto* p) {
          return cudnnFindConvolutionBackwardFilterAlgorithmEx(h, c.x.get(), x, c.y.get(), y, c.conv.get(),
                                                               c.w.get(), w, n, count, p, wsp, cap);
        });
        break;
      }
    }
  } catch (const Error&) {  // the workspace's allocation failed
    out.clear();
  }
  // A failed search may leave a CUDA error behind (an allocation inside cuDNN): it must not
  // surface in the next unrelated check.
  if (out.empty()) cudaGetLastError();
  return out;
}

// Runs the call with the cached algorithm, or chooses one: the timed search's results
// (benchmark mode), then the heuristics' candidates, in order until one runs.
void run(const ConvCall& c, Device device, void* x, void* w, void* y) {
  static std::mutex mutex;
  static std::unordered_map<std::string, Candidate> chosen;
  const char* op = name_of(c.dir);
  DeviceGuard guard(device.index);
  cudnnHandle_t h = dnn::handle_for(device.index, op);
  const bool benchmark = g_benchmark.load() || t_benchmark;
  const std::string key = benchmark ? c.key + " timed" : c.key;
  std::vector<Candidate> tries;
  {
    std::lock_guard lock(mutex);
    auto it = chosen.find(key);
    if (it != chosen.end()) tries.push_back(it->second);
  }
  const bool cached = !tries.empty();
  if (!cached) {
    // The heuristics' candidates follow the timed ones: they run when the search failed, or
    // when every timed algorithm refuses the real call.
    if (benchmark) tries = timed_candidates(h, c, device, x, w, y);
    const std::vector<Candidate> ranked = candidates(h, c);
    tries.insert(tries.end(), ranked.begin(), ranked.end());
  }
  cudnnStatus_t last = CUDNN_STATUS_NOT_SUPPORTED;
  cudnnMathType_t math = c.math;
  for (const Candidate& cand : tries) {
    if (cand.math != math) {  // a timed algorithm's own math type (see keep)
      math = cand.math;
      dnn::check(cudnnSetConvolutionMathType(c.conv.get(), math), op);
    }
    const size_t bytes = workspace_bytes(h, c, cand.algo);
    if (bytes == SIZE_MAX || bytes > kMaxWorkspace) continue;
    const Tensor ws = bytes ? dnn::workspace(static_cast<int64_t>(bytes), device) : Tensor();
    last = execute(h, c, cand.algo, ws, bytes, x, w, y);
    if (last == CUDNN_STATUS_SUCCESS) {
      if (!cached) {
        std::lock_guard lock(mutex);
        chosen.emplace(key, cand);
      }
      return;
    }
    // A refusal tries the next algorithm; anything else is an error.
    if (last != CUDNN_STATUS_NOT_SUPPORTED && last != CUDNN_STATUS_BAD_PARAM) dnn::check(last, op);
  }
  fail("{}: no cuDNN algorithm runs this convolution ({}): last status {}", op, key, cudnnGetErrorString(last));
}

bool activation_channels_last(const Tensor& t) { return dnn::is_channels_last(t) && !t.is_contiguous(); }

// The compute dtype check every kernel starts with (the op's shape rules checked the rest).
DType checked_dtype(const Tensor& t, const char* op) {
  dnn::data_type(t.dtype(), op);
  return t.dtype();
}

void conv2d_kernel(Span in, Span out, const Attrs& attrs) {
  const Conv2dGeometry g = conv2d_geometry(in[0].shape(), in[1].shape(), attrs, "conv2d");
  const DType dt = checked_dtype(in[0], "conv2d");
  if (out[0].numel() == 0) return;
  const bool cl = activation_channels_last(in[0]);
  const Tensor x = dnn::in_layout(in[0], cl), w = dnn::in_layout(in[1], cl);
  const bool has_bias = in.size() == 3 && in[2].defined();
  dnn::into_layout(out[0], cl, dt, [&](const Tensor& y) {
    if (g.in_channels == 0) {  // an empty reduction: the bias alone
      Tensor(y).fill_(0);
    } else {
      ConvCall c{.dir = Direction::forward, .dtype = dt, .math = math_type(dt)};
      describe(c, g, x, y, cl);
      run(c, y.device(), x.data_ptr(), w.data_ptr(), y.data_ptr());
    }
    if (has_bias) {
      const Tensor bias = in[2].contiguous();
      dnn::TensorDesc bias_desc;
      const int64_t sizes[] = {1, g.out_channels, 1, 1}, strides[] = {g.out_channels, 1, 1, 1};
      bias_desc.set(dt, sizes, strides, "conv2d");
      dnn::TensorDesc y_desc;
      y_desc.set(y, "conv2d");
      const dnn::Scale one(1.0);
      DeviceGuard guard(y.device().index);
      dnn::check(cudnnAddTensor(dnn::handle_for(y.device().index, "conv2d"), one.for_type(dt), bias_desc.get(),
                                bias.data_ptr(), one.for_type(dt), y_desc.get(), y.data_ptr()),
                 "conv2d");
    }
  });
}

void conv2d_backward_input_kernel(Span in, Span out, const Attrs& attrs) {
  const char* op = "conv2d_backward_input";
  const Conv2dGeometry g = conv2d_geometry(attrs.ints("input_size"), in[1].shape(), attrs, op);
  const DType dt = checked_dtype(in[0], op);
  if (out[0].numel() == 0) return;
  const bool cl = activation_channels_last(in[0]);
  const Tensor dy = dnn::in_layout(in[0], cl), w = dnn::in_layout(in[1], cl);
  dnn::into_layout(out[0], cl, dt, [&](const Tensor& dx) {
    if (dy.numel() == 0 || g.out_channels == 0) {  // no output position reads the input
      Tensor(dx).fill_(0);
      return;
    }
    ConvCall c{.dir = Direction::backward_data, .dtype = dt, .math = math_type(dt)};
    describe(c, g, dx, dy, cl);
    run(c, dx.device(), dx.data_ptr(), w.data_ptr(), dy.data_ptr());
  });
}

void conv2d_backward_weight_kernel(Span in, Span out, const Attrs& attrs) {
  const char* op = "conv2d_backward_weight";
  const Conv2dGeometry g = conv2d_geometry(in[1].shape(), attrs.ints("weight_size"), attrs, op);
  const DType dt = checked_dtype(in[0], op);
  if (out[0].numel() == 0) return;
  if (in.size() == 3 && in[2].defined()) {
    // The gradient to add to: the sum computed apart, then added (cuDNN's beta = 1 would
    // spare the pass; not measured on a GPU yet).
    const Tensor sum = call_op1(find_op(op), {in[0], in[1]}, attrs);
    if (!same_view(out[0], in[2])) Tensor(out[0]).copy_(in[2]);
    Tensor(out[0]).add_(sum);
    return;
  }
  const bool cl = activation_channels_last(in[1]);
  const Tensor dy = dnn::in_layout(in[0], cl), x = dnn::in_layout(in[1], cl);
  dnn::into_layout(out[0], cl, dt, [&](const Tensor& dw) {
    if (dy.numel() == 0) {  // an empty batch sums nothing
      Tensor(dw).fill_(0);
      return;
    }
    ConvCall c{.dir = Direction::backward_filter, .dtype = dt, .math = math_type(dt)};
    describe(c, g, x, dy, cl);
    run(c, dw.device(), x.data_ptr(), dw.data_ptr(), dy.data_ptr());
  });
}

struct Registrar {
  Registrar() {
    register_kernel("conv2d", DeviceType::cuda, conv2d_kernel);
    register_kernel("conv2d_backward_input", DeviceType::cuda, conv2d_backward_input_kernel);
    register_kernel("conv2d_backward_weight", DeviceType::cuda, conv2d_backward_weight_kernel);
  }
} registrar;

}  // namespace

void set_cudnn_benchmark(bool on) { g_benchmark.store(on); }
bool cudnn_benchmark() { return g_benchmark.load(); }
ThreadCudnnBenchmark::ThreadCudnnBenchmark(bool on) : previous_(t_benchmark) { t_benchmark = t_benchmark || on; }
ThreadCudnnBenchmark::~ThreadCudnnBenchmark() { t_benchmark = previous_; }

namespace dnn {
int64_t cudnn_algorithm_searches() { return g_searches.load(); }
}  // namespace dnn
}  // namespace kiln::cuda

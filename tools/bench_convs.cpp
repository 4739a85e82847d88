// kiln-bench convs: every distinct conv2d of a zoo model's forward, timed forward and in
// both gradients (the per-layer comparison tools/bench_vs_torch.py makes against PyTorch).
#include <chrono>
#include <functional>
#include <iostream>
#include <memory>
#include <ranges>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include <kiln.h>

#include "tools/bench_common.h"
#include "tools/trainer.h"

namespace kiln::bench {
namespace {

// A model at a batch and image size whose convolutions `kiln-bench convs` times.
struct ConvModel {
  std::string arch;
  int64_t batch = 1, image_size = 32;
};

struct ConvsOptions {
  // The sizes kiln-bench train and tools/bench_vs_torch.py time these models at.
  std::vector<ConvModel> models = {{"resnet18", 64, 32}, {"resnet50", 8, 64}, {"resnet50", 32, 32}};
  bool channels_last = false;  // input and output gradient NHWC (the weight stays OIHW)
  bool list = false;           // the shapes and their uses, untimed
  DType dtype = DType::f32;    // of the activations, weights and gradients (autocast's dtype)
  int64_t reps = 5;
};

// One distinct convolution of a model's forward: its geometry at the model's batch, how
// many times one forward runs it, and whether training takes its input's gradient (not for
// the stem's, whose input is the image).
struct ConvUse {
  Conv2dGeometry geometry;
  int64_t uses = 0;
  bool input_grad = true;
};

// The convolutions of one forward of the model (traced through the op hook, in eval mode
// at batch 1), the distinct ones in the order they first run.
std::vector<ConvUse> conv_uses(const ConvModel& m) {
  manual_seed(0);
  const std::shared_ptr<nn::Module> model = train::make_model(m.arch, 1000, 3, m.image_size);
  model->eval();
  const Tensor image = randn({1, 3, m.image_size, m.image_size});
  auto key = [](const Conv2dGeometry& g) {
    return std::tuple(g.input_shape(), g.weight_shape(), g.stride_h, g.stride_w, g.pad_h, g.pad_w,
                      g.dilation_h, g.dilation_w, g.groups);
  };
  std::vector<ConvUse> convs;
  NoGradGuard no_grad;
  OpHookGuard hook([&](const OpCall& call) {
    if (call.op.name != "conv2d") return;
    Conv2dGeometry g =
        conv2d_geometry(call.inputs[0].shape(), call.inputs[1].shape(), call.attrs, "conv2d");
    g.batch = m.batch;
    const auto seen =
        std::ranges::find_if(convs, [&](const ConvUse& c) { return key(c.geometry) == key(g); });
    ConvUse& use = seen != convs.end() ? *seen : convs.emplace_back(ConvUse{.geometry = g});
    ++use.uses;
    use.input_grad = use.input_grad && !call.inputs[0].same(image);
  });
  model->forward(image);
  return convs;
}

// The median of `reps` runs of f after one warm-up, in milliseconds.
double median_ms(const std::function<void()>& f, int64_t reps) {
  f();
  std::vector<double> ms;
  for (int64_t i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  return median_of(ms);
}

// One JSON line per distinct convolution of each model: its shapes, uses per forward,
// and the time of its forward and its two gradients (the ops a training step runs), with
// GFLOP/s. tools/bench_vs_torch.py times the same shapes in PyTorch.
int run(const ConvsOptions& o) {
  const MemoryFormat format =
      o.channels_last ? MemoryFormat::channels_last : MemoryFormat::contiguous;
  for (const ConvModel& m : o.models)
    for (const ConvUse& c : conv_uses(m)) {
      const Conv2dGeometry& g = c.geometry;
      const Conv2dOptions opts{.stride = {g.stride_h, g.stride_w},
                               .padding = {g.pad_h, g.pad_w},
                               .dilation = {g.dilation_h, g.dilation_w},
                               .groups = g.groups};
      // Multiply-adds of the forward; each gradient takes as many.
      const double gflop =
          2e-9 * static_cast<double>(numel_of(g.output_shape()) * (g.in_channels / g.groups) *
                                     g.kernel_h * g.kernel_w);
      std::string line = fmt::format(
          R"({{"bench":"conv","model":"{}","batch":{},"image_size":{},"input":[{}],"weight":[{}],"output":[{}],)"
          R"("stride":[{},{}],"padding":[{},{}],"dilation":[{},{}],"groups":{},"uses":{},"input_grad":{},)"
          R"("layout":"{}","dtype":"{}","gflop":{:.4f})",
          m.arch, m.batch, m.image_size, fmt::join(g.input_shape(), ","),
          fmt::join(g.weight_shape(), ","), fmt::join(g.output_shape(), ","), g.stride_h,
          g.stride_w, g.pad_h, g.pad_w, g.dilation_h, g.dilation_w, g.groups, c.uses, c.input_grad,
          o.channels_last ? "channels_last" : "contiguous", o.dtype, gflop);
      if (!o.list) {
        const Tensor x = randn(g.input_shape()).to(o.dtype).contiguous(format);
        const Tensor w = randn(g.weight_shape()).to(o.dtype);
        const Tensor grad_out = randn(g.output_shape()).to(o.dtype).contiguous(format);
        const double forward = median_ms([&] { Tensor t = conv2d(x, w, {}, opts); }, o.reps);
        const double input = median_ms(
            [&] { Tensor t = conv2d_backward_input(grad_out, w, g.input_shape(), opts); }, o.reps);
        const double weight = median_ms(
            [&] { Tensor t = conv2d_backward_weight(grad_out, x, g.weight_shape(), opts); },
            o.reps);
        line += fmt::format(
            R"(,"reps":{},"forward_ms":{:.3f},"backward_input_ms":{:.3f},"backward_weight_ms":{:.3f},)"
            R"("forward_gflop_per_s":{:.1f},"backward_input_gflop_per_s":{:.1f},"backward_weight_gflop_per_s":{:.1f}{})",
            o.reps, forward, input, weight, gflop * 1e3 / forward, gflop * 1e3 / input,
            gflop * 1e3 / weight, blas_field());
      }
      std::cout << line << "}" << std::endl;
    }
  return 0;
}

ConvsOptions parse_options(int argc, char** argv) {
  ConvsOptions o;
  bool default_models = true;
  auto integer = [](const std::string& option, const std::string& value) {
    return parse_integer("kiln-bench convs", option, value);
  };
  for (int i = 2; i < argc; ++i) {
    const std::string option = argv[i];
    if (option == "--channels-last" || option == "--list") {
      (option == "--list" ? o.list : o.channels_last) = true;
      continue;
    }
    KILN_CHECK(i + 1 < argc, "kiln-bench convs: {} needs a value", option);
    const std::string value = argv[++i];
    if (option == "--reps") {
      o.reps = integer(option, value);
    } else if (option == "--dtype") {
      KILN_CHECK(value == "f32" || value == "bf16" || value == "f16",
                 "kiln-bench convs: --dtype {}: expected f32, bf16 or f16", value);
      o.dtype = value == "f32" ? DType::f32 : value == "bf16" ? DType::bf16 : DType::f16;
    } else if (option == "--model") {
      // ARCH:BATCH:IMAGE_SIZE
      const size_t a = value.find(':'), b = value.find(':', a == std::string::npos ? a : a + 1);
      KILN_CHECK(a != std::string::npos && b != std::string::npos,
                 "kiln-bench convs: --model {}: expected ARCH:BATCH:IMAGE_SIZE (resnet18:64:32)",
                 value);
      if (default_models) o.models.clear();
      default_models = false;
      ConvModel& m = o.models.emplace_back(ConvModel{.arch = value.substr(0, a)});
      m.batch = integer(option, value.substr(a + 1, b - a - 1));
      m.image_size = integer(option, value.substr(b + 1));
      check_range("kiln-bench convs: --model's batch", m.batch, 1, 1 << 16);
      check_range("kiln-bench convs: --model's image size", m.image_size, 1, train::kMaxImageSize);
    } else {
      fail("kiln-bench convs: unknown option {}", option);
    }
  }
  check_range("kiln-bench convs: --reps", o.reps, 1, 1'000'000);
  return o;
}

}  // namespace

int bench_convs(int argc, char** argv) { return run(parse_options(argc, argv)); }

}  // namespace kiln::bench

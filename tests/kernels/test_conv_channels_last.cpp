// conv2d and its gradients on channels_last (NHWC) activations: the CPU's NHWC algorithms
// against its NCHW ones (the reference, itself checked against naive loops in
// test_conv.cpp), and the layouts of the results.
#include "core/ops/conv.h"
#include "testing.h"

using namespace kiln;
using namespace kiln::testing;

namespace {

struct NhwcCase {
  const char* what;
  Shape input, weight;
  Conv2dOptions options;
};

const std::vector<NhwcCase>& nhwc_cases() {
  static const std::vector<NhwcCase> all = {
      {"1x1 stride 1", {3, 5, 4, 6}, {7, 5, 1, 1}, {}},
      {"1x1 stride 2", {3, 5, 5, 7}, {4, 5, 1, 1}, {.stride = {2, 2}}},
      {"1x1 padded", {2, 3, 4, 3}, {2, 3, 1, 1}, {.padding = {1, 1}}},
      {"3x3 pad 1 stride 1", {1, 4, 6, 5}, {6, 4, 3, 3}, {.padding = {1, 1}}},
      {"3x3 pad 1 stride 2", {3, 3, 7, 6}, {5, 3, 3, 3}, {.stride = {2, 2}, .padding = {1, 1}}},
      {"7x7 pad 3 stride 2", {1, 3, 11, 9}, {4, 3, 7, 7}, {.stride = {2, 2}, .padding = {3, 3}}},
      {"7x7 pad 3 stride 2 batch 3", {3, 2, 9, 12}, {3, 2, 7, 7}, {.stride = {2, 2}, .padding = {3, 3}}},
      {"one output channel", {2, 3, 5, 6}, {1, 3, 3, 3}, {.padding = {1, 1}}},
      {"one input channel", {3, 1, 6, 5}, {3, 1, 3, 3}, {.padding = {1, 1}}},
      {"dilated", {2, 3, 8, 7}, {4, 3, 3, 3}, {.padding = {2, 1}, .dilation = {2, 1}}},
      {"kernel larger than the image", {2, 2, 3, 3}, {3, 2, 5, 5}, {.padding = {1, 1}}},
      {"1x1 images", {3, 4, 1, 1}, {5, 4, 1, 1}, {}},
      {"1x1 images 3x3 kernel", {2, 4, 1, 1}, {3, 4, 3, 3}, {.padding = {1, 1}}},
      {"grouped", {2, 4, 6, 6}, {6, 2, 3, 3}, {.padding = {1, 1}, .groups = 2}},
      {"depthwise", {2, 4, 7, 7}, {4, 1, 3, 3}, {.padding = {1, 1}, .groups = 4}},
      // More output channels than output pixels: columns in (channel, tap) order.
      {"wide 3x3", {1, 3, 2, 3}, {16, 3, 3, 3}, {.padding = {1, 1}}},
      {"wide 3x3 stride 2", {2, 3, 4, 4}, {40, 3, 3, 3}, {.stride = {2, 2}, .padding = {1, 1}}},
      {"wide dilated", {1, 2, 4, 5}, {24, 2, 3, 2}, {.padding = {2, 1}, .dilation = {2, 2}}},
      // Enough output pixels for one part per thread and several tiles per part.
      {"many pixels 3x3", {3, 64, 20, 20}, {8, 64, 3, 3}, {.padding = {1, 1}}},
      {"many pixels 1x1", {3, 16, 20, 20}, {8, 16, 1, 1}, {}},
  };
  return all;
}

// NHWC and NCHW sum in different orders: agreement to `rtol` of the result's largest
// magnitude (1e-4 in f32, 1e-10 in f64).
void check_same(const Tensor& actual, const Tensor& expected, double rtol) {
  double largest = 0;
  for (double v : values(expected)) largest = std::max(largest, std::abs(v));
  KILN_CHECK_CLOSE(actual, expected, rtol, rtol * std::max(1.0, largest));
}

double rtol_of(DType dtype) { return dtype == DType::f64 ? 1e-10 : 1e-4; }

Tensor nhwc(const Tensor& t) { return t.contiguous(MemoryFormat::channels_last); }

// Whether the NHWC layout is distinct from NCHW for this shape (more than one channel
// and more than one pixel), so a channels_last tensor of it is no contiguous one.
bool layouts_differ(const Shape& s) { return s[1] > 1 && s[2] * s[3] > 1; }

}  // namespace

TEST_CASE("conv2d channels_last: forward and gradients equal the NCHW kernels", "[conv]") {
  const DType dtype = GENERATE(DType::f32, DType::f64);
  const bool with_bias = GENERATE(false, true);
  for (const NhwcCase& c : nhwc_cases()) {
    INFO(c.what << " input " << shape_str(c.input) << " weight " << shape_str(c.weight) << " in "
                << name(dtype) << " bias " << with_bias);
    const Tensor x = randn(c.input, {.dtype = dtype}), w = randn(c.weight, {.dtype = dtype});
    const Tensor b = with_bias ? randn({c.weight[0]}, {.dtype = dtype}) : Tensor();
    const Tensor expected = conv2d(x, w, b, c.options);
    const Tensor g = randn(expected.shape(), {.dtype = dtype});
    const Tensor x_cl = nhwc(x), g_cl = nhwc(g);
    if (layouts_differ(c.input)) REQUIRE(x_cl.suggest_memory_format() == MemoryFormat::channels_last);

    const Tensor y = conv2d(x_cl, w, b, c.options);
    CHECK(y.dtype() == dtype);
    // The output follows the input's layout; where the input is also contiguous (one
    // channel, 1x1 images) so is the output.
    CHECK(y.is_contiguous(layouts_differ(c.input) ? MemoryFormat::channels_last
                                                  : MemoryFormat::contiguous));
    check_same(y, expected, rtol_of(dtype));
    // A channels_last weight (no reorder needed).
    check_same(conv2d(x_cl, nhwc(w), b, c.options), expected, rtol_of(dtype));

    const Tensor gx_expected = conv2d_backward_input(g, w, c.input, c.options);
    const Tensor gx = conv2d_backward_input(g_cl, w, c.input, c.options);
    CHECK(gx.is_contiguous(layouts_differ(g.shape()) ? MemoryFormat::channels_last
                                                     : MemoryFormat::contiguous));
    check_same(gx, gx_expected, rtol_of(dtype));
    check_same(conv2d_backward_input(g_cl, nhwc(w), c.input, c.options), gx_expected,
               rtol_of(dtype));

    const Tensor gw_expected = conv2d_backward_weight(g, x, c.weight, c.options);
    const Tensor gw = conv2d_backward_weight(g_cl, x_cl, c.weight, c.options);
    CHECK(gw.is_contiguous());
    check_same(gw, gw_expected, rtol_of(dtype));
    // A contiguous grad_out with a channels_last input (the loss's gradient, say).
    check_same(conv2d_backward_weight(g, x_cl, c.weight, c.options), gw_expected, rtol_of(dtype));
  }
}

TEST_CASE("conv2d channels_last: layouts follow the activation", "[conv]") {
  const Tensor x = randn({2, 3, 5, 4}), w = randn({4, 3, 3, 3});
  const Tensor y = conv2d(nhwc(x), w, {}, {.padding = {1, 1}});
  CHECK(y.suggest_memory_format() == MemoryFormat::channels_last);
  // A contiguous input keeps a contiguous output, whatever the weight's layout.
  CHECK(conv2d(x, nhwc(w), {}, {.padding = {1, 1}}).is_contiguous());
  const Tensor g = randn(y.shape());
  CHECK(conv2d_backward_input(nhwc(g), w, x.shape(), {.padding = {1, 1}}).suggest_memory_format() ==
        MemoryFormat::channels_last);
  CHECK(conv2d_backward_input(g, w, x.shape(), {.padding = {1, 1}}).is_contiguous());
  // The weight's gradient stays contiguous.
  CHECK(conv2d_backward_weight(nhwc(g), nhwc(x), w.shape(), {.padding = {1, 1}}).is_contiguous());
}

TEST_CASE("conv2d channels_last: into contiguous or strided outputs", "[conv]") {
  const Conv2dOptions o{.stride = {2, 1}, .padding = {1, 1}};
  const Tensor x = randn({2, 3, 6, 5}), w = randn({4, 3, 3, 3}), b = randn({4});
  const Tensor expected = conv2d(x, w, b, o);
  const Tensor g = randn(expected.shape());
  const Attrs attrs{{"stride", std::vector<int64_t>{2, 1}},
                    {"padding", std::vector<int64_t>{1, 1}},
                    {"dilation", std::vector<int64_t>{1, 1}},
                    {"groups", int64_t{1}}};
  // f32 1e-4 of the largest magnitude, as above.
  Tensor out = zeros(expected.shape());
  call_op_out(find_op("conv2d"), {nhwc(x), w, b}, attrs, out);
  check_same(out, expected, 1e-4);
  Tensor wide = zeros(expected.shape(), {.dtype = DType::f64});  // converted on the way
  call_op_out(find_op("conv2d"), {nhwc(x), w, b}, attrs, wide);
  check_same(wide, expected, 1e-4);
  Tensor strided = strided_copy(zeros(expected.shape()));
  call_op_out(find_op("conv2d"), {nhwc(x), w, b}, attrs, strided);
  check_same(strided, expected, 1e-4);

  Attrs input_attrs = attrs;
  input_attrs.set("input_size", x.shape());
  Tensor gx = zeros(x.shape());
  call_op_out(find_op("conv2d_backward_input"), {nhwc(g), w}, input_attrs, gx);
  check_same(gx, conv2d_backward_input(g, w, x.shape(), o), 1e-4);

  Attrs weight_attrs = attrs;
  weight_attrs.set("weight_size", w.shape());
  Tensor gw = nhwc(zeros(w.shape()));  // a channels_last target takes the result directly
  call_op_out(find_op("conv2d_backward_weight"), {nhwc(g), nhwc(x)}, weight_attrs, gw);
  check_same(gw, conv2d_backward_weight(g, x, w.shape(), o), 1e-4);
}

TEST_CASE("conv2d channels_last: f16 and bf16 compute in f32", "[conv]") {
  const DType dtype = GENERATE(DType::f16, DType::bf16);
  const Conv2dOptions o{.padding = {1, 1}};
  const Tensor x = randn({2, 4, 5, 6}).to(dtype), w = randn({3, 4, 3, 3}).to(dtype);
  const Tensor y = conv2d(nhwc(x), w, {}, o);
  CHECK(y.dtype() == dtype);
  CHECK(y.is_contiguous(MemoryFormat::channels_last));
  // Both round one f32 result once: equal up to a rounding step of the type.
  KILN_CHECK_CLOSE(y, conv2d(x, w, {}, o), tol(dtype), tol(dtype) * 8);
}

TEST_CASE("conv2d_backward_weight: a gradient to add to gives that plus the weight gradient", "[conv]") {
  const DType dtype = GENERATE(DType::f32, DType::f64);
  const OpDef& op = find_op("conv2d_backward_weight");
  for (const NhwcCase& c : nhwc_cases()) {
    INFO(c.what << " input " << shape_str(c.input) << " weight " << shape_str(c.weight) << " in " << name(dtype));
    const Tensor x = randn(c.input, {.dtype = dtype}), w = randn(c.weight, {.dtype = dtype});
    const Tensor g = randn(conv2d(x, w, Tensor(), c.options).shape(), {.dtype = dtype});
    const Tensor acc = randn(c.weight, {.dtype = dtype});
    Attrs attrs{{"stride", std::vector<int64_t>{c.options.stride[0], c.options.stride[1]}},
                {"padding", std::vector<int64_t>{c.options.padding[0], c.options.padding[1]}},
                {"dilation", std::vector<int64_t>{c.options.dilation[0], c.options.dilation[1]}},
                {"groups", c.options.groups}};
    attrs.set("weight_size", c.weight);
    // NCHW and NHWC activations; weights (the gradient added to and the result) contiguous
    // and channels_last: every path of the CPU kernel (summing into the target directly,
    // or computing apart and adding).
    for (bool activations_nhwc : {false, true}) {
      for (bool weight_nhwc : {false, true}) {
        INFO("activations " << (activations_nhwc ? "nhwc" : "nchw") << ", weight " << (weight_nhwc ? "nhwc" : "nchw"));
        const Tensor xa = activations_nhwc ? nhwc(x) : x, ga = activations_nhwc ? nhwc(g) : g;
        const Tensor added = weight_nhwc ? nhwc(acc) : acc;
        const Tensor expected = acc + conv2d_backward_weight(g, x, c.weight, c.options);
        check_same(conv2d_backward_weight(ga, xa, c.weight, c.options, added), expected, rtol_of(dtype));
        // In place, as the compiled program runs `grad += g`: the target is the gradient added to.
        Tensor target = weight_nhwc ? nhwc(added.clone()) : added.clone();
        void* const data = target.data_ptr();
        call_op_out(op, {ga, xa, target}, attrs, target);
        CHECK(target.data_ptr() == data);
        check_same(target, expected, rtol_of(dtype));
      }
    }
  }
  const Tensor x = randn({2, 3, 5, 5}), g = randn({2, 4, 5, 5});
  CHECK_THROWS_WITH(conv2d_backward_weight(g, x, {4, 3, 3, 3}, {.padding = {1, 1}}, zeros({4, 3, 3, 2})),
                    Catch::Contains("conv2d_backward_weight: the gradient to add to is [4,3,3,2]"));
  CHECK_THROWS_WITH(conv2d_backward_weight(g, x, {4, 3, 3, 3}, {.padding = {1, 1}}, zeros({4, 3, 3, 3}, {.dtype = DType::f64})),
                    Catch::Contains("conv2d_backward_weight"));
}

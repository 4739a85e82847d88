// Pooling on channels_last (NHWC) tensors against the same ops on contiguous copies: max
// pooling and its indices (the flat h * W + w in the input plane, whatever the layout) are
// exact; averages and gradients agree to testing::tol(dtype) (f32 1e-5, f64 1e-12; relative,
// and absolute for values near 0). Outputs follow the input's layout; the backward ops'
// grad_input is channels_last when grad_out is or their `channels_last` attribute asks.
// Channel counts of 260 cross the NHWC backward's 256-channel task blocks.
#include "core/ops/norm.h"
#include "core/ops/pool.h"
#include "core/registry.h"
#include "channels_last_testing.h"

using namespace kiln;
using namespace kiln::testing;

namespace {

// A pooling window: kernel, stride, padding.
struct Window {
  std::vector<int64_t> kernel, stride, padding;
};
const std::vector<Window> kWindows = {{{3}, {2}, {1}}, {{2}, {2}, {0}}};
const std::vector<Shape> kShapes = {{2, 3, 7, 6}, {1, 260, 5, 4}};

// Runs backward op `op` with the channels_last attribute set, as autograd does for a
// channels_last forward input.
Tensor backward_channels_last(const char* op, std::vector<Tensor> inputs, Attrs attrs) {
  attrs.set("channels_last", true);
  return call_op1(find_op(op), std::move(inputs), attrs);
}

}  // namespace

TEST_CASE("max_pool2d_with_indices on a channels_last input equals the contiguous one", "[pool]") {
  const DType dtype = GENERATE(DType::f32, DType::f64);
  const Shape shape = GENERATE_COPY(from_range(kShapes));
  const Window w = GENERATE_COPY(from_range(kWindows));
  INFO(name(dtype) << " " << shape_str(shape) << " kernel " << w.kernel[0]);
  // Values truncated to integers make ties, which both layouts must break alike (the
  // first maximum).
  const Tensor x = (random_of(shape, dtype, 1) * 2.0).to(DType::i64).to(dtype);
  const MaxPool2dResult expected = max_pool2d_with_indices(x, w.kernel, w.stride, w.padding);
  const MaxPool2dResult actual = max_pool2d_with_indices(nhwc(x), w.kernel, w.stride, w.padding);
  CHECK(is_nhwc(actual.values));
  CHECK(is_nhwc(actual.indices));
  KILN_CHECK_EQUAL(actual.values, expected.values);
  KILN_CHECK_EQUAL(actual.indices, expected.indices);

  const Tensor g = random_of(expected.values.shape(), dtype, 2);
  const Tensor grad_expected = max_pool2d_backward(g, expected.indices, shape);
  const Tensor grad_actual = max_pool2d_backward(nhwc(g), actual.indices, shape);
  CHECK(is_nhwc(grad_actual));
  CHECK_SAME_VALUES(grad_actual, grad_expected, dtype);
  // A contiguous grad_out with the attribute (indices in either layout).
  const Tensor grad_asked =
      backward_channels_last("max_pool2d_backward", {g, expected.indices}, {{"input_size", shape}});
  CHECK(is_nhwc(grad_asked));
  CHECK_SAME_VALUES(grad_asked, grad_expected, dtype);
  CHECK(grad_expected.is_contiguous());
}

TEST_CASE("avg_pool2d on a channels_last input equals the contiguous one", "[pool]") {
  const DType dtype = GENERATE(DType::f32, DType::f64);
  const Shape shape = GENERATE_COPY(from_range(kShapes));
  const Window w = GENERATE_COPY(from_range(kWindows));
  const bool count_include_pad = GENERATE(true, false);
  INFO(name(dtype) << " " << shape_str(shape) << " kernel " << w.kernel[0] << " count_include_pad "
                   << count_include_pad);
  const Tensor x = random_of(shape, dtype, 3);
  const Tensor expected = avg_pool2d(x, w.kernel, w.stride, w.padding, false, count_include_pad);
  const Tensor actual =
      avg_pool2d(nhwc(x), w.kernel, w.stride, w.padding, false, count_include_pad);
  CHECK(is_nhwc(actual));
  CHECK_SAME_VALUES(actual, expected, dtype);

  const Tensor g = random_of(expected.shape(), dtype, 4);
  const Tensor grad_expected =
      avg_pool2d_backward(g, shape, w.kernel, w.stride, w.padding, false, count_include_pad);
  const Tensor grad_actual =
      avg_pool2d_backward(nhwc(g), shape, w.kernel, w.stride, w.padding, false, count_include_pad);
  CHECK(is_nhwc(grad_actual));
  CHECK(grad_expected.is_contiguous());
  CHECK_SAME_VALUES(grad_actual, grad_expected, dtype);
}

TEST_CASE("adaptive_avg_pool2d on a channels_last input equals the contiguous one", "[pool]") {
  const DType dtype = GENERATE(DType::f32, DType::f64);
  const Shape shape = GENERATE_COPY(from_range(kShapes));
  const std::vector<int64_t> size =
      GENERATE(std::vector<int64_t>{1, 1}, std::vector<int64_t>{2, 3});
  INFO(name(dtype) << " " << shape_str(shape) << " to " << size[0] << "x" << size[1]);
  const Tensor x = random_of(shape, dtype, 5);
  const Tensor expected = adaptive_avg_pool2d(x, size);
  const Tensor actual = adaptive_avg_pool2d(nhwc(x), size);
  // A [N, C, 1, 1] result is both layouts; a larger one must be NHWC.
  CHECK(actual.is_contiguous(kNhwc));
  if (size[0] * size[1] > 1) CHECK(is_nhwc(actual));
  CHECK_SAME_VALUES(actual, expected, dtype);

  const Tensor g = random_of(expected.shape(), dtype, 6);
  const Tensor grad_expected = adaptive_avg_pool2d_backward(g, shape);
  CHECK(grad_expected.is_contiguous());
  // A [N, C, 1, 1] grad_out counts as contiguous: the attribute asks for channels_last.
  const Tensor grad_asked =
      backward_channels_last("adaptive_avg_pool2d_backward", {g}, {{"input_size", shape}});
  CHECK(is_nhwc(grad_asked));
  CHECK_SAME_VALUES(grad_asked, grad_expected, dtype);
  if (size[0] * size[1] > 1) {
    const Tensor grad_actual = adaptive_avg_pool2d_backward(nhwc(g), shape);
    CHECK(is_nhwc(grad_actual));
    CHECK_SAME_VALUES(grad_actual, grad_expected, dtype);
  }
}

TEST_CASE("pooling writes into targets of any strides", "[pool]") {
  const Tensor x = random_of({2, 3, 6, 5}, DType::f32, 7);
  const Tensor expected = avg_pool2d(x, {3}, {2}, {1});
  const Attrs attrs{{"kernel_size", std::vector<int64_t>{3}},
                    {"stride", std::vector<int64_t>{2}},
                    {"padding", std::vector<int64_t>{1}}};
  for (const Tensor& input : {x, nhwc(x)}) {
    // Contiguous, channels_last, and strided (every other element) targets.
    Tensor contiguous_out = zeros(expected.shape());
    Tensor nhwc_out = zeros(expected.shape()).contiguous(kNhwc);
    Tensor strided_out = strided_copy(zeros(expected.shape()));
    for (const Tensor& out : {contiguous_out, nhwc_out, strided_out}) {
      call_op_out(find_op("avg_pool2d"), {input}, attrs, out);
      CHECK_SAME_VALUES(out, expected, DType::f32);
    }
  }
}

TEST_CASE("pool backward ops refuse channels_last for a 3-d input", "[pool]") {
  const Tensor g = zeros({3, 1, 1});
  CHECK_THROWS_WITH(
      backward_channels_last("adaptive_avg_pool2d_backward", {g}, {{"input_size", Shape{3, 4, 4}}}),
      Catch::Contains("adaptive_avg_pool2d_backward") && Catch::Contains("4-d"));
}

TEST_CASE(
    "a channels_last batch_norm relu max_pool global-average chain gives the contiguous gradients "
    "in channels_last",
    "[pool][norm]") {
  const Shape shape{2, 6, 8, 7};
  const Tensor x0 = random_of(shape, DType::f64, 8);
  const Tensor w0 = random_of({6}, DType::f64, 9) * 0.5 + 1.0, b0 = random_of({6}, DType::f64, 10);
  struct Grads {
    Tensor x, w, b;
    Tensor x_arriving;  // x's gradient as backward delivers it, before .grad stores a copy
  };
  auto run = [&](const Tensor& input) {
    Tensor x = input.clone().contiguous(input.suggest_memory_format());
    Tensor w = w0.clone(), b = b0.clone();
    for (Tensor* t : {&x, &w, &b}) t->requires_grad_();
    Tensor x_arriving;
    x.register_hook([&x_arriving](const Tensor& g) {
      x_arriving = g;
      return Tensor();
    });
    Tensor y = batch_norm(x, w, b, {}, {}, true);
    y = relu(y);
    y = max_pool2d(y, {3}, {2}, {1});
    y = adaptive_avg_pool2d(y, {1, 1});
    // Weighted so that every channel's gradient differs.
    sum(y * arange(1, 13, 1, {.dtype = DType::f64}).reshape({2, 6, 1, 1})).backward();
    return Grads{x.grad(), w.grad(), b.grad(), x_arriving};
  };
  const Grads expected = run(x0);
  const Grads actual = run(nhwc(x0));
  CHECK(expected.x_arriving.is_contiguous());
  // Every backward op on the way keeps channels_last (the leaf's .grad is a copy the
  // engine makes, in its own layout).
  CHECK(is_nhwc(actual.x_arriving));
  CHECK_SAME_VALUES(actual.x_arriving, expected.x_arriving, DType::f64);
  CHECK_SAME_VALUES(actual.x, expected.x, DType::f64);
  CHECK_SAME_VALUES(actual.w, expected.w, DType::f64);
  CHECK_SAME_VALUES(actual.b, expected.b, DType::f64);
}

// Tensor basics: item, dtype conversion for every pair, clone, copy_, from_blob,
// from_vector, and the text of the core's error messages (devices, broadcasting,
// unsupported dtypes, dims out of range).
#include "testing.h"

using namespace kiln;
using namespace kiln::testing;

TEST_CASE("arange / reshape and broadcasting add", "[core]") {
  Tensor a = arange(6, {.dtype = DType::f32}).reshape({2, 3});
  Tensor b = from_vector<float>({10, 20, 30});
  KILN_CHECK_EQUAL(a + b, tensor_of({10, 21, 32, 13, 24, 35}, {2, 3}));
  CHECK((a + b).dtype() == DType::f32);
}

TEST_CASE("item reads the single element in any type", "[core]") {
  CHECK(scalar_tensor(2.75, DType::f32).item<float>() == 2.75f);
  CHECK(scalar_tensor(2.75, DType::f64).item<int64_t>() == 2);
  CHECK(scalar_tensor(-3, DType::i32).item<double>() == -3.0);
  CHECK(scalar_tensor(1.5, DType::f16).item<float>() == 1.5f);
  CHECK(scalar_tensor(1.5, DType::bf16).item<double>() == 1.5);
  CHECK(scalar_tensor(true, DType::boolean).item<bool>());
  CHECK(scalar_tensor(200, DType::u8).item<int32_t>() == 200);
  CHECK(static_cast<float>(scalar_tensor(0.5, DType::f32).item<Half>()) == 0.5f);
  CHECK(from_vector<float>({7}, {1, 1}).item<float>() == 7);
  // Scalar item keeps the category.
  CHECK(scalar_tensor(3, DType::i32).item().kind() == DType::i64);
  CHECK(scalar_tensor(3, DType::f16).item().is_floating());
  CHECK(scalar_tensor(true, DType::boolean).item().kind() == DType::boolean);
  // A strided one-element view reads the right element.
  CHECK(arange(10, {.dtype = DType::i64}).slice(0, 7, 8).item<int64_t>() == 7);
  CHECK_THROWS_WITH(zeros({2}).item<float>(),
                    Catch::Contains("item: a tensor with 2 elements") && Catch::Contains("f32[2]"));
  CHECK_THROWS_WITH(zeros({0}).item<float>(), Catch::Contains("0 elements"));
}

TEST_CASE("to converts between every pair of dtypes", "[core]") {
  const std::vector<double> src = {0, 1, 2, 5, 100};
  for (DType from : kAllDTypes) {
    const Tensor x = tensor_of(src, {5}, from);
    const std::vector<double> in = values(x);  // after the first conversion
    for (DType to : kAllDTypes) {
      INFO(name(from) << " -> " << name(to));
      Tensor y = x.to(to);
      CHECK(y.dtype() == to);
      CHECK(y.shape() == Shape{5});
      std::vector<double> expected = in;
      if (to == DType::boolean)
        for (double& v : expected) v = v != 0;
      CHECK(values(y) == expected);
      if (to == from) CHECK(y.same(x));
    }
  }
  CHECK(values(tensor_of({2.7, -2.7, 0.2}, {3}).to(DType::i32)) == std::vector<double>{2, -2, 0});
  CHECK(values(tensor_of({0.5, -0.0, NAN}, {3}).to(DType::boolean)) ==
        std::vector<double>{1, 0, 1});
  // A strided source converts element by element.
  Tensor t = arange(6, {.dtype = DType::i64}).view({2, 3}).t().to(DType::f16);
  CHECK(t.is_contiguous());
  CHECK(values(t) == std::vector<double>{0, 3, 1, 4, 2, 5});
}

TEST_CASE("clone makes a contiguous copy with its own storage", "[core]") {
  Tensor x = arange(6, {.dtype = DType::f32}).view({2, 3});
  Tensor c = x.clone();
  CHECK(c.storage() != x.storage());
  CHECK(values(c) == values(x));
  c.fill_(0);
  CHECK(values(x) == std::vector<double>{0, 1, 2, 3, 4, 5});
  Tensor ct = x.t().clone();
  CHECK(ct.is_contiguous());
  CHECK(ct.shape() == Shape{3, 2});
  CHECK(values(ct) == std::vector<double>{0, 3, 1, 4, 2, 5});
  Tensor e = x.select(1, 0).unsqueeze(1).expand({2, 4}).clone();
  CHECK(e.strides() == Shape{4, 1});
  CHECK(values(e) == std::vector<double>{0, 0, 0, 0, 3, 3, 3, 3});
}

TEST_CASE("copy_ broadcasts and converts", "[core]") {
  Tensor dst = zeros({2, 3});
  dst.copy_(from_vector<int32_t>({1, 2, 3}));
  CHECK(dst.dtype() == DType::f32);
  CHECK(values(dst) == std::vector<double>{1, 2, 3, 1, 2, 3});
  Tensor i = zeros({3}, {.dtype = DType::i32});
  i.copy_(from_vector<double>({1.9, -1.9, 7}));  // copy_ allows float -> int, truncating
  CHECK(values(i) == std::vector<double>{1, -1, 7});
  Tensor base = zeros({3, 4});
  base.slice(1, 0, 4, 2).copy_(from_vector<float>({5, 6, 7, 8, 9, 10}, {3, 2}));
  CHECK(values(base) == std::vector<double>{5, 0, 6, 0, 7, 0, 8, 0, 9, 0, 10, 0});
  base.t().copy_(from_vector<float>({1, 2, 3}));  // each column of base.t() gets a value
  CHECK(values(base) == std::vector<double>{1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3});
  Tensor b = zeros({2}, {.dtype = DType::boolean});
  b.copy_(from_vector<float>({0, 0.25}));
  CHECK(values(b) == std::vector<double>{0, 1});
  CHECK_THROWS_WITH(zeros({2, 3}).copy_(zeros({4})), Catch::Contains("copy_"));
  CHECK_THROWS_AS(zeros({2}).copy_(Tensor()), Error);
}

TEST_CASE("from_blob wraps user memory without copying", "[core]") {
  std::vector<float> data = {1, 2, 3, 4, 5, 6};
  Tensor t = from_blob(data.data(), {2, 3}, DType::f32);
  CHECK(t.data_ptr() == data.data());
  data[4] = 50;
  CHECK(at(t, {1, 1}) == 50);
  t.mul_(2);
  CHECK(data == std::vector<float>{2, 4, 6, 8, 100, 12});
  Tensor col = from_blob(data.data(), {2}, DType::f32, {3});  // column 0 via strides
  CHECK(values(col) == std::vector<double>{2, 8});
  CHECK(values(col + 1) == std::vector<double>{3, 9});
  std::vector<int32_t> ints = {7, 8};
  CHECK(values(from_blob(ints.data(), {2}, DType::i32)) == std::vector<double>{7, 8});
  CHECK_THROWS_WITH(from_blob(nullptr, {2}, DType::f32),
                    Catch::Contains("from_blob: data is null"));
  CHECK_THROWS_WITH(from_blob(data.data(), {2}, DType::f32, {1, 1}),
                    Catch::Contains("differ in length"));
}

TEST_CASE("from_vector copies values into the given shape", "[core]") {
  std::vector<int64_t> v = {1, 2, 3, 4, 5, 6};
  Tensor t = from_vector(v, {2, 3});
  v[0] = 100;  // a copy: the tensor does not see it
  CHECK(t.dtype() == DType::i64);
  CHECK(t.shape() == Shape{2, 3});
  CHECK(at(t, {0, 0}) == 1);
  CHECK(from_vector<float>({1, 2, 3}).shape() == Shape{3});
  CHECK(from_vector<float>({4}, {1}).shape() == Shape{1});
  // No shape means [values.size()], as torch.tensor([4.]) has shape [1]; Shape{} is 0-d.
  CHECK(from_vector<float>({4}).shape() == Shape{1});
  CHECK(from_vector<float>({4}, Shape{}).dim() == 0);
  CHECK(from_vector<bool>({true, false, true}).dtype() == DType::boolean);
  CHECK(values(from_vector<bool>({true, false, true})) == std::vector<double>{1, 0, 1});
  Tensor h = from_vector<int32_t>({1, 2}, {.dtype = DType::f16, .requires_grad = true});
  CHECK(h.dtype() == DType::f16);
  CHECK(h.requires_grad());
  CHECK_THROWS_WITH(from_vector<float>({1, 2, 3}, {2, 2}),
                    Catch::Contains("from_vector: 3 values do not fill shape [2,2]"));
  CHECK_THROWS_AS(from_vector<float>({}, {1}), Error);
}

TEST_CASE("common_device rejects mixed devices and lets 0-d CPU tensors join", "[core]") {
  const TensorMeta cpu{{2}, DType::f32, Device::cpu()};
  const TensorMeta gpu{{2}, DType::f32, Device::cuda(0)};
  const TensorMeta gpu1{{2}, DType::f32, Device::cuda(1)};
  const TensorMeta cpu_0d{{}, DType::f32, Device::cpu()};
  const TensorMeta number{{}, DType::f64, Device::cpu(), true};
  std::vector<TensorMeta> mixed = {cpu, gpu};
  CHECK_THROWS_WITH(
      common_device(mixed, "add"),
      Catch::Contains("add: expected all tensors on one device, got cpu and cuda:0") &&
          Catch::Contains("f32[2] cuda:0"));
  std::vector<TensorMeta> two_gpus = {gpu, gpu1};
  CHECK_THROWS_WITH(common_device(two_gpus, "mul"), Catch::Contains("cuda:0 and cuda:1"));
  std::vector<TensorMeta> with_0d = {cpu_0d, gpu, number};
  CHECK(common_device(with_0d, "add") == Device::cuda(0));
  std::vector<TensorMeta> only_cpu_0d = {cpu_0d, number};
  CHECK(common_device(only_cpu_0d, "add") == Device::cpu());
  // The elementwise rules use it: the infer function of add rejects mixed devices.
  CHECK_THROWS_WITH(find_op("add").infer(mixed, {}), Catch::Contains("add: expected all tensors"));
}

TEST_CASE("a CUDA tensor cannot be created without a GPU", "[core]") {
  if (cuda::is_available()) {
    WARN("skipped: this machine has a GPU");
    return;
  }
  CHECK_THROWS_WITH(zeros({2}, {.device = Device::cuda(0)}),
                    Catch::Contains("cuda:0") && Catch::Contains("not available"));
  CHECK_THROWS_AS(from_vector<float>({1, 2}).to(Device::cuda(0)), Error);
  CHECK(from_vector<float>({1, 2}).to(Device::cpu()).device() == Device::cpu());
}

TEST_CASE("error messages name the op and show shapes and dtypes", "[core]") {
  CHECK_THROWS_WITH(zeros({2, 3}) + zeros({4}),
                    Catch::Contains("add: shapes [2,3], [4] cannot be broadcast together"));
  CHECK_THROWS_WITH(mul(zeros({2, 1, 3}), zeros({5, 2})), Catch::Contains("mul") &&
                                                              Catch::Contains("[2,1,3]") &&
                                                              Catch::Contains("[5,2]"));
  Tensor b = from_vector<bool>({true, false});
  CHECK_THROWS_WITH(neg(b), Catch::Contains("neg: bool tensors are not supported") &&
                                Catch::Contains("bool[2] cpu"));
  CHECK_THROWS_WITH(b - b, Catch::Contains("sub: bool tensors are not supported"));
  CHECK_THROWS_WITH(zeros({2, 3}).size(2),
                    Catch::Contains("dim 2 is out of range for a tensor of 2 dims"));
  CHECK_THROWS_WITH(zeros({2, 3}).transpose(0, -3),
                    Catch::Contains("transpose: dim -3 is out of range"));
  CHECK_THROWS_WITH(zeros({2, 3}).t().view({6}), Catch::Contains("use reshape"));
  CHECK_THROWS_WITH(where(zeros({2}), zeros({2}), zeros({2})),
                    Catch::Contains("where: the condition must be bool"));
  CHECK_THROWS_WITH(gelu(zeros({2}), "fast"), Catch::Contains("gelu: approximate must be"));
  CHECK_THROWS_WITH(zeros({-1}), Catch::Contains("negative size"));
  CHECK_THROWS_WITH(find_op("no_such_op"), Catch::Contains("no op named 'no_such_op'"));
}

TEST_CASE("an in-place target may be an input only where the op reads it at the element it writes", "[core]") {
  // Elementwise ops read each input at the element they write: x.add_(x) doubles x.
  Tensor x = arange(4, {.dtype = DType::f32});
  x.add_(x);
  CHECK(x[3].item<float>() == 6.0f);
  // addmm adds its product to a bias of the product's shape (its accumulator), read only at
  // the element written: the bias may be the target.
  const Tensor a = arange(6, {.dtype = DType::f32}).reshape({2, 3}), b = ones({3, 2});
  Tensor acc = ones({2, 2});
  call_op_out(find_op("addmm"), {acc, a, b}, {}, acc);
  CHECK(acc[1][0].item<float>() == 13.0f);  // 1 + 3 + 4 + 5
  // An operand of the product that is the target would be read after it is written.
  Tensor sq = arange(4, {.dtype = DType::f32}).reshape({2, 2});
  CHECK_THROWS_WITH(call_op_out(find_op("addmm"), {zeros({2, 2}), sq, sq}, {}, sq),
                    Catch::Contains("addmm: input 1") && Catch::Contains("is the in-place target itself"));
  CHECK_THROWS_WITH(call_op_out(find_op("mm"), {sq, eye(2)}, {}, sq), Catch::Contains("mm: input 0"));
  CHECK(sq[1][1].item<float>() == 3.0f);  // untouched
}

TEST_CASE("in-place writes that would race with their reads are errors", "[core]") {
  Tensor m = arange(12, {.dtype = DType::f32}).reshape({3, 4});
  // An input that partly overlaps the target (its first row) would be read after writes.
  Tensor flat = m.flatten();
  Tensor tail = flat.slice(0, 2, 12);
  CHECK_THROWS_WITH(flat.slice(0, 0, 10).add_(tail),
                    Catch::Contains("add") && Catch::Contains("overlaps"));
  // A transpose of the target covers the same memory in another order.
  Tensor sq = arange(9, {.dtype = DType::f32}).reshape({3, 3});
  CHECK_THROWS_WITH(sq.add_(sq.t()), Catch::Contains("add") && Catch::Contains("overlaps"));
  CHECK_THROWS_WITH(sq.copy_(sq.t()), Catch::Contains("overlaps"));
  CHECK_THROWS_WITH(sq.t().add_(sq), Catch::Contains("overlaps"));
  CHECK(sq.add_(sq.t().clone())[0][1].item<float>() == 4.0f);
  // A target whose elements share memory.
  Tensor row = zeros({4});
  Tensor expanded = row.expand({3, 4});
  CHECK_THROWS_WITH(expanded.add_(1), Catch::Contains("share memory"));
  // The target itself, disjoint views of one storage, and broadcast reads are fine.
  m.add_(m);
  CHECK(m[1][1].item<float>() == 10.0f);
  m.slice(0, 0, 1).copy_(m.slice(0, 2, 3));
  CHECK(m[0][0].item<float>() == 16.0f);
  m.mul_(row.add_(2));
  CHECK(m[1][1].item<float>() == 20.0f);
}

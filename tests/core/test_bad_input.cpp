// User mistakes that once crashed the process or gave silent garbage; each is now a
// kiln::Error that names the op.
#include <cmath>

#include "testing.h"

using namespace kiln;

TEST_CASE("an undefined tensor is an error / not a crash", "[core][errors]") {
  Tensor u;
  CHECK_THROWS_WITH(u.reshape({1}), Catch::Contains("undefined"));
  CHECK_THROWS_WITH(u.dim(), Catch::Contains("undefined"));
  CHECK_THROWS_WITH(u.shape(), Catch::Contains("undefined"));
  CHECK_THROWS_WITH(u.contiguous(), Catch::Contains("undefined"));
  CHECK_THROWS_AS(u + ones({2}), Error);
  CHECK_THROWS_AS(zeros({2}).copy_(u), Error);
  CHECK_THROWS_AS(zeros_like(u), Error);
}

TEST_CASE("shapes whose element or byte count overflows are errors", "[core][errors]") {
  CHECK_THROWS_WITH(zeros({int64_t{1} << 32, int64_t{1} << 32}), Catch::Contains("int64"));
  CHECK_THROWS_WITH(empty({int64_t{1} << 62}), Catch::Contains("bytes"));
}

TEST_CASE("expand rejects negative sizes other than -1", "[core][errors]") {
  CHECK_THROWS_WITH(ones({1}).expand({-2}), Catch::Contains("expand") && Catch::Contains("-2"));
}

TEST_CASE("numbers that an integer dtype cannot hold are errors", "[core][errors]") {
  CHECK_THROWS_WITH(zeros({2}, {.dtype = DType::i64}).fill_(NAN),
                    Catch::Contains("fill") && Catch::Contains("cannot be converted"));
  CHECK_THROWS_WITH(full({2}, INFINITY, {.dtype = DType::i32}), Catch::Contains("full"));
  CHECK_THROWS_WITH(clamp(arange(3, {.dtype = DType::u8}), -1, std::nullopt),
                    Catch::StartsWith("clamp:") && Catch::Contains("u8"));
  CHECK_THROWS_WITH(full({1}, 300, {.dtype = DType::u8}), Catch::Contains("300"));
  CHECK(full({1}, -128, {.dtype = DType::i32}).item<int32_t>() == -128);
  CHECK(full({1}, 255, {.dtype = DType::u8}).item<int64_t>() == 255);
}

TEST_CASE("a floating alpha cannot scale an integer result", "[core][errors]") {
  Tensor i = arange(3);
  CHECK_THROWS_WITH(add(i, ones({3}, {.dtype = DType::i64}), 0.5),
                    Catch::Contains("add") && Catch::Contains("alpha"));
  CHECK_THROWS_WITH(i.sub_(i, 1.5), Catch::Contains("sub"));
  CHECK(add(i.to(DType::f32), i, 0.5)[2].item<float>() == 3.0f);
}

TEST_CASE("integers to negative integer powers are errors", "[core][errors]") {
  CHECK_THROWS_WITH(pow(arange(1, 4), -1), Catch::Contains("pow") && Catch::Contains("negative"));
  CHECK(pow(arange(1, 4).to(DType::f32), -1)[1].item<float>() == 0.5f);
}

TEST_CASE("arange with infinite bounds / from_blob with negative strides", "[core][errors]") {
  CHECK_THROWS_WITH(arange(0.0, INFINITY), Catch::Contains("arange") && Catch::Contains("finite"));
  float data[4] = {0, 1, 2, 3};
  CHECK_THROWS_WITH(from_blob(data, {2}, DType::f32, {-1}), Catch::Contains("from_blob"));
}

TEST_CASE("layer_norm over zero elements is an error", "[core][errors]") {
  CHECK_THROWS_WITH(layer_norm(zeros({2, 0}), {0}), Catch::Contains("layer_norm"));
}

TEST_CASE("an attribute of the wrong type is a kiln::Error naming the op", "[core][errors]") {
  CHECK_THROWS_WITH(call_op1(find_op("view"), {ones({4})}, {{"shape", 2.0}}),
                    Catch::StartsWith("view:") && Catch::Contains("wrong type"));
  CHECK_THROWS_WITH(call_op1(find_op("view"), {ones({4})}), Catch::Contains("missing"));
}

// The op hook (OpHookGuard): it sees each top-level op call with its name, inputs,
// attributes and outputs; calls a kernel makes internally are not reported; guards nest.
#include "testing.h"

using namespace kiln;
using namespace kiln::testing;

namespace {

struct Seen {
  std::string op;
  std::vector<std::string> inputs;  // meta strings
  std::string attrs;
  std::vector<std::string> outputs;
  bool inplace = false;
  std::vector<Tensor> output_tensors;
};

// Records every call the hook sees while it lives.
class Recorder {
 public:
  Recorder()
      : guard_([this](const OpCall& c) {
          Seen s{c.op.name, {}, c.attrs.to_string(), {}, c.inplace, {}};
          for (const Tensor& t : c.inputs) s.inputs.push_back(t.meta_str());
          for (const Tensor& t : c.outputs) {
            s.outputs.push_back(t.meta_str());
            s.output_tensors.push_back(t);
          }
          calls.push_back(std::move(s));
        }) {}
  std::vector<std::string> names() const {
    std::vector<std::string> n;
    for (const Seen& s : calls) n.push_back(s.op);
    return n;
  }
  std::vector<Seen> calls;

 private:
  OpHookGuard guard_;
};

using Names = std::vector<std::string>;

}  // namespace

TEST_CASE("the hook sees a top-level op with inputs / attrs and outputs", "[hook]") {
  Tensor a = ones({2, 3});
  Tensor b = ones({3});
  Recorder r;
  Tensor c = add(a, b, 2);
  REQUIRE(r.calls.size() == 1);
  const Seen& s = r.calls[0];
  CHECK(s.op == "add");
  CHECK(s.inputs == std::vector<std::string>{"f32[2,3] cpu", "f32[3] cpu"});
  CHECK(s.attrs == "{alpha=2}");
  CHECK(s.outputs == std::vector<std::string>{"f32[2,3] cpu"});
  CHECK_FALSE(s.inplace);
  CHECK(s.output_tensors[0].same(c));  // the very tensor the caller gets
  Tensor g = gelu(a, "tanh");
  CHECK(r.calls.back().op == "gelu");
  CHECK(r.calls.back().attrs == "{approximate=\"tanh\"}");
  (void)clamp(a, 0, std::nullopt);
  CHECK(r.calls.back().attrs == "{min=0}");
  (void)(a * 0.5);
  CHECK(r.calls.back().inputs == std::vector<std::string>{"f32[2,3] cpu", "f64[] cpu"});
}

TEST_CASE("ops a kernel runs inside are not reported", "[hook]") {
  Tensor i = from_vector<int32_t>({1, 2, 3});
  Tensor f = from_vector<float>({0.5, 0.5, 0.5});
  Recorder r;
  Tensor s = i + f;  // the kernel casts i to f32 with a nested cast op
  CHECK(r.names() == Names{"add"});
  CHECK(values(s) == std::vector<double>{1.5, 2.5, 3.5});
  (void)exp(i);  // integer input: converted to f32 inside
  CHECK(r.names() == Names{"add", "exp"});
  Tensor h = from_vector<float>({1, 2}).to(DType::f16);
  r.calls.clear();
  h.add_(from_vector<float>({1, 1}));  // computes in f32 and casts into h inside
  CHECK(r.names() == Names{"add"});
}

TEST_CASE("in-place calls are reported with inplace = true", "[hook]") {
  Tensor x = zeros({2, 2});
  const Tensor row = ones({2}), ints = ones({2, 2}, {.dtype = DType::i32});
  Recorder r;
  x.add_(1);
  x.mul_(row);
  x.fill_(3);
  x.copy_(ints);
  relu_(x);
  REQUIRE(r.calls.size() == 5);
  CHECK(r.names() == Names{"add", "mul", "fill", "cast", "relu"});
  for (const Seen& s : r.calls) {
    CHECK(s.inplace);
    CHECK(s.output_tensors.at(0).same(x));
  }
  CHECK(r.calls[2].attrs == "{value=3}");
  CHECK(r.calls[3].attrs == "{dtype=f32}");
  Tensor y = x + 1;
  CHECK_FALSE(r.calls.back().inplace);
}

TEST_CASE("view ops and factories are reported", "[hook]") {
  Tensor x = ones({2, 3});
  Recorder r;
  Tensor v = x.view({3, 2});
  Tensor t = x.t();
  Tensor s = x.slice(1, 0, 2);
  Tensor e = x.unsqueeze(0).expand({4, 2, 3});
  Tensor z = zeros({2});
  CHECK(r.names() == Names{"view", "permute", "slice", "unsqueeze", "expand", "full"});
  CHECK(r.calls[0].attrs == "{shape=[3,2]}");
  CHECK(r.calls[1].attrs == "{dims=[1,0]}");
  CHECK(r.calls[0].outputs == std::vector<std::string>{"f32[3,2] cpu"});
  CHECK(r.calls[0].output_tensors[0].same(v));
  r.calls.clear();
  (void)t.reshape({6});  // not viewable: a copy, then a view of it
  CHECK(r.names() == Names{"clone", "view"});
  r.calls.clear();
  (void)x.reshape({6});
  CHECK(r.names() == Names{"view"});
}

TEST_CASE("hook guards nest and restore", "[hook]") {
  Tensor x = ones({2});
  std::vector<std::string> outer, inner;
  {
    OpHookGuard g1([&](const OpCall& c) { outer.push_back(c.op.name); });
    (void)neg(x);
    {
      OpHookGuard g2([&](const OpCall& c) { inner.push_back(c.op.name); });
      (void)exp(x);
    }
    (void)sin(x);
  }
  (void)cos(x);  // no hook any more
  CHECK(outer == std::vector<std::string>{"neg", "sin"});
  CHECK(inner == std::vector<std::string>{"exp"});
}

TEST_CASE("a failing op is not reported", "[hook]") {
  Recorder r;
  CHECK_THROWS_AS(ones({2}) + ones({3}), Error);
  CHECK(r.names() == Names{"full", "full"});
}

// nn::Module: registration, handle semantics, traversal, modes, conversion, gradients,
// state dicts and printing.
#include <sstream>

#include "models/functional.h"
#include "models/init.h"
#include "models/layers.h"
#include "testing.h"

using namespace kiln;
using kiln::testing::values;

namespace {

struct Block : nn::Module {
  nn::Conv2d conv = add("conv", nn::Conv2d(4, 4, 3, {.padding = 1, .bias = false}));
  nn::BatchNorm2d bn = add("bn", nn::BatchNorm2d(4));
  Tensor forward(const Tensor& x) override { return relu(bn(conv(x)) + x); }
};

struct Net : nn::Module {
  Tensor scale = add_parameter("scale", ones({1}));
  nn::Sequential layer1 = add("layer1", nn::Sequential(Block(), Block()));
  nn::Linear fc = add("fc", nn::Linear(4, 2));
};

// An MLP made of elementwise ops (the only ones with backward formulas in this tree).
struct ElementwiseMlp : nn::Module {
  Tensor w1 = add_parameter("w1", full({3}, 2.0));
  Tensor b1 = add_parameter("b1", full({3}, 0.5));
  Tensor w2 = add_parameter("w2", full({3}, -1.0));
  Tensor forward(const Tensor& x) override { return (x * w1 + b1) * w2; }
};

int64_t count_parameters(const nn::Module& m) {
  int64_t n = 0;
  for (const Tensor& p : m.parameters()) n += p.numel();
  return n;
}

std::vector<std::string> names_of(const std::vector<std::pair<std::string, Tensor>>& named) {
  std::vector<std::string> out;
  for (const auto& [name, t] : named) out.push_back(name);
  return out;
}

}  // namespace

TEST_CASE("a user module registers its members in one line", "[modules]") {
  Block b;
  REQUIRE(b.named_children().size() == 2);
  CHECK(b.conv.same(*b.child("conv")));
  CHECK(b.bn.same(*b.child("bn")));
  CHECK(names_of(b.named_parameters()) ==
        std::vector<std::string>{"conv.weight", "bn.weight", "bn.bias"});
  CHECK(names_of(b.named_buffers()) ==
        std::vector<std::string>{"bn.running_mean", "bn.running_var", "bn.num_batches_tracked"});
  CHECK(b.named_parameters()[0].second.same(b.conv.weight()));
  CHECK(b.conv.weight().requires_grad());
  CHECK(b.conv.weight().is_leaf());
  CHECK(b.type_name() == "Block");
  CHECK(b.child("conv")->type_name() == "Conv2d");
}

TEST_CASE("nested modules give dotted names and the parent's own parameters first", "[modules]") {
  Net net;
  CHECK(names_of(net.named_parameters()) ==
        std::vector<std::string>{"scale", "layer1.0.conv.weight", "layer1.0.bn.weight",
                                 "layer1.0.bn.bias", "layer1.1.conv.weight", "layer1.1.bn.weight",
                                 "layer1.1.bn.bias", "fc.weight", "fc.bias"});
  CHECK(names_of(net.named_parameters(false)) == std::vector<std::string>{"scale"});
  std::vector<std::string> module_names;
  for (const auto& [name, m] : net.named_modules()) module_names.push_back(name);
  CHECK(module_names == std::vector<std::string>{"", "layer1", "layer1.0", "layer1.0.conv",
                                                 "layer1.0.bn", "layer1.1", "layer1.1.conv",
                                                 "layer1.1.bn", "fc"});
  CHECK(net.buffers().size() == 6);
  CHECK(count_parameters(net) == 1 + 2 * (4 * 4 * 9 + 8) + 4 * 2 + 2);
}

TEST_CASE("copies of a module share parameters buffers children and mode", "[modules]") {
  Block a;
  Block b = a;  // default copy of a user subclass
  CHECK(b.same(a));
  CHECK(b.conv.weight().same(a.conv.weight()));
  CHECK(b.bn.running_mean().same(a.bn.running_mean()));
  b.eval();
  CHECK_FALSE(a.is_training());
  CHECK_FALSE(a.bn.is_training());
  Block moved = std::move(b);  // moving copies the handle: b stays valid
  CHECK(moved.same(a));
  CHECK(b.same(a));
  Block other;
  CHECK_FALSE(other.conv.weight().same(a.conv.weight()));
}

TEST_CASE("a Sequential of user modules calls each one's forward", "[modules]") {
  manual_seed(1);
  nn::Sequential seq{Block(), Block()};
  Tensor x = randn({2, 4, 5, 5});
  Tensor expected = seq.at<Block>(1)(seq.at<Block>(0)(x));
  KILN_CHECK_CLOSE(seq(x), expected, 1e-6, 1e-6);
  CHECK(seq.at<Block>(-1).same(seq[1]));
  CHECK_THROWS_WITH(seq.at<nn::Linear>(0), Catch::Contains("is a Block, not a Linear"));
  CHECK_THROWS_AS(seq[2], Error);
}

TEST_CASE("a module without forward(Tensor) says so", "[modules]") {
  nn::Module plain;
  CHECK_THROWS_WITH(plain(zeros({1})), Catch::Contains("forward(const Tensor&) is not implemented"));
  nn::ModuleList list(nn::Linear(2, 2), nn::ReLU());
  CHECK(list.size() == 2);
  CHECK(count_parameters(list) == 6);
  CHECK(list.at<nn::Linear>(0).out_features() == 2);
  CHECK_THROWS_AS(list(zeros({1, 2})), Error);
}

TEST_CASE("registration rejects repeated and dotted names", "[modules]") {
  nn::Module m;
  m.add_parameter("w", zeros({2}));
  CHECK_THROWS_WITH(m.add_parameter("w", zeros({2})), Catch::Contains("already registered"));
  CHECK_THROWS_AS(m.add_buffer("w", zeros({2})), Error);
  CHECK_THROWS_AS(m.add("w", nn::ReLU()), Error);
  CHECK_THROWS_AS(m.add("a.b", nn::ReLU()), Error);
  CHECK_THROWS_AS(m.add("", nn::ReLU()), Error);
  CHECK_THROWS_WITH(m.add_parameter("i", zeros({2}, {.dtype = DType::i64})),
                    Catch::Contains("must be floating"));
  CHECK_THROWS_AS(m.add("self", m), Error);
  CHECK_FALSE(m.add_parameter("none", Tensor()).defined());
  CHECK(m.parameters().size() == 1);
}

TEST_CASE("a parameter shared by two modules is listed once", "[modules]") {
  nn::Linear shared(3, 3);
  nn::Sequential seq(shared, shared);
  CHECK(seq.parameters().size() == 2);
  CHECK(seq.modules().size() == 2);        // the Sequential and the one Linear
  CHECK(seq.state_dict().size() == 4);     // state_dict keeps both names, as PyTorch's
}

TEST_CASE("parameter counts of Linear", "[modules]") {
  CHECK(count_parameters(nn::Linear(4, 8)) == 40);
  CHECK(count_parameters(nn::Linear(4, 8, {.bias = false})) == 32);
  CHECK(nn::Linear(4, 8).parameters().size() == 2);
}

TEST_CASE("train and eval reach every descendant", "[modules]") {
  Net net;
  CHECK(net.is_training());
  net.eval();
  for (nn::Module* m : net.modules()) CHECK_FALSE(m->is_training());
  CHECK_FALSE(net.layer1.at<Block>(1).bn.is_training());
  net.train();
  for (nn::Module* m : net.modules()) CHECK(m->is_training());
  net.layer1.train(false);
  CHECK(net.is_training());
  CHECK_FALSE(net.layer1[0].is_training());
}

TEST_CASE("to(dtype) converts in place so member handles follow", "[modules]") {
  Block b;
  Tensor w = b.conv.weight();
  const std::vector<double> before = values(w);
  w.set_grad(ones_like(w));
  b.to(DType::f64);
  CHECK(w.dtype() == DType::f64);
  CHECK(b.conv.weight().dtype() == DType::f64);
  CHECK(b.conv.weight().same(w));
  CHECK(w.requires_grad());
  CHECK(w.grad().dtype() == DType::f64);
  CHECK(values(w) == before);  // f32 values are exact in f64
  CHECK(b.bn.running_var().dtype() == DType::f64);
  CHECK(b.bn.num_batches_tracked().dtype() == DType::i64);  // integers stay
  Tensor y = b(randn({1, 4, 3, 3}, {.dtype = DType::f64}));
  CHECK(y.dtype() == DType::f64);
  b.to(Device::cpu());
  CHECK(b.conv.weight().same(w));
}

TEST_CASE("zero_grad sets gradients to none or to zeros after a backward pass", "[modules]") {
  ElementwiseMlp mlp;
  Tensor x = testing::tensor_of({1, 2, 3}, {3});
  SECTION("set to none") {
    mlp(x).backward(ones({3}));
    KILN_CHECK_CLOSE(mlp.w1.grad(), testing::tensor_of({-1, -2, -3}, {3}), 0, 0);
    KILN_CHECK_CLOSE(mlp.w2.grad(), testing::tensor_of({2.5, 4.5, 6.5}, {3}), 0, 0);
    mlp.zero_grad();
    for (const Tensor& p : mlp.parameters()) CHECK_FALSE(p.grad().defined());
  }
  SECTION("zero filled") {
    mlp(x).backward(ones({3}));
    Tensor g = mlp.b1.grad();
    mlp.zero_grad(false);
    for (const Tensor& p : mlp.parameters()) {
      REQUIRE(p.grad().defined());
      KILN_CHECK_EQUAL(p.grad(), zeros({3}));
    }
    CHECK(mlp.b1.grad().same(g));  // zeroed in place
    mlp(x).backward(ones({3}));     // accumulates into the zeroed gradient afresh
    KILN_CHECK_CLOSE(mlp.b1.grad(), testing::tensor_of({-1, -1, -1}, {3}), 0, 0);
  }
}

TEST_CASE("apply visits children before their parent", "[modules]") {
  Net net;
  std::vector<std::string> order;
  net.apply([&](nn::Module& m) { order.push_back(m.type_name()); });
  CHECK(order == std::vector<std::string>{"Conv2d", "BatchNorm2d", "Block", "Conv2d",
                                          "BatchNorm2d", "Block", "Sequential", "Linear", "Net"});
  net.apply([](nn::Module& m) {
    if (auto* linear = dynamic_cast<nn::Linear*>(&m)) nn::init::zeros_(linear->weight());
  });
  KILN_CHECK_EQUAL(net.fc.weight(), zeros({2, 4}));
}

TEST_CASE("state_dict holds detached parameters and persistent buffers", "[modules]") {
  nn::Sequential seq(nn::Linear(2, 3), nn::BatchNorm1d(3));
  seq.at<nn::BatchNorm1d>(1).add_buffer("scratch", zeros({1}), /*persistent=*/false);
  const auto state = seq.state_dict();
  std::vector<std::string> keys;
  for (const auto& [k, v] : state) keys.push_back(k);
  CHECK(keys == std::vector<std::string>{"0.bias", "0.weight", "1.bias", "1.num_batches_tracked",
                                         "1.running_mean", "1.running_var", "1.weight"});
  CHECK_FALSE(state.at("0.weight").requires_grad());
  CHECK(state.at("0.weight").storage() == seq.at<nn::Linear>(0).weight().storage());
  CHECK(seq.named_buffers().size() == 4);  // the non-persistent one is still a buffer
}

TEST_CASE("load_state_dict copies values into the existing tensors", "[modules]") {
  manual_seed(3);
  nn::Sequential source(nn::Linear(2, 3), nn::BatchNorm1d(3));
  nn::Sequential target(nn::Linear(2, 3), nn::BatchNorm1d(3));
  source(randn({4, 2}));  // moves the running statistics
  Tensor w = target.at<nn::Linear>(0).weight();
  target.load_state_dict(source.state_dict());
  CHECK(target.at<nn::Linear>(0).weight().same(w));
  for (const auto& [k, v] : source.state_dict()) KILN_CHECK_EQUAL(target.state_dict().at(k), v);
  CHECK(target.at<nn::BatchNorm1d>(1).num_batches_tracked().item<int64_t>() == 1);
  // Values are converted into the model's dtype.
  auto state = source.state_dict();
  state["0.bias"] = state["0.bias"].to(DType::f64);
  target.load_state_dict(state);
  CHECK(target.at<nn::Linear>(0).bias().dtype() == DType::f32);
}

TEST_CASE("load_state_dict names missing unexpected and mis-shaped keys", "[modules]") {
  nn::Linear model(2, 3);
  SECTION("missing") {
    auto state = model.state_dict();
    state.erase("bias");
    CHECK_THROWS_WITH(model.load_state_dict(state),
                      Catch::Contains("missing keys: \"bias\"") && Catch::Contains("Linear"));
    model.load_state_dict(state, /*strict=*/false);
  }
  SECTION("unexpected") {
    auto state = model.state_dict();
    state["extra.weight"] = zeros({1});
    CHECK_THROWS_WITH(model.load_state_dict(state),
                      Catch::Contains("unexpected keys: \"extra.weight\""));
    model.load_state_dict(state, /*strict=*/false);
  }
  SECTION("mis-shaped even when not strict") {
    auto state = model.state_dict();
    state["weight"] = zeros({2, 3});
    CHECK_THROWS_WITH(model.load_state_dict(state, false),
                      Catch::Contains("size mismatch for weight") && Catch::Contains("[2,3]") &&
                          Catch::Contains("[3,2]"));
  }
  SECTION("all kinds at once") {
    auto state = model.state_dict();
    state.erase("bias");
    state["other"] = zeros({1});
    state["weight"] = zeros({3});
    try {
      model.load_state_dict(state);
      FAIL("no error");
    } catch (const Error& e) {
      const std::string what = e.what();
      CHECK(what.find("missing keys: \"bias\"") != std::string::npos);
      CHECK(what.find("unexpected keys: \"other\"") != std::string::npos);
      CHECK(what.find("size mismatch for weight") != std::string::npos);
    }
  }
}

TEST_CASE("printing shows the module tree as PyTorch does", "[modules]") {
  nn::Sequential seq(nn::Linear(4, 8), nn::ReLU());
  CHECK(seq.str() ==
        "Sequential(\n  (0): Linear(in_features=4, out_features=8, bias=True)\n  (1): ReLU()\n)");
  std::ostringstream os;
  os << nn::Sequential(Block());
  CHECK(os.str() ==
        "Sequential(\n"
        "  (0): Block(\n"
        "    (conv): Conv2d(4, 4, kernel_size=(3, 3), stride=(1, 1), padding=(1, 1), bias=False)\n"
        "    (bn): BatchNorm2d(4, eps=1e-05, momentum=0.1, affine=True, track_running_stats=True)\n"
        "  )\n"
        ")");
  CHECK(nn::Module().str() == "Module()");
}

TEST_CASE("a module cannot contain itself through a child", "[modules]") {
  nn::Sequential a, b;
  a.push_back(b);
  CHECK_THROWS_WITH(b.push_back(a), Catch::Contains("cannot contain itself"));
}

TEST_CASE("apply visits a module shared by two parents once", "[modules]") {
  nn::Linear shared(2, 2);
  nn::Sequential left{shared}, right{shared};
  nn::Sequential net{left, right};
  int linear_calls = 0;
  net.apply([&](nn::Module& m) { linear_calls += m.type_name() == "Linear"; });
  CHECK(linear_calls == 1);
}

// Random ops in traced and compiled functions (compiler/trace.h, compiler/ir/graph.h): nodes
// without a seed, drawing from the graph's random input, which each replay fills from the
// default generator. Compiled code must draw exactly the numbers eager code draws (compared
// bit for bit) and leave the generator where eager code leaves it.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "compiler/compile.h"
#include "compiler/program.h"
#include "compiler/run_graph.h"
#include "compiler_testing.h"
#include "testing.h"

using namespace kiln;
using kiln::testing::same_bits;
using namespace kiln::compiler;
using Catch::Matchers::Contains;
using kiln::testing::count_ops;

namespace {

using Args = std::vector<Tensor>;

#define CHECK_SAME_BITS(what, actual, expected)                          \
  do {                                                                   \
    INFO(what << "\nactual:   " << testing::describe(actual)           \
                << "\nexpected: " << testing::describe(expected));       \
    CHECK(same_bits((actual), (expected)));                              \
  } while (0)

const compiler::Node* op_node(const Graph& g, const std::string& op) {
  for (const compiler::Node& n : g.nodes())
    if (n.kind == NodeKind::op && n.op == op) return &n;
  return nullptr;
}

// The default generator's position.
uint64_t stream_offset() { return default_generator().offset(); }

}  // namespace

TEST_CASE("random: a traced dropout and randn draw from the random input", "[random][trace]") {
  manual_seed(11);
  (void)rand({7});  // the stream does not start at 0: offsets in the graph are relative
  const uint64_t start = stream_offset();
  const Tensor x = randn({4, 8});
  auto fn = [](const Args& a) -> Args {
    auto [y, mask] = dropout_with_mask(a[0], 0.3, true);
    return {y, mask, randn({3, 5}) + sum(a[0])};
  };
  const uint64_t before = stream_offset();
  const Trace t = trace(fn, {x});
  const Graph& g = t.graph;
  verify(g);
  CHECK(before == start + 32);
  CHECK(t.random_count == 32 + 15);
  CHECK(stream_offset() == before + t.random_count);

  REQUIRE(t.random_input >= 0);
  const compiler::Node& random = g.node(g.inputs().at(static_cast<size_t>(t.random_input)));
  CHECK(random.role == InputRole::random);
  CHECK(random.name == "random");
  CHECK(random.outputs.at(0) == random_base_type());
  const compiler::Node* drop = op_node(g, "dropout");
  const compiler::Node* normal = op_node(g, "normal");
  REQUIRE(drop);
  REQUIRE(normal);
  CHECK_FALSE(drop->attrs.has("seed"));
  CHECK(drop->attrs.i("offset") == 0);
  CHECK_FALSE(normal->attrs.has("seed"));
  CHECK(normal->attrs.i("offset") == 32);
  CHECK_THAT(print(g), Contains("= random \"random\" : i64[2]") &&
                           Contains("dropout(%0) {p=0.3, train=true, offset=0}"));

  // inputs_for gives the trace's own base: the interpreter repeats the traced numbers.
  const std::vector<Tensor> again = interpret(g, t.inputs_for({x}));
  for (size_t i = 0; i < 3; ++i) CHECK_SAME_BITS("output " << i, again.at(i), t.results.at(i));

  // A replay draws fresh counters, the ones an eager call would have drawn.
  const uint64_t at = stream_offset();
  const Args replayed = t.replay({x});
  const uint64_t replayed_end = stream_offset();
  default_generator().set_offset(at);
  const Args eager = fn({x});
  CHECK(stream_offset() == replayed_end);
  CHECK(replayed_end == at + 47);
  for (size_t i = 0; i < 3; ++i) CHECK_SAME_BITS("replayed output " << i, replayed.at(i), eager.at(i));
  CHECK_FALSE(same_bits(replayed[1], t.results[1]));  // new masks
  CHECK_FALSE(same_bits(replayed[2], t.results[2]));
}

TEST_CASE("random: the graph does not change with the seed or the stream position", "[random][trace]") {
  const Tensor x = ones({6, 5});
  auto fn = [](const Args& a) -> Args { return {dropout(a[0] * 2, 0.5, true) + rand({6, 5})}; };
  manual_seed(1);
  const Trace first = trace(fn, {x});
  manual_seed(987654321);
  (void)randn({100});
  const Trace second = trace(fn, {x});
  CHECK(print(first.graph) == print(second.graph));
  CHECK(first.graph.structural_hash() == second.graph.structural_hash());
  CHECK_FALSE(same_bits(first.results[0], second.results[0]));
}

TEST_CASE("random: a random op given another generator is refused naming it", "[random][trace]") {
  manual_seed(3);
  (void)rand({5});
  const Tensor x = ones({4, 4});
  Generator other(77);
  auto with_other = [&](const Args& a) -> Args { return {dropout(a[0], 0.5, true, &other)}; };
  CHECK_THROWS_WITH(trace(with_other, {x}), Contains("dropout") && Contains("other than the default"));
  // The default generator's seed, but its own stream (at offset 0, behind the default's).
  Generator same_seed(default_generator().seed());
  auto with_same_seed = [&](const Args& a) -> Args { return {a[0] + randn({4, 4}, {}, &same_seed)}; };
  CHECK_THROWS_WITH(trace(with_same_seed, {x}), Contains("normal") && Contains("other than the default"));
  // Reseeding inside the function cannot be replayed.
  auto reseeds = [](const Args& a) -> Args {
    manual_seed(5);
    return {dropout(a[0], 0.5, true)};
  };
  CHECK_THROWS_WITH(trace(reseeds, {x}), Contains("dropout") && Contains("reseeded"));
  auto reseeds_last = [](const Args& a) -> Args {
    Tensor y = dropout(a[0], 0.5, true);
    manual_seed(5);
    return {y};
  };
  CHECK_THROWS_WITH(trace(reseeds_last, {x}), Contains("reseeded"));
  // Counters drawn outside the registry (or by another thread) before or after the traced
  // random ops: replay would draw them again every call.
  auto draws_before = [](const Args& a) -> Args {
    (void)default_generator().reserve(10);
    return {dropout(a[0], 0.5, true)};
  };
  CHECK_THROWS_WITH(trace(draws_before, {x}), Contains("dropout") && Contains("did not see"));
  auto draws_after = [](const Args& a) -> Args {
    Tensor y = dropout(a[0], 0.5, true);
    (void)default_generator().reserve(10);
    return {y};
  };
  CHECK_THROWS_WITH(trace(draws_after, {x}), Contains("10 counters") && Contains("did not see"));
}

TEST_CASE("random: verify checks the random input", "[random][ir]") {
  const std::string drop = "%1, %2 = dropout(%0) {p=0.5, train=true, offset=0} : f32[4], bool[4]\n";
  verify(parse("%0 = input \"x\" : f32[4]\n" + drop + "%3 = random \"random\" : i64[2]\nreturn %1\n"));
  CHECK_THROWS_WITH(verify(parse("%0 = input \"x\" : f32[4]\n" + drop + "return %1\n")),
                    Contains("dropout") && Contains("random input"));
  CHECK_THROWS_WITH(verify(parse("%0 = input \"x\" : f32[4]\n%1 = random \"r\" : i64[3]\nreturn %0\n")),
                    Contains("i64[2]"));
  CHECK_THROWS_WITH(verify(parse("%0 = random \"a\" : i64[2]\n%1 = random \"b\" : i64[2]\nreturn %0\n")),
                    Contains("two random inputs"));
  // A hand-built node with its own seed runs with it.
  const Graph seeded = parse("%0 = input \"x\" : f32[4]\n"
                             "%1, %2 = dropout(%0) {p=0.5, train=true, seed=7, offset=0} : f32[4], bool[4]\n"
                             "return %1\n");
  verify(seeded);
  KILN_CHECK_EQUAL(interpret(seeded, {ones({4})})[0], interpret(seeded, {ones({4})})[0]);
}

TEST_CASE("random: both backends replay random ops as eager code and never recompile", "[random][compile]") {
  for (const std::string backend : {"interpreter", "generated"}) {
    INFO(backend);
    int runs = 0;
    auto fn = [&](const Args& a) -> Args {
      ++runs;
      Tensor noisy = a[0] + randn(a[0].shape()) * 0.1;
      auto [y, mask] = dropout_with_mask(relu(noisy * 2), 0.3, true);
      return {y * 3, mask, rand({5}), randint(0, 10, {5})};
    };
    CompiledFunction f = compile(fn, {.fullgraph = true, .backend = backend});
    const Tensor x = randn({4, 6});
    for (uint64_t seed : {21u, 22u}) {
      manual_seed(seed);
      std::vector<Args> compiled;
      for (int call = 0; call < 3; ++call) compiled.push_back(f({x}));
      const uint64_t compiled_end = stream_offset();
      manual_seed(seed);
      for (int call = 0; call < 3; ++call) {
        const Args eager = fn({x});
        for (size_t i = 0; i < eager.size(); ++i)
          CHECK_SAME_BITS("call " << call << " output " << i, compiled[static_cast<size_t>(call)].at(i), eager[i]);
      }
      CHECK(stream_offset() == compiled_end);
      CHECK_FALSE(same_bits(compiled[1][1], compiled[2][1]));  // each call new masks
    }
    CHECK(runs == 1 + 6);  // the traced call, then the eager reference calls
    CHECK(f.recompiles() == 0);
    CHECK(f.cache_size() == 1);
    CHECK(f.graph_breaks() == 0);
  }
}

TEST_CASE("random: random ops are library steps of the program", "[random][program]") {
  manual_seed(4);
  const Tensor x = randn({8, 8});
  auto fn = [](const Args& a) -> Args { return {dropout(relu(a[0]) * 2, 0.25, true) + 1}; };
  const Trace t = trace(fn, {x});
  Program program(t.graph);
  CHECK_THAT(program.describe(), Contains("eager") && Contains("dropout"));
  for (const ScheduleStep& step : program.steps())
    if (step.is_kernel())
      for (int32_t n : step.nodes) CHECK_FALSE(t.graph.nodes()[static_cast<size_t>(n)].def->random);
  // Program::run reads the random input as the interpreter does.
  std::vector<Tensor> inputs = t.inputs_for({x});
  inputs.at(static_cast<size_t>(t.random_input)) = random_base_tensor(99, 1234);
  CHECK_SAME_BITS("program", program.run(inputs).at(0), interpret(t.graph, inputs).at(0));
  CHECK_FALSE(same_bits(program.run(inputs).at(0), t.results.at(0)));
}

namespace {

// A small MLP with dropout in training mode.
std::shared_ptr<nn::Sequential> dropout_mlp() {
  auto m = std::make_shared<nn::Sequential>(nn::Linear(12, 16), nn::ReLU(), nn::Dropout(0.3), nn::Linear(16, 4));
  m->train();
  return m;
}

// One accumulation micro-step: noise on the input, forward, cross entropy, backward of
// loss * weight. Returns the loss and which hidden units survived dropout (nonzero).
TracedFunction micro_step(std::shared_ptr<nn::Sequential> model) {
  return [model](const Args& args) -> Args {
    nn::Sequential& m = *model;
    const Tensor x = args[0] + randn(args[0].shape()) * 0.05;
    const Tensor dropped = m[2](m[1](m[0](x)));
    const Tensor loss = cross_entropy(m[3](dropped), args[1]);
    (loss * args[2]).backward();
    NoGradGuard no_grad;
    return {loss.detach(), ne(dropped.detach(), 0.0)};
  };
}

// What a run of training steps produced: per micro-step the loss, the kept units and every
// .grad; per optimizer step every parameter; the generator's offset at the end.
struct Run {
  std::vector<Tensor> losses, kept, grads, params;
  uint64_t end_offset = 0;
};

Run run_training(const TracedFunction& step, nn::Module& model, const std::vector<Args>& batches, uint64_t seed,
          int steps) {
  manual_seed(seed);
  optim::SGD sgd(model.parameters(), {.lr = 0.1, .momentum = 0.9});
  Run run;
  size_t batch = 0;
  for (int s = 0; s < steps; ++s) {
    for (int micro = 0; micro < 2; ++micro) {
      const Args out = step(batches.at(batch++ % batches.size()));
      run.losses.push_back(out.at(0));
      run.kept.push_back(out.at(1));
      for (const Tensor& p : model.parameters()) run.grads.push_back(p.grad().clone());
    }
    sgd.step();
    sgd.zero_grad();
    for (const Tensor& p : model.parameters()) run.params.push_back(p.detach().clone());
  }
  run.end_offset = stream_offset();
  return run;
}

void check_same_runs(const Run& compiled, const Run& eager) {
  REQUIRE(compiled.losses.size() == eager.losses.size());
  REQUIRE(compiled.grads.size() == eager.grads.size());
  REQUIRE(compiled.params.size() == eager.params.size());
  for (size_t i = 0; i < eager.losses.size(); ++i) {
    CHECK_SAME_BITS("loss of micro-step " << i, compiled.losses[i], eager.losses[i]);
    CHECK_SAME_BITS("kept units of micro-step " << i, compiled.kept[i], eager.kept[i]);
  }
  for (size_t i = 0; i < eager.grads.size(); ++i) CHECK_SAME_BITS("grad " << i, compiled.grads[i], eager.grads[i]);
  for (size_t i = 0; i < eager.params.size(); ++i) CHECK_SAME_BITS("param " << i, compiled.params[i], eager.params[i]);
  CHECK(compiled.end_offset == eager.end_offset);
  // Every call drew new masks.
  for (size_t i = 1; i < compiled.kept.size(); ++i) CHECK_FALSE(same_bits(compiled.kept[i], compiled.kept[i - 1]));
}

}  // namespace

TEST_CASE("random: an MLP with dropout trains compiled as eager bit for bit", "[random][equiv]") {
  for (const std::string backend : {"interpreter", "generated"}) {
    INFO(backend);
    manual_seed(31);
    std::shared_ptr<nn::Sequential> model = dropout_mlp();
    manual_seed(31);
    std::shared_ptr<nn::Sequential> reference = dropout_mlp();
    std::vector<Args> batches;
    for (int i = 0; i < 2; ++i)
      batches.push_back({randn({8, 12}), randint(0, 4, {8}), scalar_tensor(i == 0 ? 1.0 / 3 : 2.0 / 3, DType::f32)});

    CompiledFunction compiled =
        compile(micro_step(model), {.fullgraph = true, .backend = backend, .trace = module_names(*model)});
    constexpr int kSteps = 4;  // the first traces both entries (.grad undefined, defined)
    const Run got = run_training(compiled, *model, batches, 77, kSteps);
    const Run want = run_training(micro_step(reference), *reference, batches, 77, kSteps);
    check_same_runs(got, want);
    CHECK(want.end_offset == kSteps * 2 * (8 * 12 + 8 * 16));

    // Another seed: the same graphs, the same numbers as eager code.
    const Run got2 = run_training(compiled, *model, batches, 78, 2);
    const Run want2 = run_training(micro_step(reference), *reference, batches, 78, 2);
    check_same_runs(got2, want2);
    CHECK(compiled.recompiles() == 1);  // the .grad defined entry only
    CHECK(compiled.cache_size() == 2);
    CHECK(compiled.graph_breaks() == 0);
    for (const Trace* t : compiled.traces()) CHECK(count_ops(t->graph, "dropout") == 1);
  }
}

TEST_CASE("random: a whole training step with dropout and SGD compiles as eager", "[random][equiv]") {
  manual_seed(41);
  std::shared_ptr<nn::Sequential> model = dropout_mlp();
  manual_seed(41);
  std::shared_ptr<nn::Sequential> reference = dropout_mlp();
  const optim::SGDOptions options{.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-4};
  optim::SGD sgd(model->parameters(), options), reference_sgd(reference->parameters(), options);
  // Two accumulation micro-steps (arguments 3k, 3k+1, 3k+2) and the optimizer's update.
  auto step_of = [](std::shared_ptr<nn::Sequential> m, optim::SGD& opt) -> TracedFunction {
    const TracedFunction micro = micro_step(std::move(m));
    return [micro, &opt](const Args& a) -> Args {
      Args out;
      for (size_t k = 0; k < 2; ++k) {
        const Args r = micro({a[3 * k], a[3 * k + 1], a[3 * k + 2]});
        out.insert(out.end(), r.begin(), r.end());
      }
      opt.step();
      return out;
    };
  };
  const TracedFunction step = step_of(model, sgd), eager = step_of(reference, reference_sgd);
  const Args batch = {randn({8, 12}), randint(0, 4, {8}), scalar_tensor(0.5f, DType::f32),
                      randn({8, 12}), randint(0, 4, {8}), scalar_tensor(0.5f, DType::f32)};
  // The first step creates the momentum buffers: eager on both sides.
  manual_seed(5);
  step(batch);
  sgd.zero_grad();
  manual_seed(5);
  eager(batch);
  reference_sgd.zero_grad();

  CompiledFunction compiled = compile(step, {.fullgraph = true, .trace = module_names(*model)});
  for (uint64_t seed : {6u, 7u}) {
    INFO("seed " << seed);
    auto run = [&](const TracedFunction& f, optim::SGD& opt, nn::Module& m) {
      Run r;
      manual_seed(seed);
      for (int call = 0; call < 3; ++call) {
        const Args out = f(batch);
        r.losses.insert(r.losses.end(), {out.at(0), out.at(2)});
        r.kept.insert(r.kept.end(), {out.at(1), out.at(3)});
        for (const Tensor& p : m.parameters()) r.params.push_back(p.detach().clone());
        opt.zero_grad();
      }
      r.end_offset = stream_offset();
      return r;
    };
    const Run got = run(compiled, sgd, *model);
    const Run want = run(eager, reference_sgd, *reference);
    check_same_runs(got, want);
    CHECK(want.end_offset == 3 * 2 * (8 * 12 + 8 * 16));
  }
  CHECK(compiled.recompiles() == 0);
  CHECK(compiled.cache_size() == 1);
  CHECK(compiled.graph_breaks() == 0);
  CHECK(count_ops(compiled.traces().at(0)->graph, "dropout") == 2);
}

TEST_CASE("random: an in-place fill of captured state replays as eager", "[random][compile]") {
  for (const std::string backend : {"interpreter", "generated"}) {
    INFO(backend);
    Tensor state = zeros({3, 4}), reference = zeros({3, 4});
    auto fill = [](Tensor& t) {
      return [&t](const Args& a) -> Args {
        normal_(t, 1.0, 2.0);
        return {t * a[0]};
      };
    };
    CompiledFunction f = compile(fill(state), {.fullgraph = true, .backend = backend});
    const TracedFunction eager = fill(reference);
    const Tensor x = full({3, 4}, 3.0);
    for (int call = 0; call < 3; ++call) {
      const uint64_t at = stream_offset();
      const Tensor got = f({x})[0];
      default_generator().set_offset(at);
      const Tensor want = eager({x})[0];
      CHECK_SAME_BITS("call " << call, got, want);
      CHECK_SAME_BITS("state after call " << call, state, reference);
    }
    CHECK(f.recompiles() == 0);
    CHECK(f.traces().at(0)->graph.write_backs().size() == 1);
  }
}

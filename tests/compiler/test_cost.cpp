// The GPU cost model (compiler/cost.h) on graphs small enough to count by hand: bytes,
// FLOPs, launches and roofline times per step, the minimum traffic, and the GPU table.
#include "compiler/cost.h"
#include "compiler/fusion.h"
#include "testing.h"

using namespace kiln;
using namespace kiln::compiler;

namespace {

// y = relu(x * s + b): one pointwise kernel.
constexpr const char* kPointwise = R"(%0 = input "x" : f32[2,3,4,5]
%1 = input "s" : f32[1,3,1,1]
%2 = input "b" : f32[2,3,4,5]
%3 = mul(%0, %1) : f32[2,3,4,5]
%4 = add(%3, %2) : f32[2,3,4,5]
%5 = relu(%4) : f32[2,3,4,5]
return %5
)";

// relu(conv2d(x, w)) over a 3x3 kernel padded by 1, in the layout given.
std::string conv_relu(const char* layout) {
  return fmt::format(R"(%0 = input "x" : f32[2,3,8,8]{0}
%1 = param "w" : f32[4,3,3,3]
%2 = conv2d(%0, %1, none) {{stride=[1,1], padding=[1,1], dilation=[1,1], groups=1}} : f32[2,4,8,8]{0}
%3 = relu(%2) : f32[2,4,8,8]{0}
return %3
)",
                     layout);
}

const StepCost& step_named(const CostReport& r, const std::string& name) {
  for (const StepCost& c : r.steps)
    if (c.name == name) return c;
  FAIL("no step " << name);
  return r.steps.front();
}

}  // namespace

TEST_CASE("cost: a pointwise kernel reads each input once, a broadcast one at its own size", "[cost]") {
  const Graph g = parse(kPointwise);
  const GpuSpec& gpu = gpu_spec("h200");
  const CostReport r = estimate_cost(g, fuse(g), gpu);
  REQUIRE(r.groups == 1);
  const StepCost& k = r.steps.at(0);
  CHECK(k.kind == "pointwise");
  constexpr int64_t full = 2 * 3 * 4 * 5 * 4;  // f32[2,3,4,5] in bytes
  CHECK(k.bytes_read == full + 3 * 4 + full);
  CHECK(k.bytes_written == full);
  CHECK(k.launches == 1);
  CHECK(k.flops == 3.0 * 120);  // a FLOP per node and element
  CHECK_FALSE(k.compute_bound);
  CHECK(k.seconds == Approx((3 * full + 12) / gpu.memory_bytes_per_s));
  // One kernel is perfect fusion: the plan is the minimum.
  CHECK(r.minimum_bytes == r.bytes);
  CHECK(r.traffic_ratio() == Approx(1.0));
  CHECK(r.launch_ratio() == Approx(1.0));
}

TEST_CASE("cost: an NCHW convolution on tensor cores pays for its transposes, an NHWC one does not", "[cost]") {
  const GpuSpec& gpu = gpu_spec("h100");
  const int64_t x = 2 * 3 * 8 * 8 * 4, w = 4 * 3 * 3 * 3 * 4, y = 2 * 4 * 8 * 8 * 4;
  const double flops = 2.0 * (2 * 4 * 8 * 8) * (3 * 3 * 3);  // a multiply-add per output and tap
  {
    const Graph g = parse(conv_relu(""));
    const CostReport r = estimate_cost(g, fuse(g), gpu);
    const StepCost& conv = step_named(r, "conv2d");
    CHECK(conv.flops == flops);
    CHECK(conv.bytes_read == x + w + (x + y));
    CHECK(conv.bytes_written == y + (x + y));
    CHECK(conv.launches == 3);
    CHECK(conv.note.find("nchw") != std::string::npos);
    // The relu reads the convolution's result and writes its own: in all, the minimum
    // traffic is x and w read, y written and read once, the result written.
    CHECK(r.minimum_bytes == x + w + y + y + y);
    CHECK(r.launches == 4);
    CHECK(r.groups == 2);
    CHECK(r.launch_ratio() == Approx(2.0));
  }
  {
    const Graph g = parse(conv_relu(" nhwc"));
    const CostReport r = estimate_cost(g, fuse(g), gpu);
    const StepCost& conv = step_named(r, "conv2d");
    CHECK(conv.bytes_read == x + w);
    CHECK(conv.bytes_written == y);
    CHECK(conv.launches == 1);
    CHECK(conv.note.empty());
    CHECK(r.traffic_ratio() == Approx(1.0));
  }
  {
    // Without TF32, f32 runs on the CUDA cores in NCHW, with no transposes, at the FP32 rate.
    const Graph g = parse(conv_relu(""));
    const StepCost& conv = step_named(estimate_cost(g, fuse(g), gpu, {.tf32 = false}), "conv2d");
    CHECK(conv.launches == 1);
    CHECK(conv.seconds == Approx(std::max(flops / gpu.fp32_flops, (x + w + y) / gpu.memory_bytes_per_s)));
  }
}

TEST_CASE("cost: a large product is compute-bound at the tensor-core rate of its dtype", "[cost]") {
  const Graph g = parse(R"(%0 = input "a" : bf16[4096,4096]
%1 = input "b" : bf16[4096,4096]
%2 = mm(%0, %1) : bf16[4096,4096]
return %2
)");
  const GpuSpec& gpu = gpu_spec("a100");
  const CostReport r = estimate_cost(g, fuse(g), gpu);
  const StepCost& mm = step_named(r, "mm");
  CHECK(mm.flops == 2.0 * 4096.0 * 4096.0 * 4096.0);
  CHECK(mm.compute_bound);
  CHECK(mm.seconds == Approx(mm.flops / gpu.bf16_flops));
}

TEST_CASE("cost: batch norm's extra passes, and 16-bit conversions, are planned traffic", "[cost]") {
  constexpr const char* text = R"(%0 = input "x" : {0}[8,16,4,4]
%1 = param "weight" : f32[16]
%2 = param "bias" : f32[16]
%3, %4, %5 = batch_norm(%0, %1, %2, none, none) {{training=true, momentum=0.1, eps=1e-05}} : {0}[8,16,4,4], f32[16], f32[16]
return %3, %4, %5
)";
  const GpuSpec& gpu = gpu_spec("h200");
  const int64_t elements = 8 * 16 * 4 * 4;
  {
    const Graph g = parse(fmt::format(fmt::runtime(text), "f32"));
    const StepCost& bn = step_named(estimate_cost(g, fuse(g), gpu), "batch_norm");
    CHECK(bn.bytes_read == 2 * elements * 4 + 2 * 16 * 4);  // x twice, weight and bias
    CHECK(bn.bytes_written == elements * 4 + 2 * 16 * 4);   // y, mean and invstd
    CHECK(bn.launches == 1);
  }
  {
    const Graph g = parse(fmt::format(fmt::runtime(text), "bf16"));
    const CostReport r = estimate_cost(g, fuse(g), gpu);
    const StepCost& bn = step_named(r, "batch_norm");
    CHECK(bn.launches == 3);
    CHECK(bn.note.find("16-bit") != std::string::npos);
    CHECK(r.traffic_ratio() > 3.0);  // converting both ways costs far more than bf16 x and y
  }
}

TEST_CASE("cost: the GPU table names its GPUs and refuses others", "[cost]") {
  REQUIRE(gpu_specs().size() >= 3);
  for (const GpuSpec& s : gpu_specs()) {
    CHECK(&gpu_spec(s.name) == &s);
    CHECK(s.memory_bytes_per_s > 1e12);
    CHECK(s.bf16_flops > s.tf32_flops);
    CHECK(s.tf32_flops > s.fp32_flops);
  }
  CHECK_THROWS_WITH(gpu_spec("v100"), Catch::Contains("unknown GPU 'v100'") && Catch::Contains("h200"));
}

TEST_CASE("cost: the table and the JSON fields carry the totals", "[cost]") {
  const Graph g = parse(conv_relu(""));
  const CostReport r = estimate_cost(g, fuse(g), gpu_spec("h200"));
  const std::string table = cost_table(r);
  CHECK(table.find("conv2d") != std::string::npos);
  CHECK(table.find("4 launches for 2 groups (2.00x)") != std::string::npos);
  const std::string json = cost_json_fields(r);
  CHECK(json.find(R"("gpu":"h200")") != std::string::npos);
  CHECK(json.find(R"("launches":4,"groups":2)") != std::string::npos);
}

TEST_CASE("cost: attention counts its pairs and the tiles' re-reads", "[cost][attention]") {
  // 2 heads, L = 32 queries (two tiles), S = 48 keys (three tiles), E = 8, Ev = 4.
  const Graph g = parse(R"(%0 = input "q" : f32[2,32,8]
%1 = input "k" : f32[2,48,8]
%2 = input "v" : f32[2,48,4]
%3, %4, %5 = scaled_dot_product_attention(%0, %1, %2, none) {is_causal=false, dropout_p=0.0, scale=0.5, seed=0, offset=0} : f32[2,32,4], f32[2,32], i64[2]
return %3, %4, %5
)");
  const StepCost& c = step_named(estimate_cost(g, fuse(g), gpu_spec("h200")), "scaled_dot_product_attention");
  CHECK(c.flops == 2.0 * 32 * 48 * (2 * 8 + 2 * 4));
  CHECK(c.bytes_read == (2 * 32 * 8 + 2 * 48 * 8 + 2 * 48 * 4) * 4 + (2 - 1) * (2 * 48 * 8 + 2 * 48 * 4) * 4);
  CHECK(c.launches == 1);
}

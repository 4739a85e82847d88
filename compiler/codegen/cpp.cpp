#include "compiler/codegen/cpp.h"

#include <fmt/format.h>

#include "compiler/codegen/render.h"
#include "kernels/cpu/wide.h"

namespace kiln::compiler::codegen {
namespace {

// Spaces smaller than this run on one thread: starting the team costs more than it saves.
constexpr int64_t kParallelThreshold = 32768;

class CppRenderer : KernelRenderer {
 public:
  explicit CppRenderer(const Kernel& k) : KernelRenderer(k, kCppSyntax) {}

  std::string render() {
    out_ += fmt::format("// kiln kernel {}: generated from the kernel IR; depends on structure only.\n",
                        k_.name);
    out_ += "#include <cstdint>\n#include \"core/half.h\"\n#include \"kernels/scalar.h\"\n\n";
    if (uses_16bit_floats() && cpu::wide_loops()) {
      // As the eager 16-bit loops (kernels/cpu/loops.h): the per-element conversions need
      // AVX-512's 16 lanes to keep up with f32, and no contraction into FMAs, whose
      // rounding would differ from eager results.
      out_ += "#pragma GCC target(\"avx512f,avx512bw,avx512vl,avx512dq\")\n";
      out_ += "#pragma GCC optimize(\"fp-contract=off\")\n\n";
    }
    out_ += fmt::format("extern \"C\" void {}(void* const* buffers, const int64_t* args) {{\n",
                        cpp_symbol(k_));
    for (size_t b = 0; b < k_.buffers.size(); ++b) {
      const Buffer& buf = k_.buffers[b];
      const std::string t = storage_type(buf.dtype);
      if (buf.output)
        line(1, fmt::format("{}* const {} = static_cast<{}*>(buffers[{}]);", t, buf.name, t, b));
      else
        line(1, fmt::format("const {}* const {} = static_cast<const {}*>(buffers[{}]);", t, buf.name, t, b));
    }
    declare_arguments(1, "args[{}]");
    if (k_.num_reduced == 0 && k_.rank > 0) {
      std::vector<std::string> unit;
      for (const Buffer& buf : k_.buffers)
        if (!buf.broadcasts(k_.rank - 1)) unit.push_back(fmt::format("{}_s{} == 1", buf.name, k_.rank - 1));
      line(1, fmt::format("if ({}) {{", fmt::join(unit, " && ")));
      pointwise_nest(2, true);
      line(1, "} else {");
      pointwise_nest(2, false);
      line(1, "}");
    } else if (k_.num_reduced == 0) {
      body(1, false);
      stores(1, false);
    } else if (k_.rank > k_.num_reduced) {
      // Outputs whose last kept dim is unit-stride in every input while the reduced
      // innermost dim is not (the column sums of a bias gradient): the column nest.
      const int32_t last_kept = k_.rank - k_.num_reduced - 1;
      std::vector<std::string> kept_unit, reduced_unit;
      for (const Buffer& buf : k_.buffers) {
        if (buf.output) continue;
        if (!buf.broadcasts(last_kept)) kept_unit.push_back(fmt::format("{}_s{} == 1", buf.name, last_kept));
        if (!buf.broadcasts(k_.rank - 1)) reduced_unit.push_back(fmt::format("{}_s{} == 1", buf.name, k_.rank - 1));
      }
      if (kept_unit.empty()) {
        reduction_nest();
      } else {
        const std::string rows = reduced_unit.empty() ? "false" : fmt::format("{}", fmt::join(reduced_unit, " && "));
        line(1, fmt::format("if (({}) && !({})) {{", fmt::join(kept_unit, " && "), rows));
        column_reduction_nest();
        line(1, "} else {");
        reduction_nest(2);
        line(1, "}");
      }
    } else {
      reduction_nest();
    }
    out_ += "}\n";
    return std::move(out_);
  }

 private:
  bool uses_16bit_floats() const {
    for (const Buffer& buf : k_.buffers)
      if (is_reduced_float(buf.dtype)) return true;
    for (const Expr& x : k_.exprs)
      if (is_reduced_float(x.dtype)) return true;
    return false;
  }

  void omp(int depth, int32_t loops) {
    if (loops <= 0) return;
    const std::string collapse = loops > 1 ? fmt::format(" collapse({})", loops) : "";
    line(depth, fmt::format("#pragma omp parallel for{} schedule(static) if ({} > {})", collapse,
                            product(0, k_.rank), kParallelThreshold));
  }

  void open_loops(int& depth, int32_t begin, int32_t end) {
    for (int32_t d = begin; d < end; ++d)
      line(depth++, fmt::format("for (int64_t i{} = 0; i{} < n{}; ++i{}) {{", d, d, d, d));
  }
  void close_loops(int& depth, int32_t count) {
    for (int32_t i = 0; i < count; ++i) line(--depth, "}");
  }

  void pointwise_nest(int depth, bool unit) {
    omp(depth, k_.rank == 1 ? 1 : k_.rank - 1);
    open_loops(depth, 0, k_.rank);
    body(depth, false, unit);
    stores(depth, unit);
    close_loops(depth, k_.rank);
  }

  void reduction_nest(int depth = 1) {
    const int32_t kept = k_.rank - k_.num_reduced;
    omp(depth, kept);
    open_loops(depth, 0, kept);
    declare_accumulators(depth);
    open_loops(depth, kept, k_.rank);
    body(depth, false);
    combine_reductions(depth, "v{1}");
    stores(depth, false, true);
    close_loops(depth, k_.num_reduced);
    body(depth, true);
    stores(depth, false);
    close_loops(depth, kept);
  }

  // A block of kColumnBlock outputs along the last kept dim at a time: each reduced
  // element's row of the block is read contiguously (and vectorized), each output's
  // accumulator in an array. Every output still combines its elements in the order of
  // reduction_nest, so the results are bit for bit the same.
  static constexpr int kColumnBlock = 64;
  void column_reduction_nest() {
    const int32_t kept = k_.rank - k_.num_reduced, last = kept - 1;
    int depth = 2;
    omp(depth, kept);
    open_loops(depth, 0, last);
    line(depth++, fmt::format("for (int64_t block = 0; block < n{}; block += {}) {{", last, kColumnBlock));
    line(depth, fmt::format("const int64_t width = n{} - block < {} ? n{} - block : {};", last, kColumnBlock, last,
                            kColumnBlock));
    for (size_t e = 0; e < k_.exprs.size(); ++e) {
      const Expr& x = k_.exprs[e];
      if (x.kind != ExprKind::reduce) continue;
      line(depth, fmt::format("{} acc{}_col[{}];", register_type(x.dtype), e, kColumnBlock));
      line(depth, fmt::format("for (int64_t j = 0; j < width; ++j) acc{}_col[j] = {};", e, literal(x.value, x.dtype)));
    }
    open_loops(depth, kept, k_.rank);
    line(depth++, "for (int64_t j = 0; j < width; ++j) {");
    line(depth, fmt::format("const int64_t i{} = block + j;", last));
    unit_input_dim_ = last;
    body(depth, false);
    unit_input_dim_ = -1;
    combine_reductions(depth, "v{1}", "acc{0}_col[j]");
    stores(depth, false, true);
    line(--depth, "}");
    close_loops(depth, k_.num_reduced);
    line(depth++, "for (int64_t j = 0; j < width; ++j) {");
    line(depth, fmt::format("const int64_t i{} = block + j;", last));
    for (size_t e = 0; e < k_.exprs.size(); ++e)
      if (k_.exprs[e].kind == ExprKind::reduce)
        line(depth, fmt::format("const {} acc{} = acc{}_col[j];", register_type(k_.exprs[e].dtype), e, e));
    body(depth, true);
    stores(depth, false);
    line(--depth, "}");
    line(--depth, "}");
    close_loops(depth, last);
  }
};

}  // namespace

std::string cpp_symbol(const Kernel& kernel) { return "k_" + kernel.name; }

std::string render_cpp(const Kernel& kernel) { return CppRenderer(kernel).render(); }

}  // namespace kiln::compiler::codegen

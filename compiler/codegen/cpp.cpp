#include "compiler/codegen/cpp.h"

#include <fmt/format.h>

#include "compiler/codegen/render.h"

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
    } else {
      reduction_nest();
    }
    out_ += "}\n";
    return std::move(out_);
  }

 private:
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

  void reduction_nest() {
    const int32_t kept = k_.rank - k_.num_reduced;
    int depth = 1;
    omp(depth, kept);
    open_loops(depth, 0, kept);
    declare_accumulators(depth);
    open_loops(depth, kept, k_.rank);
    body(depth, false);
    combine_reductions(depth, "v{1}");
    close_loops(depth, k_.num_reduced);
    body(depth, true);
    stores(depth, false);
    close_loops(depth, kept);
  }
};

}  // namespace

std::string cpp_symbol(const Kernel& kernel) { return "k_" + kernel.name; }

std::string render_cpp(const Kernel& kernel) { return CppRenderer(kernel).render(); }

}  // namespace kiln::compiler::codegen

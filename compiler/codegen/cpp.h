#pragma once
// The C++ renderer: a Kernel as one OpenMP-parallel C++ function for the host compiler.
//
//   extern "C" void k_<name>(void* const* buffers, const int64_t* args)
//
// `buffers` are the kernel's buffers in order (outputs first); `args` follow arg_layout()
// (sizes, then each buffer's strides and offset). The body calls kernels/scalar.h, so the
// generated kernels compute exactly what the eager CPU kernels compute. The outer loops run
// in parallel when the space is large; a pointwise kernel whose innermost strides are all 1
// at run time takes a copy of the loop nest with unit strides written in, which the
// compiler vectorizes.
#include <string>

#include "compiler/codegen/kernel_ir.h"

namespace kiln::compiler::codegen {

// The C++ function name of `kernel` ("k_" + its name).
std::string cpp_symbol(const Kernel& kernel);
// The complete translation unit.
std::string render_cpp(const Kernel& kernel);

}  // namespace kiln::compiler::codegen

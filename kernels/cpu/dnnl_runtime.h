#pragma once
// The oneDNN engine and streams that kiln's CPU kernels share (builds with oneDNN only:
// include it under KILN_HAVE_DNNL). Defined in kernels/cpu/conv_dnnl.cpp.
#include <oneapi/dnnl/dnnl.hpp>

namespace kiln::cpu {

dnnl::engine& dnnl_engine();
// This thread's stream: primitives run on the thread that calls them, so two threads may
// run oneDNN at once.
dnnl::stream& dnnl_stream();

}  // namespace kiln::cpu

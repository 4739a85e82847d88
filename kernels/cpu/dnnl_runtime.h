#pragma once
// The oneDNN engine and streams that kiln's CPU kernels share (builds with oneDNN only:
// include it under KILN_HAVE_DNNL). Defined in kernels/cpu/conv_dnnl.cpp.
#include <oneapi/dnnl/dnnl.hpp>

#include <unordered_map>

namespace kiln::cpu {

dnnl::engine& dnnl_engine();
// This thread's stream: primitives run on the thread that calls them, so two threads may
// run oneDNN at once.
dnnl::stream& dnnl_stream();
// Runs `primitive` on this thread's stream with `args` and its scratch memory (a
// `scratchpad`-sized buffer from kiln's allocator, one per call, so two threads may run the
// same primitive), and waits. oneDNN's failures propagate as dnnl::error, which callers
// turn into kiln errors naming their op.
void dnnl_run(const dnnl::primitive& primitive, const dnnl::memory::desc& scratchpad,
              std::unordered_map<int, dnnl::memory> args);

}  // namespace kiln::cpu

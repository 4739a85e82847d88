#pragma once
// KILN_HD marks a function that compiles as host C++ and as CUDA device code (nvcc or NVRTC).
#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define KILN_HD __host__ __device__ inline
#else
#define KILN_HD inline
#endif

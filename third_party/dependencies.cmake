# Finds the system's dependencies (Debian packages; nothing is vendored).
find_package(fmt REQUIRED)
find_package(Eigen3 3.4 REQUIRED NO_MODULE)
find_package(OpenMP REQUIRED COMPONENTS CXX)
# libjpeg-turbo (Debian: libjpeg62-turbo-dev) decodes the image-folder data sets.
find_package(JPEG REQUIRED)
# zlib reads the gzip-compressed IDX files of Fashion-MNIST.
find_package(ZLIB REQUIRED)

set(KILN_HAVE_OPENBLAS OFF)
if(NOT KILN_BLAS STREQUAL "OFF")
  # Prefer the OpenMP build: the pthread build oversubscribes the cores next to OpenMP.
  find_library(KILN_OPENBLAS_LIBRARY NAMES openblas
    PATHS /usr/lib/x86_64-linux-gnu/openblas-openmp /usr/lib/aarch64-linux-gnu/openblas-openmp
    NO_DEFAULT_PATH)
  find_library(KILN_OPENBLAS_LIBRARY NAMES openblas)
  find_path(KILN_CBLAS_INCLUDE_DIR cblas.h
    PATHS /usr/include/x86_64-linux-gnu/openblas-openmp /usr/include/aarch64-linux-gnu/openblas-openmp
    /usr/include/openblas)
  if(KILN_OPENBLAS_LIBRARY AND KILN_CBLAS_INCLUDE_DIR)
    add_library(kiln_openblas INTERFACE)
    target_link_libraries(kiln_openblas INTERFACE ${KILN_OPENBLAS_LIBRARY})
    target_include_directories(kiln_openblas INTERFACE ${KILN_CBLAS_INCLUDE_DIR})
    set(KILN_HAVE_OPENBLAS ON)
    message(STATUS "kiln: GEMM through OpenBLAS (${KILN_OPENBLAS_LIBRARY}), Eigen as fallback")
  elseif(KILN_BLAS STREQUAL "ON")
    message(FATAL_ERROR "kiln: KILN_BLAS=ON but OpenBLAS was not found (apt-get install libopenblas-openmp-dev)")
  else()
    message(STATUS "kiln: OpenBLAS not found; GEMM through Eigen")
  endif()
endif()

# oneDNN (Debian: libdnnl-dev) runs the CPU convolutions where it has a JIT kernel for
# them; kiln's own convolution kernels are the fallback (kernels/cpu/conv_dnnl.h).
set(KILN_HAVE_DNNL OFF)
if(NOT KILN_DNNL STREQUAL "OFF")
  # Found by hand: Debian's dnnl-config.cmake insists on OpenCL's headers, which only its
  # GPU runtime (unused here) needs.
  find_library(KILN_DNNL_LIBRARY NAMES dnnl)
  find_path(KILN_DNNL_INCLUDE_DIR oneapi/dnnl/dnnl.hpp)
  if(KILN_DNNL_LIBRARY AND KILN_DNNL_INCLUDE_DIR)
    add_library(kiln_dnnl INTERFACE)
    target_link_libraries(kiln_dnnl INTERFACE ${KILN_DNNL_LIBRARY})
    target_include_directories(kiln_dnnl INTERFACE ${KILN_DNNL_INCLUDE_DIR})
    set(KILN_HAVE_DNNL ON)
    message(STATUS "kiln: CPU convolutions through oneDNN (${KILN_DNNL_LIBRARY}), kiln's kernels as fallback")
  elseif(KILN_DNNL STREQUAL "ON")
    message(FATAL_ERROR "kiln: KILN_DNNL=ON but oneDNN was not found (apt-get install libdnnl-dev)")
  else()
    message(STATUS "kiln: oneDNN not found; CPU convolutions through kiln's kernels")
  endif()
endif()

# Gloo (Debian: libgloo-dev) runs the collectives of CPU process groups (dist/). Found by
# hand, as oneDNN: Debian's GlooConfig.cmake only describes a RelWithDebInfo build, and the
# library and its headers are all kiln needs.
set(KILN_HAVE_GLOO OFF)
if(NOT KILN_GLOO STREQUAL "OFF")
  find_library(KILN_GLOO_LIBRARY NAMES gloo)
  find_path(KILN_GLOO_INCLUDE_DIR gloo/rendezvous/store.h)
  if(KILN_GLOO_LIBRARY AND KILN_GLOO_INCLUDE_DIR)
    add_library(kiln_gloo INTERFACE)
    target_link_libraries(kiln_gloo INTERFACE ${KILN_GLOO_LIBRARY})
    target_include_directories(kiln_gloo INTERFACE ${KILN_GLOO_INCLUDE_DIR})
    set(KILN_HAVE_GLOO ON)
    message(STATUS "kiln: process groups over Gloo (${KILN_GLOO_LIBRARY})")
  elseif(KILN_GLOO STREQUAL "ON")
    message(FATAL_ERROR "kiln: KILN_GLOO=ON but Gloo was not found (apt-get install libgloo-dev)")
  else()
    message(STATUS "kiln: Gloo not found; kiln::dist builds without a CPU backend")
  endif()
endif()

set(KILN_HAVE_CUDA OFF)
if(NOT KILN_CUDA STREQUAL "OFF")
  if(KILN_CUDA STREQUAL "ON")
    find_package(CUDAToolkit REQUIRED)
  else()
    find_package(CUDAToolkit QUIET)
  endif()
  if(CUDAToolkit_FOUND)
    set(KILN_HAVE_CUDA ON)
    message(STATUS "kiln: CUDA toolkit ${CUDAToolkit_VERSION} found (${CUDAToolkit_LIBRARY_DIR})")
  else()
    message(STATUS "kiln: no CUDA toolkit; building CPU-only")
  endif()
endif()

# cuDNN (optional, with the toolkit): cudnn.h and libcudnn beside the toolkit's include and
# lib folders, or under CUDNN_ROOT (a CMake variable or the environment), e.g. a pip
# package's site-packages/nvidia/cudnn with include/ and lib/libcudnn.so.9. A versioned
# libcudnn.so.9 is accepted when there is no plain libcudnn.so.
set(KILN_HAVE_CUDNN OFF)
if(KILN_HAVE_CUDA)
  set(KILN_CUDNN_HINTS ${CUDNN_ROOT} $ENV{CUDNN_ROOT} ${CUDAToolkit_LIBRARY_ROOT} ${CUDAToolkit_TARGET_DIR})
  find_path(KILN_CUDNN_INCLUDE_DIR cudnn.h
    HINTS ${KILN_CUDNN_HINTS} ${CUDAToolkit_INCLUDE_DIRS} PATH_SUFFIXES include)
  find_library(KILN_CUDNN_LIBRARY NAMES cudnn libcudnn.so.9
    HINTS ${KILN_CUDNN_HINTS} ${CUDAToolkit_LIBRARY_DIR} PATH_SUFFIXES lib lib64 lib/x64)
  if(KILN_CUDNN_INCLUDE_DIR AND KILN_CUDNN_LIBRARY)
    set(KILN_HAVE_CUDNN ON)
    message(STATUS "kiln: cuDNN found (${KILN_CUDNN_LIBRARY}): conv, batch_norm and pooling on CUDA")
  else()
    message(STATUS "kiln: cuDNN not found (set CUDNN_ROOT): conv2d, batch_norm and pooling have no CUDA kernels")
  endif()
endif()

# NCCL (optional, with the toolkit; the CUDA 13 toolkit ships nccl.h and libnccl.so.2) runs
# the collectives of process groups on CUDA tensors (dist/nccl_backend.cpp). Only its header
# is needed to build: libnccl.so.2 is loaded at the first NCCL group (dlopen), so libkiln
# loads where NCCL is not installed, and backend "nccl" says what is missing there.
set(KILN_HAVE_NCCL OFF)
if(KILN_HAVE_CUDA AND NOT KILN_NCCL STREQUAL "OFF")
  find_path(KILN_NCCL_INCLUDE_DIR nccl.h
    HINTS ${NCCL_ROOT} $ENV{NCCL_ROOT} ${CUDAToolkit_INCLUDE_DIRS} ${CUDAToolkit_LIBRARY_ROOT} PATH_SUFFIXES include)
  find_library(KILN_NCCL_LIBRARY NAMES nccl libnccl.so.2
    HINTS ${NCCL_ROOT} $ENV{NCCL_ROOT} ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_LIBRARY_ROOT} PATH_SUFFIXES lib lib64)
  if(KILN_NCCL_INCLUDE_DIR)
    set(KILN_HAVE_NCCL ON)
    message(STATUS "kiln: NCCL found (${KILN_NCCL_INCLUDE_DIR}/nccl.h): process groups on CUDA tensors")
  elseif(KILN_NCCL STREQUAL "ON")
    message(FATAL_ERROR "kiln: KILN_NCCL=ON but nccl.h was not found (set NCCL_ROOT)")
  else()
    message(STATUS "kiln: NCCL not found (set NCCL_ROOT): process groups on CPU tensors only")
  endif()
endif()

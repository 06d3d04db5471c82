# Finds ct's dependencies through their own CMake or pkg-config files and
# collects what they enable into ct_deps. Each optional one reports whether it
# was found and what its absence turns off.
find_package(PkgConfig REQUIRED)
find_package(Threads REQUIRED)

add_library(ct_deps INTERFACE)
target_link_libraries(ct_deps INTERFACE Threads::Threads m)
set(CT_SUMMARY "")
# A line may contain ';', which would split it in a CMake list: it is stored
# as a placeholder and put back when printed.
macro(ct_summary line)
  string(REPLACE ";" "<semicolon>" _ct_line "${line}")
  list(APPEND CT_SUMMARY "${_ct_line}")
endmacro()

# OpenBLAS: required, for matmul. Its own CMake config first, pkg-config next.
find_package(OpenBLAS CONFIG QUIET)
if(OpenBLAS_FOUND)
  target_include_directories(ct_deps INTERFACE ${OpenBLAS_INCLUDE_DIRS})
  target_link_libraries(ct_deps INTERFACE ${OpenBLAS_LIBRARIES})
  ct_summary("OpenBLAS ${OpenBLAS_VERSION}: found (CMake config)")
else()
  pkg_check_modules(OPENBLAS REQUIRED openblas)
  target_include_directories(ct_deps INTERFACE ${OPENBLAS_INCLUDE_DIRS})
  target_link_libraries(ct_deps INTERFACE ${OPENBLAS_LINK_LIBRARIES})
  ct_summary("OpenBLAS ${OPENBLAS_VERSION}: found (pkg-config)")
endif()

# zlib: data/ reads gzipped IDX files (Fashion-MNIST as Debian ships it).
pkg_check_modules(ZLIB REQUIRED zlib)
target_include_directories(ct_deps INTERFACE ${ZLIB_INCLUDE_DIRS})
target_link_libraries(ct_deps INTERFACE ${ZLIB_LINK_LIBRARIES})
ct_summary("zlib ${ZLIB_VERSION}: found")

# libzmq: the store and RPC use it; found now so that a missing one is
# reported at configure time.
pkg_check_modules(ZMQ QUIET IMPORTED_TARGET libzmq)
if(ZMQ_FOUND)
  ct_summary("libzmq ${ZMQ_VERSION}: found")
else()
  ct_summary("libzmq: NOT found (install libzmq3-dev; needed by dist/ and dist_autograd/)")
endif()

# Open MPI.
set(CT_HAVE_MPI OFF)
if(NOT CT_MPI STREQUAL "OFF")
  find_package(MPI COMPONENTS C QUIET)
  if(MPI_C_FOUND)
    set(CT_HAVE_MPI ON)
    ct_summary("MPI ${MPI_C_VERSION}: found; the mpi collectives backend is built")
  elseif(CT_MPI STREQUAL "ON")
    message(FATAL_ERROR "CT_MPI=ON but MPI was not found (install libopenmpi-dev)")
  else()
    ct_summary("MPI: NOT found; the mpi backend and mpirun support are turned off")
  endif()
else()
  ct_summary("MPI: disabled (CT_MPI=OFF); the mpi backend is turned off")
endif()

# CUDA Toolkit (nvcc decides AUTO; the toolkit's CMake package gives cudart
# and cuBLAS).
set(CT_HAVE_CUDA OFF)
# Two builds cannot have CUDA: the CUDA runtime jumps to address 0 at its
# first call under ThreadSanitizer, and objects nvcc compiled make programs
# link through the CUDA toolchain, which has no libFuzzer.
set(_ct_without_cuda "")
if(CT_SANITIZE STREQUAL "thread")
  set(_ct_without_cuda "ThreadSanitizer (CT_SANITIZE=thread)")
elseif(CT_FUZZ)
  set(_ct_without_cuda "fuzzing (CT_FUZZ=ON)")
endif()
if(_ct_without_cuda AND CT_CUDA STREQUAL "ON")
  message(FATAL_ERROR "CT_CUDA=ON cannot be combined with ${_ct_without_cuda}")
endif()
if(_ct_without_cuda)
  ct_summary("CUDA: off under ${_ct_without_cuda}; CUDA tensors and NCCL are turned off")
elseif(NOT CT_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  check_language(CUDA)
  find_package(CUDAToolkit QUIET)
  if(CMAKE_CUDA_COMPILER AND CUDAToolkit_FOUND)
    set(CT_HAVE_CUDA ON)
    # Hopper (the H100 and H200) and Ampere as machine code, and Hopper's
    # PTX for what comes later; -DCMAKE_CUDA_ARCHITECTURES=... overrides.
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 80-real 90-real 90-virtual)
    endif()
    enable_language(CUDA)
    ct_summary("CUDA ${CUDAToolkit_VERSION}: found; CUDA device support is built")
  elseif(CT_CUDA STREQUAL "ON")
    message(FATAL_ERROR "CT_CUDA=ON but nvcc or the CUDA Toolkit was not found")
  else()
    ct_summary("CUDA: NOT found; CUDA tensors, cuBLAS and NCCL are turned off")
  endif()
else()
  ct_summary("CUDA: disabled (CT_CUDA=OFF); CUDA tensors and NCCL are turned off")
endif()

# gloo (Debian's libgloo-dev, PyTorch's CPU engine): its TCP transport
# carries the gloo backend, through a C++ shim, so it needs a C++ compiler.
# Debian installs the library in /usr/lib, not the multiarch directory, and
# its CMake config names no dependencies to export: a plain path, as for
# MPI.
set(CT_HAVE_GLOO OFF)
if(NOT CT_GLOO STREQUAL "OFF")
  include(CheckLanguage)
  check_language(CXX)
  find_path(GLOO_INCLUDE_DIR gloo/transport/tcp/device.h)
  find_library(GLOO_LIBRARY gloo)
  if(GLOO_INCLUDE_DIR AND GLOO_LIBRARY AND CMAKE_CXX_COMPILER)
    enable_language(CXX)
    set(CT_HAVE_GLOO ON)
    ct_summary("gloo: found (${GLOO_LIBRARY}); the gloo collectives backend is built")
  elseif(CT_GLOO STREQUAL "ON")
    message(FATAL_ERROR "CT_GLOO=ON but libgloo (gloo/transport/tcp/device.h, libgloo) or a C++ "
                        "compiler was not found (install libgloo-dev and g++)")
  else()
    ct_summary("gloo: NOT found; the gloo backend is turned off (install libgloo-dev)")
  endif()
else()
  ct_summary("gloo: disabled (CT_GLOO=OFF); the gloo backend is turned off")
endif()

# NCCL: needs CUDA.
set(CT_HAVE_NCCL OFF)
if(CT_HAVE_CUDA AND NOT CT_NCCL STREQUAL "OFF")
  find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
  find_library(NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR})
  if(NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
    set(CT_HAVE_NCCL ON)
    ct_summary("NCCL: found (${NCCL_LIBRARY}); the nccl collectives backend is built")
  elseif(CT_NCCL STREQUAL "ON")
    message(FATAL_ERROR "CT_NCCL=ON but nccl.h or libnccl was not found")
  else()
    ct_summary("NCCL: NOT found; the nccl backend is turned off")
  endif()
elseif(CT_NCCL STREQUAL "ON")
  message(FATAL_ERROR "CT_NCCL=ON needs CUDA")
else()
  ct_summary("NCCL: off (needs CUDA)")
endif()

function(ct_print_summary)
  message(STATUS "ct ${PROJECT_VERSION} configuration:")
  foreach(line IN LISTS CT_SUMMARY)
    string(REPLACE "<semicolon>" ";" line "${line}")
    message(STATUS "  ${line}")
  endforeach()
  message(STATUS "  sanitizers: ${CT_SANITIZE}")
  message(STATUS "  native kernels: ${CT_NATIVE}")
endfunction()

# Build options. Optional dependencies are AUTO by default: on when found.
set(CT_CUDA AUTO CACHE STRING "CUDA tensors and cuBLAS (AUTO: on when nvcc is found)")
set_property(CACHE CT_CUDA PROPERTY STRINGS AUTO ON OFF)
set(CT_MPI AUTO CACHE STRING "Open MPI collectives backend (AUTO: on when found)")
set_property(CACHE CT_MPI PROPERTY STRINGS AUTO ON OFF)
set(CT_NCCL AUTO CACHE STRING "NCCL collectives backend (AUTO: on with CUDA when found)")
set_property(CACHE CT_NCCL PROPERTY STRINGS AUTO ON OFF)
set(CT_GLOO AUTO CACHE STRING "gloo collectives backend over TCP (AUTO: on when libgloo-dev and a C++ compiler are found)")
set_property(CACHE CT_GLOO PROPERTY STRINGS AUTO ON OFF)
option(CT_BUILD_TESTS "Build the CTest suite" ON)
option(CT_BUILD_EXAMPLES "Build the examples" ON)
option(CT_BUILD_BENCH "Build the benchmarks" ON)
option(CT_WERROR "Treat warnings as errors (on in CI)" OFF)
option(CT_NATIVE "Compile kernels for this machine's CPU (-march=native)" ON)
set(CT_SANITIZE "" CACHE STRING "Sanitizers: empty, 'address;undefined' or 'thread'")
option(CT_FUZZ "Build the libFuzzer targets in tests/fuzz (clang; instruments the whole build)" OFF)

# C flags go to C sources only: nvcc takes its own (CUDA kernels, below).
add_compile_options(
  "$<$<COMPILE_LANGUAGE:C>:-Wall;-Wextra;-Wshadow;-Wstrict-prototypes;-Wmissing-prototypes;-Wno-unused-parameter>"
  "$<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra>")
if(CT_WERROR)
  add_compile_options("$<$<COMPILE_LANGUAGE:C>:-Werror>"
                      "$<$<COMPILE_LANGUAGE:CUDA>:-Werror=all-warnings>")
endif()

# Kernels need the vector units; -ffp-contract=fast lets FMA fuse. Results
# stay deterministic for a given build because contraction is decided at
# compile time, not at run time.
set(CT_KERNEL_FLAGS -O3 -ffp-contract=fast -fno-math-errno)
if(CT_NATIVE)
  list(APPEND CT_KERNEL_FLAGS -march=native)
  # GCC 12's AddressSanitizer moves locals into "fake stack" frames
  # (detect_stack_use_after_return, which ci/test.sh turns on) that are
  # aligned to 32 bytes only, while with AVX-512 GCC aligns local arrays to
  # 64 and writes them with aligned stores, which then fault (ct_cat's sizes
  # array did on an AVX-512 machine). Sanitized GCC builds keep to 256-bit
  # vectors.
  if(CT_SANITIZE MATCHES "address" AND CMAKE_C_COMPILER_ID STREQUAL "GNU")
    list(APPEND CT_KERNEL_FLAGS -mno-avx512f)
  endif()
endif()
list(JOIN CT_KERNEL_FLAGS ";" _ct_kernel_flags)
set(CT_KERNEL_FLAGS "$<$<COMPILE_LANGUAGE:C>:${_ct_kernel_flags}>" "$<$<COMPILE_LANGUAGE:CUDA>:-O3>")

if(CT_SANITIZE)
  if(CT_SANITIZE STREQUAL "thread")
    set(_ct_san -fsanitize=thread)
  elseif(CT_SANITIZE STREQUAL "address;undefined" OR CT_SANITIZE STREQUAL "address,undefined")
    set(_ct_san -fsanitize=address,undefined -fno-sanitize-recover=undefined)
  else()
    message(FATAL_ERROR "CT_SANITIZE must be empty, 'address;undefined' or 'thread' (got '${CT_SANITIZE}')")
  endif()
  list(JOIN _ct_san ";" _ct_san_flags)
  add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:${_ct_san_flags};-fno-omit-frame-pointer;-g>")
  add_link_options(${_ct_san})
endif()

# Fuzzing: everything is compiled with coverage instrumentation for libFuzzer
# (fuzzer-no-link: only the fuzz targets link libFuzzer's main) and with
# ASan and UBSan, so that a bad read or undefined behaviour anywhere in the
# library is a finding. ci/fuzz.sh configures a build like this.
if(CT_FUZZ)
  if(NOT CMAKE_C_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "CT_FUZZ=ON needs clang for libFuzzer (got ${CMAKE_C_COMPILER_ID}); "
                        "configure with -DCMAKE_C_COMPILER=clang")
  endif()
  if(CT_SANITIZE STREQUAL "thread")
    message(FATAL_ERROR "CT_FUZZ=ON builds with ASan, which cannot be combined with CT_SANITIZE=thread")
  endif()
  add_compile_options(
    "$<$<COMPILE_LANGUAGE:C>:-fsanitize=fuzzer-no-link,address,undefined;-fno-sanitize-recover=undefined;-fno-omit-frame-pointer;-g>")
  add_link_options(-fsanitize=address,undefined)
endif()

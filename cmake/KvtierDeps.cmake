# Every third-party dependency, found once. All come from Debian packages (scripts/deps.sh).
find_package(Threads REQUIRED)
find_package(PkgConfig REQUIRED)
find_package(FlatBuffers CONFIG REQUIRED)
pkg_check_modules(XXHASH REQUIRED IMPORTED_TARGET libxxhash)
find_program(FLATC flatc REQUIRED)
if(NOT KVTIER_CLIENT_ONLY)  # the client and the Python extension need only the three above
  find_package(Boost 1.74 REQUIRED)               # header-only Asio
  find_package(yaml-cpp CONFIG REQUIRED)
  find_package(CLI11 CONFIG REQUIRED)
  find_package(nlohmann_json CONFIG REQUIRED)
  find_package(GTest CONFIG REQUIRED)
  find_package(RocksDB CONFIG REQUIRED)
  pkg_check_modules(URING REQUIRED IMPORTED_TARGET liburing)
  pkg_check_modules(SYSTEMD REQUIRED IMPORTED_TARGET libsystemd)
  pkg_check_modules(HIREDIS REQUIRED IMPORTED_TARGET hiredis)  # the remote tier's Redis Cluster client
  pkg_check_modules(SODIUM REQUIRED IMPORTED_TARGET libsodium)  # the remote tier's keyed MAC (BLAKE2b)
  pkg_check_modules(ZMQ REQUIRED IMPORTED_TARGET libzmq)  # KV events; cppzmq and msgpack-cxx are headers
  find_path(CPPZMQ_INCLUDE_DIR zmq.hpp REQUIRED)
  find_path(MSGPACK_CXX_INCLUDE_DIR msgpack.hpp REQUIRED)
endif()

# CUDA is optional: without nvcc everything but the .cu files builds.
set(KVTIER_HAVE_CUDA OFF)
if(NOT KVTIER_WITH_CUDA STREQUAL "off")
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)
    set(KVTIER_HAVE_CUDA ON)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES OR CMAKE_CUDA_ARCHITECTURES STREQUAL "52")
      set(CMAKE_CUDA_ARCHITECTURES 80 90)
    endif()
  elseif(KVTIER_WITH_CUDA STREQUAL "on")
    message(FATAL_ERROR "KVTIER_WITH_CUDA=on but no CUDA compiler was found")
  endif()
endif()
message(STATUS "kvtier: CUDA kernels ${KVTIER_HAVE_CUDA}")

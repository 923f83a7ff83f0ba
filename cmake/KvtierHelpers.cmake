# One helper per kind of target (as leveldb_test / absl_cc_library).

add_library(kvtier_build_flags INTERFACE)
target_compile_options(kvtier_build_flags INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-missing-field-initializers>)
# Warnings are errors in the project's own code (targets linking kvtier_build_flags), except
# in the Python package's build, which meets compilers the project never saw.
if(KVTIER_CLIENT_ONLY)
  option(KVTIER_WERROR "Treat warnings in kvtier's own code as errors" OFF)
else()
  option(KVTIER_WERROR "Treat warnings in kvtier's own code as errors" ON)
endif()
if(KVTIER_WERROR)
  # GCC's maybe-uninitialized stays a warning: its flow analysis reports false positives
  # inside libstdc++ (std::regex, std::function) at the sanitizer builds' -O1.
  target_compile_options(kvtier_build_flags INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-Werror>
                         $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<CXX_COMPILER_ID:GNU>>:-Wno-error=maybe-uninitialized>)
endif()
# clang checks the locking contracts written with protocol/base/mutex.h's annotations
# (`make check-thread-safety` builds everything with clang for that).
if(CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
  target_compile_options(kvtier_build_flags INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-Wthread-safety>)
endif()
if(KVTIER_SANITIZE STREQUAL "address")
  target_compile_options(kvtier_build_flags INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined>)
  target_link_options(kvtier_build_flags INTERFACE -fsanitize=address,undefined)
elseif(KVTIER_SANITIZE STREQUAL "thread")
  # GCC warns (-Wtsan) of the atomic_thread_fence inside Boost.Asio's headers, which TSan
  # cannot model: a warning about a third-party header, not an error.
  target_compile_options(kvtier_build_flags INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=thread>
                         $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<CXX_COMPILER_ID:GNU>>:-Wno-error=tsan>)
  target_link_options(kvtier_build_flags INTERFACE -fsanitize=thread)
elseif(KVTIER_SANITIZE STREQUAL "undefined")
  target_compile_options(kvtier_build_flags INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=undefined -fno-sanitize-recover=undefined>)
  target_link_options(kvtier_build_flags INTERFACE -fsanitize=undefined)
elseif(KVTIER_SANITIZE STREQUAL "fuzzer")
  # libFuzzer builds (clang): everything instrumented for coverage, ASan and UBSan; the
  # fuzz targets link the libFuzzer driver (tests/fuzz).
  target_compile_options(kvtier_build_flags INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=fuzzer-no-link,address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined>)
  target_link_options(kvtier_build_flags INTERFACE -fsanitize=address,undefined)
  set(KVTIER_FUZZ ON)
elseif(NOT KVTIER_SANITIZE STREQUAL "")
  message(FATAL_ERROR "KVTIER_SANITIZE must be address, thread, undefined, fuzzer or empty")
endif()

# kvtier_add_library(NAME SRCS ... DEPS ...)
function(kvtier_add_library name)
  cmake_parse_arguments(ARG "" "" "SRCS;DEPS" ${ARGN})
  add_library(${name} STATIC ${ARG_SRCS})
  target_include_directories(${name} PUBLIC ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR}/generated)
  target_link_libraries(${name} PUBLIC ${ARG_DEPS} PRIVATE kvtier_build_flags)
  set_target_properties(${name} PROPERTIES POSITION_INDEPENDENT_CODE ON)
endfunction()

# kvtier_add_executable(NAME SRCS ... DEPS ...): lands in build/bin/.
function(kvtier_add_executable name)
  cmake_parse_arguments(ARG "" "" "SRCS;DEPS" ${ARGN})
  add_executable(${name} ${ARG_SRCS})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} kvtier_build_flags)
endfunction()

# kvtier_add_test(NAME SRCS ... DEPS ... LABELS label [CRASH filter]): one gtest binary, each
# TEST a ctest test labelled LABELS. Tests matching the gtest filter CRASH (crash and fault
# campaigns) are labelled crash instead, so `ctest -L crash` runs them and `-LE crash` skips
# them. (One label per discovery: CMake 3.25 flattens a list of labels passed through
# gtest_discover_tests' PROPERTIES.)
function(kvtier_add_test name)
  cmake_parse_arguments(ARG "" "TIMEOUT;CRASH" "SRCS;DEPS;LABELS" ${ARGN})
  add_executable(${name} ${ARG_SRCS})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} kvtier_test_support GTest::gtest GTest::gmock GTest::gtest_main
                        kvtier_build_flags)
  set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/tests)
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  set(labels "${ARG_LABELS}")
  if(ARG_CRASH)
    gtest_discover_tests(${name}
      DISCOVERY_MODE PRE_TEST
      TEST_FILTER "-${ARG_CRASH}"
      PROPERTIES LABELS "${labels}" TIMEOUT ${ARG_TIMEOUT}
      DISCOVERY_TIMEOUT 60)
    gtest_discover_tests(${name}
      DISCOVERY_MODE PRE_TEST
      TEST_FILTER "${ARG_CRASH}"
      PROPERTIES LABELS crash TIMEOUT ${ARG_TIMEOUT}
      DISCOVERY_TIMEOUT 60)
  else()
    gtest_discover_tests(${name}
      DISCOVERY_MODE PRE_TEST
      PROPERTIES LABELS "${labels}" TIMEOUT ${ARG_TIMEOUT}
      DISCOVERY_TIMEOUT 60)
  endif()
endfunction()

# Copies the Python sources (*.py, *.pyi, py.typed) under `src` to `dst` when they change,
# as target `name` (built by default): how the build tree assembles importable packages.
function(kvtier_copy_python_tree name src dst)
  file(GLOB_RECURSE sources RELATIVE ${src} CONFIGURE_DEPENDS ${src}/*.py ${src}/*.pyi ${src}/py.typed)
  set(copied)
  foreach(f ${sources})
    add_custom_command(OUTPUT ${dst}/${f} COMMAND ${CMAKE_COMMAND} -E copy ${src}/${f} ${dst}/${f}
                       DEPENDS ${src}/${f})
    list(APPEND copied ${dst}/${f})
  endforeach()
  add_custom_target(${name} ALL DEPENDS ${copied} ${ARGN})
endfunction()

# `kvtier-fuzz-corpus --help` (and any argument that looks like a flag) prints the usage and
# writes nothing: run it in an empty directory and fail if anything appears there.
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
foreach(arg --help -h --out)
  execute_process(COMMAND ${GEN} ${arg} WORKING_DIRECTORY ${WORK} RESULT_VARIABLE rc OUTPUT_VARIABLE out
                  ERROR_VARIABLE err)
  if(arg STREQUAL "--out")
    if(rc EQUAL 0)
      message(FATAL_ERROR "kvtier-fuzz-corpus ${arg} exited 0: a flag was taken as the output directory")
    endif()
  elseif(NOT rc EQUAL 0 OR NOT out MATCHES "usage:")
    message(FATAL_ERROR "kvtier-fuzz-corpus ${arg}: exit ${rc}, no usage on stdout: ${out}${err}")
  endif()
  file(GLOB left ${WORK}/* ${WORK}/.*)
  if(left)
    message(FATAL_ERROR "kvtier-fuzz-corpus ${arg} wrote ${left}")
  endif()
endforeach()

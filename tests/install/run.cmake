# ctest driver: build and run tests/install (consumer.cpp and the README's examples) against
# kiln as a CMake package, found one of two ways (PACKAGE):
#   installed:  `cmake --install` into a scratch prefix, then CMAKE_PREFIX_PATH=prefix;
#   build-tree: kiln_DIR=KILN_BUILD_DIR, the build tree itself.
foreach(var PACKAGE KILN_BUILD_DIR KILN_SOURCE_DIR WORK_DIR)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "run.cmake needs -D${var}=...")
  endif()
endforeach()
file(REMOVE_RECURSE ${WORK_DIR})
function(run)
  execute_process(COMMAND ${ARGV} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGV}\n${out}\n${err}")
  endif()
endfunction()

if(PACKAGE STREQUAL "installed")
  run(${CMAKE_COMMAND} --install ${KILN_BUILD_DIR} --prefix ${WORK_DIR}/prefix)
  set(find_kiln -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix -DKILN_EXPECTED_PREFIX=${WORK_DIR}/prefix)
elseif(PACKAGE STREQUAL "build-tree")
  set(find_kiln -Dkiln_DIR=${KILN_BUILD_DIR} -DKILN_EXPECTED_PREFIX=${KILN_BUILD_DIR})
else()
  message(FATAL_ERROR "PACKAGE=${PACKAGE}: expected installed or build-tree")
endif()
# The consumer is built by kiln's compiler (and its launcher, ccache, when it has one).
set(compiler)
foreach(var CMAKE_CXX_COMPILER CMAKE_CXX_COMPILER_LAUNCHER)
  if(NOT "${${var}}" STREQUAL "")
    list(APPEND compiler -D${var}=${${var}})
  endif()
endforeach()
run(${CMAKE_COMMAND} -S ${KILN_SOURCE_DIR}/tests/install -B ${WORK_DIR}/build -G Ninja
    -DCMAKE_BUILD_TYPE=Release ${find_kiln} ${compiler}
    -DKILN_README_DIR=${KILN_README_DIR} -DKILN_README_EXAMPLES=${KILN_README_EXAMPLES})
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
string(REPLACE "," ";" examples "${KILN_README_EXAMPLES}")
list(TRANSFORM examples PREPEND readme_)
foreach(program consumer ${examples})
  run(${WORK_DIR}/build/${program})
endforeach()
message(STATUS "the ${PACKAGE} kiln package builds and runs consumer.cpp and the README's examples")

# cmake -P script behind the package test (see CMakeLists.txt beside it).
foreach(var STRATA_BUILD_DIR CONSUMER_SOURCE_DIR WORK_DIR GENERATOR CXX_COMPILER)
  if(NOT DEFINED ${var} OR "${${var}}" STREQUAL "")
    message(FATAL_ERROR "run_package_test.cmake: ${var} is not set")
  endif()
endforeach()
if(NOT STRATA_CONFIG)
  set(STRATA_CONFIG Release)
endif()

function(step what)
  message(STATUS "package test: ${what}")
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "package test: '${what}' failed (${rc}): ${ARGN}")
  endif()
endfunction()

set(prefix ${WORK_DIR}/prefix)
set(consumer_build ${WORK_DIR}/consumer-build)
file(REMOVE_RECURSE ${WORK_DIR})

step("install into ${prefix}"
  ${CMAKE_COMMAND} --install ${STRATA_BUILD_DIR} --prefix ${prefix} --config ${STRATA_CONFIG})

foreach(file include/strata/core.hpp)
  if(NOT EXISTS ${prefix}/${file})
    message(FATAL_ERROR "package test: ${file} was not installed")
  endif()
endforeach()
file(GLOB_RECURSE config_files ${prefix}/*/strataConfig.cmake ${prefix}/*/FindNCCL.cmake)
list(LENGTH config_files n)
if(n LESS 2)
  message(FATAL_ERROR "package test: strataConfig.cmake or FindNCCL.cmake missing under ${prefix}: ${config_files}")
endif()

set(configure_args -S ${CONSUMER_SOURCE_DIR} -B ${consumer_build} -G ${GENERATOR}
    -D CMAKE_BUILD_TYPE=${STRATA_CONFIG}
    -D CMAKE_CXX_COMPILER=${CXX_COMPILER}
    -D CMAKE_PREFIX_PATH=${prefix}
    -D CMAKE_FIND_USE_PACKAGE_REGISTRY=OFF
    -D EXPECT_CUDA=${EXPECT_CUDA}
    -D EXPECT_NCCL=${EXPECT_NCCL}
    -D EXPECT_CUDA_KERNELS=${EXPECT_CUDA_KERNELS})
if(Eigen3_DIR)
  list(APPEND configure_args -D Eigen3_DIR=${Eigen3_DIR})
endif()
step("configure the consumer" ${CMAKE_COMMAND} ${configure_args})
step("build the consumer" ${CMAKE_COMMAND} --build ${consumer_build} --config ${STRATA_CONFIG})

# strata_consumer (header-only strata::strata) and strata_consumer_gemm (strata::cpu_kernels): each
# must be built and must run.
foreach(program strata_consumer strata_consumer_gemm)
  find_program(consumer_exe_${program} ${program}
    PATHS ${consumer_build} ${consumer_build}/${STRATA_CONFIG} NO_DEFAULT_PATH NO_CACHE)
  if(NOT consumer_exe_${program})
    message(FATAL_ERROR "package test: the consumer's program ${program} was not built in ${consumer_build}")
  endif()
  step("run the consumer's ${program}" ${consumer_exe_${program}})
endforeach()
if(EXPECT_CUDA_KERNELS AND NOT EXISTS ${consumer_build}/strata_consumer_cuda)
  message(FATAL_ERROR "package test: strata was installed with strata::cuda_kernels but the consumer's CUDA "
                      "program (host compiler, linked against it) was not built in ${consumer_build}")
endif()

# Install rules and the package config for find_package(strata).
#
# Installed layout (prefix-relative):
#   include/strata/...                       all headers (CUDA and NCCL ones are opt-in to include)
#   lib/cmake/strata/strataConfig.cmake      + strataConfigVersion.cmake, strataTargets.cmake
#   lib/cmake/strata/FindNCCL.cmake          so consumers of strata::nccl can find NCCL again
#   lib/cmake/strata/FindCUDNN.cmake, FindCudnnFrontend.cmake   the same for strata::cudnn
#   lib/cmake/strata/FindSentencePiece.cmake   the same for strata::sentencepiece
#   share/doc/strata/LICENSE
include(CMakePackageConfigHelpers)

set(STRATA_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/strata
    CACHE STRING "Where strataConfig.cmake is installed, relative to the prefix")

install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/strata
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.hpp" PATTERN "*.h" PATTERN "*.cuh")

install(TARGETS ${strata_exported_targets} EXPORT strataTargets)
install(EXPORT strataTargets
        NAMESPACE strata::
        FILE strataTargets.cmake
        DESTINATION ${STRATA_INSTALL_CMAKEDIR})

configure_package_config_file(
  ${CMAKE_CURRENT_LIST_DIR}/strataConfig.cmake.in
  ${PROJECT_BINARY_DIR}/strataConfig.cmake
  INSTALL_DESTINATION ${STRATA_INSTALL_CMAKEDIR})
# Not architecture-independent: the package holds compiled libraries (strata::cpu_kernels, and
# strata::cuda_kernels where nvcc was enabled), so a consumer must match its pointer size.
write_basic_package_version_file(
  ${PROJECT_BINARY_DIR}/strataConfigVersion.cmake
  VERSION ${PROJECT_VERSION}
  COMPATIBILITY SameMajorVersion)

install(FILES
          ${PROJECT_BINARY_DIR}/strataConfig.cmake
          ${PROJECT_BINARY_DIR}/strataConfigVersion.cmake
          ${CMAKE_CURRENT_LIST_DIR}/FindNCCL.cmake
          ${CMAKE_CURRENT_LIST_DIR}/FindCUDNN.cmake
          ${CMAKE_CURRENT_LIST_DIR}/FindCudnnFrontend.cmake
          ${CMAKE_CURRENT_LIST_DIR}/FindSentencePiece.cmake
        DESTINATION ${STRATA_INSTALL_CMAKEDIR})

if(EXISTS ${PROJECT_SOURCE_DIR}/LICENSE)
  install(FILES ${PROJECT_SOURCE_DIR}/LICENSE DESTINATION ${CMAKE_INSTALL_DOCDIR})
endif()

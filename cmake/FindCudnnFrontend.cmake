# FindCudnnFrontend.cmake: finds the header-only cuDNN frontend (cudnn_frontend.h, C++ API).
#
# Looks in, in order:
#   STRATA_CUDNN_FRONTEND_DIR (CMake variable or environment): a folder holding include/ or the
#     headers themselves
#   <source>/.deps/cudnn-frontend (a local, git-ignored copy)
#   the `nvidia-cudnn-frontend` Python package of `python3`: its headers sit in
#     site-packages/include next to the `cudnn` module
#   the system paths
# The headers ship in the wheel: `python3 -m pip download --no-deps nvidia-cudnn-frontend`, unzip,
# and point STRATA_CUDNN_FRONTEND_DIR at the unpacked folder.
#
# Sets CudnnFrontend_FOUND, CudnnFrontend_INCLUDE_DIRS, CudnnFrontend_VERSION and defines the
# imported target CudnnFrontend::CudnnFrontend (headers only; the frontend's experimental engines
# call NVRTC, so it links CUDA::nvrtc when that target exists).

set(_fe_hints)
foreach(_fe_root IN ITEMS "${STRATA_CUDNN_FRONTEND_DIR}" "$ENV{STRATA_CUDNN_FRONTEND_DIR}"
                          "${PROJECT_SOURCE_DIR}/.deps/cudnn-frontend")
  if(_fe_root)
    list(APPEND _fe_hints "${_fe_root}")
  endif()
endforeach()

find_program(_fe_python NAMES python3 python)
if(_fe_python)
  execute_process(
    COMMAND "${_fe_python}" -c "import cudnn, os; print(os.path.dirname(os.path.dirname(cudnn.__file__)))"
    OUTPUT_VARIABLE _fe_python_dir OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE _fe_python_rc)
  if(_fe_python_rc EQUAL 0 AND IS_DIRECTORY "${_fe_python_dir}")
    list(APPEND _fe_hints "${_fe_python_dir}")
  endif()
  execute_process(
    COMMAND "${_fe_python}" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    OUTPUT_VARIABLE _fe_site_dir OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE _fe_site_rc)
  if(_fe_site_rc EQUAL 0 AND IS_DIRECTORY "${_fe_site_dir}")
    list(APPEND _fe_hints "${_fe_site_dir}")
  endif()
endif()

find_path(CudnnFrontend_INCLUDE_DIR cudnn_frontend.h
  HINTS ${_fe_hints}
  PATH_SUFFIXES include)

if(CudnnFrontend_INCLUDE_DIR AND EXISTS "${CudnnFrontend_INCLUDE_DIR}/cudnn_frontend_version.h")
  file(STRINGS "${CudnnFrontend_INCLUDE_DIR}/cudnn_frontend_version.h" _fe_version_lines
       REGEX "^#define CUDNN_FRONTEND_(MAJOR|MINOR|PATCH)_VERSION[ \t]+[0-9]+")
  foreach(_fe_part MAJOR MINOR PATCH)
    string(REGEX REPLACE ".*#define CUDNN_FRONTEND_${_fe_part}_VERSION[ \t]+([0-9]+).*" "\\1"
           CudnnFrontend_VERSION_${_fe_part} "${_fe_version_lines}")
  endforeach()
  set(CudnnFrontend_VERSION
      "${CudnnFrontend_VERSION_MAJOR}.${CudnnFrontend_VERSION_MINOR}.${CudnnFrontend_VERSION_PATCH}")
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(CudnnFrontend
  REQUIRED_VARS CudnnFrontend_INCLUDE_DIR
  VERSION_VAR CudnnFrontend_VERSION)

if(CudnnFrontend_FOUND)
  set(CudnnFrontend_INCLUDE_DIRS "${CudnnFrontend_INCLUDE_DIR}")
  if(NOT TARGET CudnnFrontend::CudnnFrontend)
    add_library(CudnnFrontend::CudnnFrontend INTERFACE IMPORTED)
    # SYSTEM: the frontend's own warnings are not ours to fix.
    set_target_properties(CudnnFrontend::CudnnFrontend PROPERTIES
      INTERFACE_SYSTEM_INCLUDE_DIRECTORIES "${CudnnFrontend_INCLUDE_DIR}"
      INTERFACE_INCLUDE_DIRECTORIES "${CudnnFrontend_INCLUDE_DIR}")
    if(TARGET CUDA::nvrtc)
      set_property(TARGET CudnnFrontend::CudnnFrontend APPEND PROPERTY INTERFACE_LINK_LIBRARIES CUDA::nvrtc)
    endif()
  endif()
endif()
mark_as_advanced(CudnnFrontend_INCLUDE_DIR _fe_python)

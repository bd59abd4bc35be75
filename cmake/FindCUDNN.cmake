# FindCUDNN.cmake: finds the NVIDIA cuDNN library (version 9 or later: one libcudnn.so that loads
# its engine libraries from its own folder at run time).
#
# Looks in CUDNN_ROOT / CUDNN_HOME / CUDNN_DIR (CMake variables or environment), next to the CUDA
# toolkit when CUDAToolkit was found, in the `nvidia-cudnn-cu*` Python package of `python3`
# (site-packages/nvidia/cudnn, what PyTorch installs), then in the system paths.
#
# Sets CUDNN_FOUND, CUDNN_INCLUDE_DIRS, CUDNN_LIBRARIES, CUDNN_VERSION and defines the imported
# target CUDNN::cudnn.

set(_cudnn_hints)
foreach(_cudnn_root IN ITEMS "${CUDNN_ROOT}" "$ENV{CUDNN_ROOT}" "${CUDNN_HOME}" "$ENV{CUDNN_HOME}"
                             "${CUDNN_DIR}" "$ENV{CUDNN_DIR}")
  if(_cudnn_root)
    list(APPEND _cudnn_hints "${_cudnn_root}")
  endif()
endforeach()
if(CUDAToolkit_LIBRARY_ROOT)
  list(APPEND _cudnn_hints "${CUDAToolkit_LIBRARY_ROOT}")
endif()
if(CUDAToolkit_BIN_DIR)
  get_filename_component(_cudnn_cuda_root "${CUDAToolkit_BIN_DIR}" DIRECTORY)
  list(APPEND _cudnn_hints "${_cudnn_cuda_root}")
endif()

# The Python wheel (nvidia-cudnn-cu12 / -cu13): site-packages/nvidia/cudnn/{include,lib}.
find_program(_cudnn_python NAMES python3 python)
if(_cudnn_python)
  execute_process(
    COMMAND "${_cudnn_python}" -c "import nvidia.cudnn as m, os; print(list(m.__path__)[0])"
    OUTPUT_VARIABLE _cudnn_python_dir OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE _cudnn_python_rc)
  if(_cudnn_python_rc EQUAL 0 AND IS_DIRECTORY "${_cudnn_python_dir}")
    list(APPEND _cudnn_hints "${_cudnn_python_dir}")
  endif()
endif()

find_path(CUDNN_INCLUDE_DIR cudnn.h
  HINTS ${_cudnn_hints} ${CUDAToolkit_INCLUDE_DIRS}
  PATH_SUFFIXES include)
find_library(CUDNN_LIBRARY
  NAMES cudnn libcudnn.so.9
  HINTS ${_cudnn_hints} ${CUDAToolkit_LIBRARY_DIR}
  PATH_SUFFIXES lib lib64 lib/x86_64-linux-gnu lib/aarch64-linux-gnu)

if(CUDNN_INCLUDE_DIR)
  foreach(_cudnn_header IN ITEMS cudnn_version.h cudnn.h)
    if(EXISTS "${CUDNN_INCLUDE_DIR}/${_cudnn_header}" AND NOT CUDNN_VERSION)
      file(STRINGS "${CUDNN_INCLUDE_DIR}/${_cudnn_header}" _cudnn_version_lines
           REGEX "^#define CUDNN_(MAJOR|MINOR|PATCHLEVEL)[ \t]+[0-9]+")
      foreach(_cudnn_part MAJOR MINOR PATCHLEVEL)
        string(REGEX REPLACE ".*#define CUDNN_${_cudnn_part}[ \t]+([0-9]+).*" "\\1"
               CUDNN_VERSION_${_cudnn_part} "${_cudnn_version_lines}")
      endforeach()
      if(CUDNN_VERSION_MAJOR MATCHES "^[0-9]+$" AND CUDNN_VERSION_MINOR MATCHES "^[0-9]+$"
         AND CUDNN_VERSION_PATCHLEVEL MATCHES "^[0-9]+$")
        set(CUDNN_VERSION "${CUDNN_VERSION_MAJOR}.${CUDNN_VERSION_MINOR}.${CUDNN_VERSION_PATCHLEVEL}")
      endif()
    endif()
  endforeach()
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(CUDNN
  REQUIRED_VARS CUDNN_LIBRARY CUDNN_INCLUDE_DIR
  VERSION_VAR CUDNN_VERSION)

if(CUDNN_FOUND)
  set(CUDNN_INCLUDE_DIRS "${CUDNN_INCLUDE_DIR}")
  set(CUDNN_LIBRARIES "${CUDNN_LIBRARY}")
  if(NOT TARGET CUDNN::cudnn)
    add_library(CUDNN::cudnn UNKNOWN IMPORTED)
    set_target_properties(CUDNN::cudnn PROPERTIES
      IMPORTED_LOCATION "${CUDNN_LIBRARY}"
      INTERFACE_INCLUDE_DIRECTORIES "${CUDNN_INCLUDE_DIR}")
  endif()
endif()
mark_as_advanced(CUDNN_INCLUDE_DIR CUDNN_LIBRARY _cudnn_python)

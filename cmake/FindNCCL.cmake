# FindNCCL.cmake: finds the NVIDIA Collective Communications Library.
#
# Looks in NCCL_ROOT / NCCL_HOME (CMake variables or environment), next to the CUDA toolkit
# when CUDAToolkit was found, then in the system paths (Debian/Ubuntu's libnccl-dev puts nccl.h
# in /usr/include and libnccl.so in /usr/lib/x86_64-linux-gnu).
#
# Sets NCCL_FOUND, NCCL_INCLUDE_DIRS, NCCL_LIBRARIES, NCCL_VERSION and defines the imported
# target NCCL::NCCL. NCCL_USE_STATIC=ON prefers libnccl_static.a.

set(_nccl_hints)
foreach(_nccl_root IN ITEMS "${NCCL_ROOT}" "$ENV{NCCL_ROOT}" "${NCCL_HOME}" "$ENV{NCCL_HOME}"
                            "${NCCL_DIR}" "$ENV{NCCL_DIR}")
  if(_nccl_root)
    list(APPEND _nccl_hints "${_nccl_root}")
  endif()
endforeach()
if(CUDAToolkit_LIBRARY_ROOT)
  list(APPEND _nccl_hints "${CUDAToolkit_LIBRARY_ROOT}")
endif()
if(CUDAToolkit_BIN_DIR)
  get_filename_component(_nccl_cuda_root "${CUDAToolkit_BIN_DIR}" DIRECTORY)
  list(APPEND _nccl_hints "${_nccl_cuda_root}")
endif()

find_path(NCCL_INCLUDE_DIR nccl.h
  HINTS ${_nccl_hints} ${CUDAToolkit_INCLUDE_DIRS}
  PATH_SUFFIXES include)

if(NCCL_USE_STATIC)
  set(_nccl_names nccl_static nccl)
else()
  set(_nccl_names nccl)
endif()
find_library(NCCL_LIBRARY
  NAMES ${_nccl_names}
  HINTS ${_nccl_hints} ${CUDAToolkit_LIBRARY_DIR}
  PATH_SUFFIXES lib lib64 lib/x86_64-linux-gnu lib/aarch64-linux-gnu)

if(NCCL_INCLUDE_DIR AND EXISTS "${NCCL_INCLUDE_DIR}/nccl.h")
  file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" _nccl_version_lines
       REGEX "^#define NCCL_(MAJOR|MINOR|PATCH)[ \t]+[0-9]+")
  foreach(_nccl_part MAJOR MINOR PATCH)
    string(REGEX REPLACE ".*#define NCCL_${_nccl_part}[ \t]+([0-9]+).*" "\\1"
           NCCL_VERSION_${_nccl_part} "${_nccl_version_lines}")
  endforeach()
  if(NCCL_VERSION_MAJOR MATCHES "^[0-9]+$" AND NCCL_VERSION_MINOR MATCHES "^[0-9]+$"
     AND NCCL_VERSION_PATCH MATCHES "^[0-9]+$")
    set(NCCL_VERSION "${NCCL_VERSION_MAJOR}.${NCCL_VERSION_MINOR}.${NCCL_VERSION_PATCH}")
  endif()
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(NCCL
  REQUIRED_VARS NCCL_LIBRARY NCCL_INCLUDE_DIR
  VERSION_VAR NCCL_VERSION)

if(NCCL_FOUND)
  set(NCCL_INCLUDE_DIRS "${NCCL_INCLUDE_DIR}")
  set(NCCL_LIBRARIES "${NCCL_LIBRARY}")
  if(NOT TARGET NCCL::NCCL)
    add_library(NCCL::NCCL UNKNOWN IMPORTED)
    set_target_properties(NCCL::NCCL PROPERTIES
      IMPORTED_LOCATION "${NCCL_LIBRARY}"
      INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
    if(TARGET CUDA::cudart)
      set_property(TARGET NCCL::NCCL APPEND PROPERTY INTERFACE_LINK_LIBRARIES CUDA::cudart)
    endif()
  endif()
endif()

mark_as_advanced(NCCL_INCLUDE_DIR NCCL_LIBRARY)
unset(_nccl_hints)
unset(_nccl_names)
unset(_nccl_root)
unset(_nccl_cuda_root)
unset(_nccl_version_lines)
unset(_nccl_part)

# FindCutlass.cmake: finds the CUTLASS 3.x headers (header-only; strata uses its Hopper grouped GEMM).
#
# Looks in, in order:
#   STRATA_CUTLASS_DIR (CMake variable or environment): a folder holding include/cutlass/cutlass.h
#     or cutlass/cutlass.h itself
#   <source>/.deps/cutlass (a local, git-ignored copy)
#   the `nvidia-cutlass` Python package of `python3`: its headers sit in
#     site-packages/cutlass_library/source/include
# The headers ship in the wheel: `python3 -m pip download --no-deps nvidia-cutlass`, unzip, and
# point STRATA_CUTLASS_DIR at cutlass_library/source.
#
# Sets Cutlass_FOUND, Cutlass_INCLUDE_DIR, Cutlass_VERSION (3.0 or later is required).

set(_cutlass_hints)
foreach(_cutlass_root IN ITEMS "${STRATA_CUTLASS_DIR}" "$ENV{STRATA_CUTLASS_DIR}" "${PROJECT_SOURCE_DIR}/.deps/cutlass")
  if(_cutlass_root)
    list(APPEND _cutlass_hints "${_cutlass_root}")
  endif()
endforeach()
find_program(_cutlass_python NAMES python3 python)
if(_cutlass_python)
  execute_process(
    COMMAND "${_cutlass_python}" -c "import cutlass_library, os; print(os.path.join(os.path.dirname(cutlass_library.__file__), 'source'))"
    OUTPUT_VARIABLE _cutlass_python_dir OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE _cutlass_python_rc)
  if(_cutlass_python_rc EQUAL 0 AND IS_DIRECTORY "${_cutlass_python_dir}")
    list(APPEND _cutlass_hints "${_cutlass_python_dir}")
  endif()
endif()

find_path(Cutlass_INCLUDE_DIR NAMES cutlass/cutlass.h HINTS ${_cutlass_hints} PATH_SUFFIXES include NO_DEFAULT_PATH)
if(NOT Cutlass_INCLUDE_DIR)
  find_path(Cutlass_INCLUDE_DIR NAMES cutlass/cutlass.h)
endif()

set(Cutlass_VERSION "")
if(Cutlass_INCLUDE_DIR AND EXISTS "${Cutlass_INCLUDE_DIR}/cutlass/version.h")
  file(STRINGS "${Cutlass_INCLUDE_DIR}/cutlass/version.h" _cutlass_lines REGEX "#define CUTLASS_(MAJOR|MINOR|PATCH) [0-9]+")
  foreach(_part MAJOR MINOR PATCH)
    string(REGEX MATCH "CUTLASS_${_part} ([0-9]+)" _m "${_cutlass_lines}")
    set(_cutlass_${_part} "${CMAKE_MATCH_1}")
  endforeach()
  set(Cutlass_VERSION "${_cutlass_MAJOR}.${_cutlass_MINOR}.${_cutlass_PATCH}")
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(Cutlass REQUIRED_VARS Cutlass_INCLUDE_DIR VERSION_VAR Cutlass_VERSION)
if(Cutlass_FOUND AND Cutlass_VERSION VERSION_LESS 3.0)
  message(STATUS "strata: CUTLASS ${Cutlass_VERSION} at ${Cutlass_INCLUDE_DIR} is older than 3.0, not used")
  set(Cutlass_FOUND FALSE)
endif()
mark_as_advanced(Cutlass_INCLUDE_DIR)

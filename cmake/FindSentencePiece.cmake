# FindSentencePiece.cmake: finds the SentencePiece C++ library (the encoder only; not its trainer).
#
# Asks pkg-config for "sentencepiece" first (Debian/Ubuntu's libsentencepiece-dev ships a .pc), then
# looks for sentencepiece_processor.h and libsentencepiece in SentencePiece_ROOT /
# SENTENCEPIECE_ROOT (CMake variables or environment) and the system paths.
#
# Sets SentencePiece_FOUND, SentencePiece_INCLUDE_DIR, SentencePiece_LIBRARY, SentencePiece_VERSION
# (when pkg-config knows it) and defines the imported target SentencePiece::SentencePiece.

set(_sentencepiece_hints)
foreach(_sentencepiece_root IN ITEMS "${SentencePiece_ROOT}" "$ENV{SentencePiece_ROOT}" "${SENTENCEPIECE_ROOT}"
                                     "$ENV{SENTENCEPIECE_ROOT}")
  if(_sentencepiece_root)
    list(APPEND _sentencepiece_hints "${_sentencepiece_root}")
  endif()
endforeach()

find_package(PkgConfig QUIET)
if(PKG_CONFIG_FOUND)
  pkg_check_modules(_sentencepiece_pc QUIET sentencepiece)
endif()

find_path(SentencePiece_INCLUDE_DIR sentencepiece_processor.h
  HINTS ${_sentencepiece_hints} ${_sentencepiece_pc_INCLUDE_DIRS}
  PATH_SUFFIXES include)
find_library(SentencePiece_LIBRARY
  NAMES sentencepiece
  HINTS ${_sentencepiece_hints} ${_sentencepiece_pc_LIBRARY_DIRS}
  PATH_SUFFIXES lib lib64 lib/x86_64-linux-gnu lib/aarch64-linux-gnu)
if(_sentencepiece_pc_VERSION)
  set(SentencePiece_VERSION "${_sentencepiece_pc_VERSION}")
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(SentencePiece
  REQUIRED_VARS SentencePiece_LIBRARY SentencePiece_INCLUDE_DIR
  VERSION_VAR SentencePiece_VERSION)

if(SentencePiece_FOUND AND NOT TARGET SentencePiece::SentencePiece)
  add_library(SentencePiece::SentencePiece UNKNOWN IMPORTED)
  set_target_properties(SentencePiece::SentencePiece PROPERTIES
    IMPORTED_LOCATION "${SentencePiece_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${SentencePiece_INCLUDE_DIR}")
endif()
mark_as_advanced(SentencePiece_INCLUDE_DIR SentencePiece_LIBRARY)
unset(_sentencepiece_hints)

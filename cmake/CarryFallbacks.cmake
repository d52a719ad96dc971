# Fallbacks for machines that lack some development packages (the lent GPU machines, whose image
# has CUDA, cuBLASLt, OpenBLAS, yaml-cpp, SentencePiece and PCRE2 but not always fmt,
# nlohmann-json, GoogleTest, zlib headers or Gloo). scripts/device_prep.sh copies those from a
# machine that has them into third_party_carry/ (git-ignored). For each package that is NOT found
# here, this file makes the later find_package() calls succeed with the carried copy, by writing
# a small <Pkg>Config.cmake and pointing <Pkg>_DIR at it. Where every package is installed (CI,
# developer machines), or third_party_carry/ does not exist, it changes nothing.
set(MT_CARRY_DIR "${CMAKE_SOURCE_DIR}/third_party_carry" CACHE PATH
    "Carried third-party copies (scripts/device_prep.sh) used when a package is not installed")
if(NOT EXISTS "${MT_CARRY_DIR}")
  return()
endif()
set(_mt_stub_root "${CMAKE_BINARY_DIR}/carry_configs")

# Writes a config file for `pkg` and points find_package(pkg) at it.
function(_mt_carry_stub pkg body)
  file(WRITE "${_mt_stub_root}/${pkg}/${pkg}Config.cmake" "${body}")
  set(${pkg}_DIR "${_mt_stub_root}/${pkg}" CACHE PATH "carried fallback (cmake/CarryFallbacks.cmake)" FORCE)
  message(STATUS "${pkg}: not installed, using the copy in ${MT_CARRY_DIR}")
endfunction()

# fmt: header-only mode needs no compiled library.
find_package(fmt QUIET)
if(NOT fmt_FOUND AND EXISTS "${MT_CARRY_DIR}/fmt/include/fmt/format.h")
  _mt_carry_stub(fmt "if(NOT TARGET fmt::fmt)
  add_library(fmt::fmt INTERFACE IMPORTED)
  set_target_properties(fmt::fmt PROPERTIES INTERFACE_INCLUDE_DIRECTORIES \"${MT_CARRY_DIR}/fmt/include\"
                        INTERFACE_COMPILE_DEFINITIONS FMT_HEADER_ONLY=1)
endif()
")
endif()

# nlohmann-json: header-only.
find_package(nlohmann_json QUIET)
if(NOT nlohmann_json_FOUND AND EXISTS "${MT_CARRY_DIR}/nlohmann/include/nlohmann/json.hpp")
  _mt_carry_stub(nlohmann_json "if(NOT TARGET nlohmann_json::nlohmann_json)
  add_library(nlohmann_json::nlohmann_json INTERFACE IMPORTED)
  set_target_properties(nlohmann_json::nlohmann_json PROPERTIES
                        INTERFACE_INCLUDE_DIRECTORIES \"${MT_CARRY_DIR}/nlohmann/include\")
endif()
")
endif()

# zlib: carried headers; the library is the machine's libz.so.1 or the carried copy.
find_package(ZLIB QUIET)
if(NOT ZLIB_FOUND AND EXISTS "${MT_CARRY_DIR}/zlib/include/zlib.h")
  set(ZLIB_INCLUDE_DIR "${MT_CARRY_DIR}/zlib/include" CACHE PATH "carried zlib headers" FORCE)
  set(ZLIB_LIBRARY "${MT_CARRY_DIR}/zlib/lib/libz.so" CACHE FILEPATH "carried zlib" FORCE)
  message(STATUS "ZLIB: not installed, using the copy in ${MT_CARRY_DIR}")
endif()

# Gloo (CPU collectives): carried headers and library. Only the CPU communicator links it.
find_package(Gloo QUIET)
if(NOT Gloo_FOUND AND EXISTS "${MT_CARRY_DIR}/gloo/include/gloo/context.h")
  _mt_carry_stub(Gloo "if(NOT TARGET gloo)
  add_library(gloo SHARED IMPORTED)
  set_target_properties(gloo PROPERTIES IMPORTED_LOCATION \"${MT_CARRY_DIR}/gloo/lib/libgloo.so\"
                        INTERFACE_INCLUDE_DIRECTORIES \"${MT_CARRY_DIR}/gloo/include\")
endif()
")
endif()

# pkg-config modules (PCRE2): for each carried .pc whose module pkg-config cannot find here,
# expose that one file (and only it, so installed modules keep precedence) via PKG_CONFIG_PATH.
find_package(PkgConfig QUIET)
file(GLOB _mt_carried_pcs "${MT_CARRY_DIR}/pkgconfig/*.pc")
if(PKG_CONFIG_FOUND AND _mt_carried_pcs)
  set(_mt_pc_dir "${CMAKE_BINARY_DIR}/carry_pkgconfig")
  file(REMOVE_RECURSE "${_mt_pc_dir}")
  foreach(_pc ${_mt_carried_pcs})
    get_filename_component(_mod "${_pc}" NAME_WE)
    execute_process(COMMAND "${PKG_CONFIG_EXECUTABLE}" --exists "${_mod}" RESULT_VARIABLE _rc
                    OUTPUT_QUIET ERROR_QUIET)
    if(NOT _rc EQUAL 0)
      # The carried .pc names its prefix relative to its own folder (${pcfiledir}).
      file(READ "${_pc}" _body)
      string(REPLACE "\${pcfiledir}" "${MT_CARRY_DIR}/pkgconfig" _body "${_body}")
      file(WRITE "${_mt_pc_dir}/${_mod}.pc" "${_body}")
      message(STATUS "${_mod}: not installed, using the copy in ${MT_CARRY_DIR}")
    endif()
  endforeach()
  if(EXISTS "${_mt_pc_dir}")
    set(ENV{PKG_CONFIG_PATH} "${_mt_pc_dir}:$ENV{PKG_CONFIG_PATH}")
  endif()
endif()

# GoogleTest: built from the carried sources (tests/CMakeLists.txt's find_package(GTest) then
# finds the stub config, FindGTest's first choice, and the targets already defined here).
if(NOT MT_CARRY_GTEST)
  find_package(GTest QUIET)
endif()
if(MT_CARRY_GTEST OR (NOT GTest_FOUND AND NOT GTEST_FOUND AND EXISTS "${MT_CARRY_DIR}/googletest/CMakeLists.txt"))
  set(MT_CARRY_GTEST ON CACHE INTERNAL "GoogleTest comes from third_party_carry")
  set(BUILD_GMOCK OFF CACHE BOOL "" FORCE)
  set(INSTALL_GTEST OFF CACHE BOOL "" FORCE)
  add_subdirectory("${MT_CARRY_DIR}/googletest" "${CMAKE_BINARY_DIR}/carry_googletest" EXCLUDE_FROM_ALL)
  _mt_carry_stub(GTest "# targets GTest::gtest and GTest::gtest_main come from the carried sources\n")
endif()

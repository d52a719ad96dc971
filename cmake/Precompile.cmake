# mt_precompile(target): precompiled headers for a target's C++ sources. A clean build parses
# these headers once per target rather than once per source (nlohmann/json alone is about a
# second of parsing per source that includes it). Only standard and third-party headers, which
# change with the toolchain, not with our sources: a project header here would rebuild every
# source of the target when it changes, and would hide a missing #include.
# -DMT_PCH=OFF (or CMAKE_DISABLE_PRECOMPILE_HEADERS) builds without them.
option(MT_PCH "Precompile the common standard and third-party headers" ON)

set(MT_PCH_HEADERS
    <algorithm> <atomic> <chrono> <cmath> <cstdint> <cstring> <filesystem> <functional> <map> <memory>
    <mutex> <optional> <sstream> <string> <thread> <unordered_map> <utility> <vector>
    <fmt/format.h>)

# Extra headers for this target's set may follow the target (e.g. <gtest/gtest.h> for the tests).
function(mt_precompile target)
  if(NOT MT_PCH)
    return()
  endif()
  set(headers ${MT_PCH_HEADERS} ${ARGN})
  # nlohmann/json where the target's sources use it (data, checkpoint, training and the CLI).
  get_target_property(libs ${target} LINK_LIBRARIES)
  if(libs MATCHES "nlohmann_json|mt_training")
    list(APPEND headers <nlohmann/json.hpp>)
  endif()
  target_precompile_headers(${target} PRIVATE ${headers})  # the layers hold C++ sources only
endfunction()

# SHARDLM_HOT_CXX_FLAGS: extra flags for the code whose tests are compute-bound
# (kernels, model, scheduler, grammar masks, plan enumeration, weight
# loading, tokenizer encode). The sanitizer passes compile everything else at
# -O0, which takes about half the time of -O1 (codegen is most of a
# translation unit's time, and -O0 checks the same accesses), and pass -O1
# here for the hot code, so the tests do not get slower. Empty (the default):
# every file gets the same flags.
set(SHARDLM_HOT_CXX_FLAGS "" CACHE STRING "Extra compile flags for compute-bound code (the sanitizer passes: -O1)")
set(SHARDLM_HOT_LAYERS core backend comm kv sched sampling grammar model plan engine)
set(SHARDLM_HOT_TEST_LAYERS backend comm model cuda)

# SHARDLM_COLD_TEST_CXX_FLAGS: extra flags for the test files of the other
# layers (server, loader, plan, tokenizer, ...), whose code only drives
# processes, sockets and assertions. scripts/test.sh passes -O0: GoogleTest's
# macros at -O2 were a third of the Release pass's compile time, and nothing
# those files do is compute-bound.
set(SHARDLM_COLD_TEST_CXX_FLAGS "" CACHE STRING "Extra compile flags for the test files of the non-compute layers (scripts/test.sh: -O0)")

# Precompiled headers. nlohmann/json costs about 2 s of every translation unit
# that includes it and CLI11 about 5 s; a layer with ten such files parses them
# once instead. Off: -DSHARDLM_PCH=OFF (ccache needs sloppiness
# pch_defines,time_macros to cache precompiled headers).
option(SHARDLM_PCH "Precompile nlohmann/json and CLI11 in the targets that include them most" ON)
set(SHARDLM_PCH_LAYERS server tokenizer)

# shardlm_precompile(TARGET [HEADER...]): TARGET's C++ files get nlohmann/json
# (and HEADERs) precompiled.
function(shardlm_precompile target)
  if(SHARDLM_PCH)
    target_precompile_headers(${target} PRIVATE "$<$<COMPILE_LANGUAGE:CXX>:<nlohmann/json.hpp>>" ${ARGN})
  endif()
endfunction()

# shardlm_hot_target(TARGET): all of TARGET's C++ sources are hot.
function(shardlm_hot_target target)
  if(SHARDLM_HOT_CXX_FLAGS)
    target_compile_options(${target} PRIVATE "$<$<COMPILE_LANGUAGE:CXX>:${SHARDLM_HOT_CXX_FLAGS}>")
  endif()
endfunction()

# shardlm_hot_sources(FILES...): these files of a cold layer are hot (call it
# in the folder that defines the target; paths relative to it).
function(shardlm_hot_sources)
  if(SHARDLM_HOT_CXX_FLAGS)
    # A precompiled header built at the layer's -O level would be refused by
    # these files (GCC checks __OPTIMIZE__), so they parse the headers.
    set_source_files_properties(${ARGN} PROPERTIES COMPILE_OPTIONS "${SHARDLM_HOT_CXX_FLAGS}"
                                SKIP_PRECOMPILE_HEADERS ON)
  endif()
endfunction()

# shardlm_layer(NAME DEPS...): a static library from src/NAME/*.cpp (and
# subfolders), usable as shardlm::NAME. Headers are included as "NAME/file.h".
# The subfolders cuda/ and nccl/ are left out: they are their own libraries,
# built only with -DSHARDLM_CUDA=ON.
function(shardlm_layer name)
  file(GLOB_RECURSE srcs CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/*.cpp)
  list(FILTER srcs EXCLUDE REGEX "/src/[a-z_]+/(cuda|nccl)/")
  add_library(shardlm_${name} STATIC ${srcs})
  add_library(shardlm::${name} ALIAS shardlm_${name})
  target_include_directories(shardlm_${name} PUBLIC ${CMAKE_SOURCE_DIR}/src)
  target_link_libraries(shardlm_${name} PUBLIC ${ARGN})
  if(name IN_LIST SHARDLM_HOT_LAYERS)
    shardlm_hot_target(shardlm_${name})
  endif()
  if(name IN_LIST SHARDLM_PCH_LAYERS)
    shardlm_precompile(shardlm_${name})
  endif()
endfunction()

# shardlm_test(NAME [SERIAL] SOURCES... LIBS ...): one GoogleTest binary,
# registered with ctest, one ctest test per GoogleTest test. SERIAL: its tests
# compare wall-clock timings with a script, so the whole binary is one ctest
# test that runs with nothing beside it. It is one test, not one per
# GoogleTest test, because ctest empties the machine before each serial test
# (each of 18 drains cost the ASan pass idle time), and its COST puts it
# first, when the machine is still empty.
function(shardlm_test name)
  cmake_parse_arguments(T "SERIAL" "" "SOURCES;LIBS" ${ARGN})
  add_executable(${name} ${T_SOURCES})
  target_link_libraries(${name} PRIVATE ${T_LIBS} shardlm_test_support GTest::gtest GTest::gtest_main)
  add_dependencies(${name} shardlm)
  # Tests of the compute layers run their kernels in the test file too.
  get_filename_component(test_layer ${CMAKE_CURRENT_SOURCE_DIR} NAME)
  if(test_layer IN_LIST SHARDLM_HOT_TEST_LAYERS)
    shardlm_hot_target(${name})
  elseif(SHARDLM_COLD_TEST_CXX_FLAGS)
    target_compile_options(${name} PRIVATE "$<$<COMPILE_LANGUAGE:CXX>:${SHARDLM_COLD_TEST_CXX_FLAGS}>")
  endif()
  # Tests find the sources, the build and the CLI through the environment.
  # ctest's ENVIRONMENT property holds only one variable when passed through
  # gtest_discover_tests, so the variables are set by running each test under
  # env(1), which gtest_discover_tests honours as the target's "emulator".
  set_target_properties(${name} PROPERTIES CROSSCOMPILING_EMULATOR
    "/usr/bin/env;SHARDLM_SOURCE_DIR=${CMAKE_SOURCE_DIR};SHARDLM_BINARY_DIR=${CMAKE_BINARY_DIR};SHARDLM_CLI=$<TARGET_FILE:shardlm>")
  if(T_SERIAL)
    add_test(NAME ${name} COMMAND /usr/bin/env SHARDLM_SOURCE_DIR=${CMAKE_SOURCE_DIR}
             SHARDLM_BINARY_DIR=${CMAKE_BINARY_DIR} SHARDLM_CLI=$<TARGET_FILE:shardlm> $<TARGET_FILE:${name}>)
    set_tests_properties(${name} PROPERTIES RUN_SERIAL TRUE LABELS timing COST 10000)
  else()
    gtest_discover_tests(${name} DISCOVERY_TIMEOUT 60)
  endif()
endfunction()

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
endfunction()

# shardlm_test(NAME SOURCES... LIBS ...): one GoogleTest binary, registered with ctest.
function(shardlm_test name)
  cmake_parse_arguments(T "" "" "SOURCES;LIBS" ${ARGN})
  add_executable(${name} ${T_SOURCES})
  target_link_libraries(${name} PRIVATE ${T_LIBS} shardlm_test_support GTest::gtest GTest::gtest_main)
  add_dependencies(${name} shardlm)
  # Tests find the sources, the build and the CLI through the environment.
  # ctest's ENVIRONMENT property holds only one variable when passed through
  # gtest_discover_tests, so the variables are set by running each test under
  # env(1), which gtest_discover_tests honours as the target's "emulator".
  set_target_properties(${name} PROPERTIES CROSSCOMPILING_EMULATOR
    "/usr/bin/env;SHARDLM_SOURCE_DIR=${CMAKE_SOURCE_DIR};SHARDLM_BINARY_DIR=${CMAKE_BINARY_DIR};SHARDLM_CLI=$<TARGET_FILE:shardlm>")
  gtest_discover_tests(${name} DISCOVERY_TIMEOUT 60)
endfunction()

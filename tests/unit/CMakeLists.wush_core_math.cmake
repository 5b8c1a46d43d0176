# Unit tests of the C++ numeric core's calibration, transforms, theory and evaluation modules.
# Included from tests/CMakeLists.txt (include(unit/CMakeLists.wush_core_math.cmake)); paths are
# relative to this file so the include works from any including directory.
find_package(GTest REQUIRED)
include(GoogleTest)

add_executable(wush_core_math_tests
  ${CMAKE_CURRENT_LIST_DIR}/test_calibration.cpp
  ${CMAKE_CURRENT_LIST_DIR}/test_transforms.cpp
  ${CMAKE_CURRENT_LIST_DIR}/test_theory.cpp
  ${CMAKE_CURRENT_LIST_DIR}/test_eval.cpp
  ${CMAKE_CURRENT_LIST_DIR}/test_quantized_product.cpp
  ${CMAKE_CURRENT_LIST_DIR}/test_gptq.cpp
  ${CMAKE_CURRENT_LIST_DIR}/test_transform_search.cpp
  ${CMAKE_CURRENT_LIST_DIR}/test_calibration_sample.cpp
  ${CMAKE_CURRENT_LIST_DIR}/test_guard_hold_out.cpp
)
target_link_libraries(wush_core_math_tests PRIVATE wush_core GTest::gtest_main)
# Discovery at test time, not build time: under sanitizers a build-time run can time out.
gtest_discover_tests(wush_core_math_tests DISCOVERY_MODE PRE_TEST PROPERTIES TIMEOUT 300)

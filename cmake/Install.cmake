# cmake --install: headers, libwush.so, pkg-config file, CMake package, and the wush program.
include(CMakePackageConfigHelpers)

# What a static link of libwush would need (Libs.private); the shared library carries these itself.
# Library names only, no directories: the flags must hold on the machine that uses the .pc file,
# not only on the one that built it (static linkers find the CUDA and BLAS directories through
# LIBRARY_PATH or their own configuration).
set(WUSH_PC_LIBS_PRIVATE "")
foreach(lib IN LISTS WUSH_BLAS_LIBRARIES)
  get_filename_component(name "${lib}" NAME_WE)
  string(REGEX REPLACE "^lib" "" name "${name}")
  string(APPEND WUSH_PC_LIBS_PRIVATE " -l${name}")
endforeach()
string(APPEND WUSH_PC_LIBS_PRIVATE " -lgomp -lstdc++ -lm -lpthread")
string(APPEND WUSH_PC_LIBS_PRIVATE " -ldl")
string(STRIP "${WUSH_PC_LIBS_PRIVATE}" WUSH_PC_LIBS_PRIVATE)

# With an rpath in Libs, `cc app.c $(pkg-config --cflags --libs wush)` gives a program that finds
# libwush.so at run time wherever the prefix is (/opt/..., a home directory), without
# LD_LIBRARY_PATH. Distribution packages installing into /usr turn it off (the loader's default
# path covers them); for /usr/local, run `ldconfig` after installing, or keep the rpath.
option(WUSH_PC_RPATH "Put -Wl,-rpath,<libdir> into the Libs of wush.pc" ON)
if(WUSH_PC_RPATH)
  set(WUSH_PC_RPATH_FLAG " -Wl,-rpath,\${libdir}")
else()
  set(WUSH_PC_RPATH_FLAG "")
endif()
# The .pc file locates the prefix relative to itself, so an install with `cmake --install --prefix`
# (or a moved tree) stays correct.
file(RELATIVE_PATH WUSH_PC_PREFIX_FROM_PCDIR "/prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/prefix")
configure_file(${PROJECT_SOURCE_DIR}/pkgconfig/wush.pc.in ${PROJECT_BINARY_DIR}/wush.pc @ONLY)

install(TARGETS wush EXPORT wushTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/wush DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.h")
install(FILES ${PROJECT_BINARY_DIR}/wush.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
install(TARGETS wush_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
# The CUDA backend module goes beside libwush.so, where the core looks for it; a consumer never
# links it (it is not in wush.pc): libwush opens it when a CUDA context is created.
if(WUSH_HAVE_CUDA)
  install(TARGETS wush_cuda_module LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
  # Its digest, of the installed bytes (the install rewrote its RPATH).
  install(CODE "
    set(_lib \"${CMAKE_INSTALL_LIBDIR}\")
    if(NOT IS_ABSOLUTE \"\${_lib}\")
      set(_lib \"\${CMAKE_INSTALL_PREFIX}/\${_lib}\")
    endif()
    execute_process(COMMAND \"${CMAKE_COMMAND}\" \"-DFILE=\$ENV{DESTDIR}\${_lib}/$<TARGET_FILE_NAME:wush_cuda_module>\"
                            -P \"${PROJECT_SOURCE_DIR}/cmake/WriteDigest.cmake\" COMMAND_ERROR_IS_FATAL ANY)")
  install(TARGETS wush_bench_cuda RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()

set(WUSH_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/wush)
install(EXPORT wushTargets NAMESPACE wush:: DESTINATION ${WUSH_CMAKE_DIR})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/wushConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/wushConfig.cmake INSTALL_DESTINATION ${WUSH_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/wushConfigVersion.cmake
                                 COMPATIBILITY SameMajorVersion)
install(FILES ${PROJECT_BINARY_DIR}/wushConfig.cmake ${PROJECT_BINARY_DIR}/wushConfigVersion.cmake
        DESTINATION ${WUSH_CMAKE_DIR})

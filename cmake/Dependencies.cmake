# Debian packages (scripts/install-deps.sh installs them):
#   libopenblas-openmp-dev  — the OpenMP build of OpenBLAS, because libwush itself parallelizes
#                             with OpenMP; a pthreads OpenBLAS called from OpenMP threads would
#                             oversubscribe the cores (see docs/BUILD.md).
#   liblapacke-dev          — LAPACKE (Cholesky, SVD); its LAPACK resolves to OpenBLAS.
find_package(OpenMP REQUIRED COMPONENTS C CXX)

set(WUSH_OPENBLAS_DIR "/usr/lib/${CMAKE_LIBRARY_ARCHITECTURE}/openblas-openmp" CACHE PATH
    "Directory holding the OpenMP variant of libopenblas")
find_library(WUSH_OPENBLAS_LIB NAMES openblas
             HINTS ${WUSH_OPENBLAS_DIR} PATH_SUFFIXES lib/${CMAKE_LIBRARY_ARCHITECTURE}/openblas-openmp
             REQUIRED)
find_path(WUSH_CBLAS_INCLUDE cblas.h
          HINTS /usr/include/${CMAKE_LIBRARY_ARCHITECTURE}/openblas-openmp
          PATH_SUFFIXES include/${CMAKE_LIBRARY_ARCHITECTURE}/openblas-openmp
                        include/${CMAKE_LIBRARY_ARCHITECTURE}/openblas-pthread REQUIRED)
find_library(WUSH_LAPACKE_LIB NAMES lapacke REQUIRED)
find_path(WUSH_LAPACKE_INCLUDE lapacke.h REQUIRED)

add_library(wush_blas INTERFACE)
target_include_directories(wush_blas SYSTEM INTERFACE ${WUSH_CBLAS_INCLUDE} ${WUSH_LAPACKE_INCLUDE})
target_link_libraries(wush_blas INTERFACE ${WUSH_LAPACKE_LIB} ${WUSH_OPENBLAS_LIB})

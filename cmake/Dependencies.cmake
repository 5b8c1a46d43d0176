# BLAS, LAPACK and LAPACKE through CMake's FindBLAS / FindLAPACK, so OpenBLAS, MKL, BLIS+libFLAME
# or another distribution's layout all build. OpenBLAS is preferred, and its OpenMP build above
# all: libwush parallelizes with OpenMP and calls BLAS from inside its parallel regions, where a
# pthreads OpenBLAS would oversubscribe the cores (docs/BUILD.md). On Debian/Ubuntu that build is
# libopenblas-openmp-dev (scripts/install-deps.sh installs it), in /usr/lib/<arch>/openblas-openmp.
find_package(OpenMP REQUIRED COMPONENTS C CXX)

set(WUSH_BLAS_VENDOR "OpenBLAS" CACHE STRING
    "BLA_VENDOR for FindBLAS/FindLAPACK (OpenBLAS, Intel10_64lp, FLAME, Generic, All, ...); if OpenBLAS is not found, any vendor is accepted")
set(WUSH_OPENBLAS_DIR "/usr/lib/${CMAKE_LIBRARY_ARCHITECTURE}/openblas-openmp" CACHE PATH
    "Directory searched first for the OpenMP build of OpenBLAS")

# Searched before the default directories, whose libopenblas may be the pthreads build.
if(IS_DIRECTORY "${WUSH_OPENBLAS_DIR}")
  list(PREPEND CMAKE_LIBRARY_PATH "${WUSH_OPENBLAS_DIR}")
endif()
set(BLA_VENDOR ${WUSH_BLAS_VENDOR})
find_package(BLAS)
find_package(LAPACK)
if(NOT (BLAS_FOUND AND LAPACK_FOUND) AND WUSH_BLAS_VENDOR STREQUAL "OpenBLAS")
  message(STATUS "OpenBLAS not found: accepting any BLAS/LAPACK vendor")
  set(BLA_VENDOR All)
  unset(BLAS_FOUND)
  unset(LAPACK_FOUND)
  find_package(BLAS REQUIRED)
  find_package(LAPACK REQUIRED)
elseif(NOT (BLAS_FOUND AND LAPACK_FOUND))
  message(FATAL_ERROR "no BLAS/LAPACK of vendor ${WUSH_BLAS_VENDOR} found")
endif()
set(WUSH_BLAS_LIBRARIES ${LAPACK_LIBRARIES} ${BLAS_LIBRARIES})
list(REMOVE_DUPLICATES WUSH_BLAS_LIBRARIES)

# LAPACKE: inside OpenBLAS or MKL builds, a separate library on Debian's layout.
include(CheckFunctionExists)
set(CMAKE_REQUIRED_LIBRARIES ${WUSH_BLAS_LIBRARIES} OpenMP::OpenMP_C)
check_function_exists(LAPACKE_dpotrf WUSH_BLAS_HAS_LAPACKE)
unset(CMAKE_REQUIRED_LIBRARIES)
if(NOT WUSH_BLAS_HAS_LAPACKE)
  find_library(WUSH_LAPACKE_LIB NAMES lapacke REQUIRED)
  list(PREPEND WUSH_BLAS_LIBRARIES ${WUSH_LAPACKE_LIB})
endif()

# Headers: the ones of the library found, where its layout keeps them apart.
set(_wush_blas_hints)
foreach(lib IN LISTS WUSH_BLAS_LIBRARIES)
  if(lib MATCHES "openblas-(openmp|pthread|serial)")
    list(APPEND _wush_blas_hints "/usr/include/${CMAKE_LIBRARY_ARCHITECTURE}/openblas-${CMAKE_MATCH_1}")
  endif()
  if(lib MATCHES "^(.*)/lib[^/]*/")
    list(APPEND _wush_blas_hints "${CMAKE_MATCH_1}/include")
  endif()
endforeach()
find_path(WUSH_CBLAS_INCLUDE cblas.h HINTS ${_wush_blas_hints} PATH_SUFFIXES openblas mkl REQUIRED)
find_path(WUSH_LAPACKE_INCLUDE lapacke.h HINTS ${_wush_blas_hints} PATH_SUFFIXES openblas mkl REQUIRED)

if(WUSH_BLAS_LIBRARIES MATCHES "openblas-pthread|openblasp")
  message(WARNING "The pthreads build of OpenBLAS was found (${WUSH_BLAS_LIBRARIES}); inside libwush's "
                  "OpenMP regions it oversubscribes the cores. Install the OpenMP build (docs/BUILD.md).")
endif()
message(STATUS "BLAS/LAPACK: ${WUSH_BLAS_LIBRARIES}")

add_library(wush_blas INTERFACE)
target_include_directories(wush_blas SYSTEM INTERFACE ${WUSH_CBLAS_INCLUDE} ${WUSH_LAPACKE_INCLUDE})
target_link_libraries(wush_blas INTERFACE ${WUSH_BLAS_LIBRARIES})

# Writes FILE's SHA-256 beside it, as FILE.sha256 in sha256sum's format. The core checks a backend
# module against it before loading (src/backend/module_file.h). Run after the module is built and
# after it is installed (installing rewrites its RPATH, which changes its bytes):
#   cmake -DFILE=<dir>/libwush-cuda.so -P cmake/WriteDigest.cmake
if(NOT EXISTS "${FILE}")
  message(FATAL_ERROR "WriteDigest: ${FILE} does not exist")
endif()
file(SHA256 "${FILE}" _digest)
get_filename_component(_name "${FILE}" NAME)
file(WRITE "${FILE}.sha256" "${_digest}  ${_name}\n")

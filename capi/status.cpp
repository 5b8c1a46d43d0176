// Version, status names and the last-error accessor.
#include "guard.h"

#define WUSH_STR2(x) #x
#define WUSH_STR(x) WUSH_STR2(x)

extern "C" {

WUSH_API unsigned wush_version(void) {
    return WUSH_VERSION_NUMBER;
}

WUSH_API const char* wush_version_string(void) {
    return WUSH_STR(WUSH_VERSION_MAJOR) "." WUSH_STR(WUSH_VERSION_MINOR) "." WUSH_STR(WUSH_VERSION_PATCH);
}

WUSH_API const char* wush_status_string(wush_status status) {
    switch (status) {
        case WUSH_OK: return "WUSH_OK";
        case WUSH_ERR_INVALID_ARGUMENT: return "WUSH_ERR_INVALID_ARGUMENT";
        case WUSH_ERR_OUT_OF_MEMORY: return "WUSH_ERR_OUT_OF_MEMORY";
        case WUSH_ERR_UNSUPPORTED: return "WUSH_ERR_UNSUPPORTED";
        case WUSH_ERR_NON_FINITE: return "WUSH_ERR_NON_FINITE";
        case WUSH_ERR_BUFFER_TOO_SMALL: return "WUSH_ERR_BUFFER_TOO_SMALL";
        case WUSH_ERR_NUMERICAL: return "WUSH_ERR_NUMERICAL";
        case WUSH_ERR_IO: return "WUSH_ERR_IO";
        case WUSH_ERR_CORRUPT_FILE: return "WUSH_ERR_CORRUPT_FILE";
        case WUSH_ERR_CUDA: return "WUSH_ERR_CUDA";
        case WUSH_ERR_CANCELLED: return "WUSH_ERR_CANCELLED";
        case WUSH_ERR_INTERNAL: return "WUSH_ERR_INTERNAL";
        case WUSH_ERR_NOT_FOUND: return "WUSH_ERR_NOT_FOUND";
        default: break;  // out-of-range values are handled after the switch
    }
    return "WUSH_ERR_UNKNOWN";
}

WUSH_API const char* wush_last_error(void) {
    return wush::capi::last_error();
}

}  // extern "C"

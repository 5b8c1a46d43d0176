// The thread-local message behind wush_last_error(). Setting it never allocates, so that an
// out-of-memory failure can still be reported.
#pragma once

namespace wush::capi {

void set_last_error(const char* function, const char* message) noexcept;
const char* last_error() noexcept;

}  // namespace wush::capi

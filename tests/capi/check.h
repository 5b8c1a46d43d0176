/* The check macros shared by the plain-C API tests: a failed check is counted and printed with
 * wush_last_error(), and the test goes on; main() returns non-zero if any check failed. Each test
 * program includes this once (the counters are per program). */
#ifndef WUSH_TESTS_CAPI_CHECK_H
#define WUSH_TESTS_CAPI_CHECK_H

#include <stdio.h>

#include "wush/wush.h"

static int g_failures = 0;
static int g_checks = 0;

#define CHECK(cond)                                                                                                \
  do {                                                                                                             \
    ++g_checks;                                                                                                    \
    if (!(cond)) {                                                                                                 \
      ++g_failures;                                                                                                \
      fprintf(stderr, "%s:%d: CHECK failed: %s (last error: %s)\n", __FILE__, __LINE__, #cond, wush_last_error()); \
    }                                                                                                              \
  } while (0)

#define CHECK_STATUS(call, expected) CHECK((call) == (expected))

#endif

/* The C tests' one assertion: counts passes and failures, prints a failure with its place and
 * a printf-style detail. Each test program reports `passed`/`failed` at its end. */
#ifndef CC_TEST_CHECK_H
#define CC_TEST_CHECK_H
#include <stdio.h>

static int passed = 0, failed = 0;

#define CHECK(cond, ...)                                                     \
  do {                                                                       \
    if (cond) {                                                              \
      passed++;                                                              \
    } else {                                                                 \
      failed++;                                                              \
      fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);        \
      fprintf(stderr, __VA_ARGS__);                                          \
      fputc('\n', stderr);                                                   \
    }                                                                        \
  } while (0)

#endif

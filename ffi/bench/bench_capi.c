/* The C ABI leg of the FFI round-trip benchmark (ffi/bench/run.sh): thread/list through
 * cc_client_request. Prints one JSON line. */
#define _POSIX_C_SOURCE 200809L
#include "cc_app_server.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int cmp(const void *a, const void *b) {
  unsigned long long x = *(const unsigned long long *)a, y = *(const unsigned long long *)b;
  return x < y ? -1 : x > y;
}

static unsigned long long now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (unsigned long long)t.tv_sec * 1000000000ull + (unsigned long long)t.tv_nsec;
}

int main(int argc, char **argv) {
  int n = argc > 2 ? atoi(argv[2]) : 20000;
  char config[512], buf[4096];
  snprintf(config, sizeof config, "{\"stateDir\":\"%s\",\"durability\":\"buffered\"}", argv[1]);
  cc_server *server = NULL;
  cc_client *client = NULL;
  if (cc_server_open(config, NULL, &server, buf, sizeof buf) != CC_OK) return fprintf(stderr, "%s\n", buf), 1;
  if (cc_client_connect(server, NULL, NULL, 0, &client) != CC_OK) return 1;
  cc_client_request(client, "thread/start", "{\"threadId\":\"bench\"}", buf, sizeof buf, NULL);
  unsigned long long *samples = malloc(sizeof *samples * (size_t)n), total = 0;
  for (int i = 0; i < n + n / 10; i++) {
    unsigned long long t = now_ns();
    if (cc_client_request(client, "thread/list", "{\"limit\":1}", buf, sizeof buf, NULL) != CC_OK) return 1;
    if (i >= n / 10) samples[i - n / 10] = now_ns() - t;
  }
  qsort(samples, (size_t)n, sizeof *samples, cmp);
  for (int i = 0; i < n; i++) total += samples[i];
  printf("{\"path\": \"C ABI cc_client_request\", \"n\": %d, \"p50_ns\": %llu, \"p90_ns\": %llu, \"mean_ns\": %llu}\n",
         n, samples[n / 2], samples[n * 9 / 10], total / (unsigned long long)n);
  free(samples);
  cc_client_free(client);
  cc_server_free(server);
  return 0;
}

/* A minimal C host: opens an in-process CC App Server, starts a thread, runs a scripted turn that
 * asks to write a file, approves it from a callback, prints every notification until the turn
 * completes, then shuts down. Build (from the repository root, after `cargo build -p
 * cc-app-server-ffi`):
 *
 *   gcc -Wall -Wextra -Werror -I ffi/include examples/c/host.c -o host \
 *       -L target/debug -lcc_app_server_ffi -Wl,-rpath,"$PWD/target/debug"
 *   ./host /tmp/cc-demo-state
 */
#include "cc_app_server.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Called on a client thread for every approval/decide request; user_data is ours. */
static int32_t approve(void *user_data, const char *params_json) {
  (void)user_data;
  printf("approval asked: %s\n", params_json);
  return CC_DECISION_ACCEPT_ONCE;
}

static int fail(const char *what, cc_result r, const cc_client *client) {
  char why[512] = "";
  if (client) cc_client_last_error(client, why, sizeof why, NULL);
  fprintf(stderr, "%s failed: %s %s\n", what, cc_result_name(r), why);
  return 1;
}

int main(int argc, char **argv) {
  const char *state_dir = argc > 1 ? argv[1] : "/tmp/cc-c-host";
  char config[1024], error[256] = "";
  snprintf(config, sizeof config,
           "{\"stateDir\":\"%s\",\"script\":{\"steps\":["
           "{\"type\":\"tool\",\"tool\":\"fs.write\",\"arguments\":{\"path\":\"notes/hello.txt\"}},"
           "{\"type\":\"message\",\"text\":\"I wrote notes/hello.txt.\",\"chunks\":3}]}}",
           state_dir);

  cc_server *server = NULL; /* owned by us: cc_server_free */
  cc_result r = cc_server_open(config, NULL, &server, error, sizeof error);
  if (r != CC_OK) {
    fprintf(stderr, "open failed: %s %s\n", cc_result_name(r), error);
    return 1;
  }
  cc_client *client = NULL; /* owned by us: cc_client_free */
  r = cc_client_connect(server, approve, NULL, 0, &client);
  if (r != CC_OK) return fail("connect", r, NULL);

  static char buf[64 * 1024];
  r = cc_client_request(client, "thread/start", "{\"title\":\"C host\"}", buf, sizeof buf, NULL);
  if (r != CC_OK) return fail("thread/start", r, client);
  /* The thread id sits in the result: {"thread":{"id":"…",…}}. */
  char thread_id[160] = "";
  const char *id = strstr(buf, "\"id\":\"");
  if (id) sscanf(id + 6, "%150[^\"]", thread_id);
  printf("thread %s\n", thread_id);

  char params[512];
  snprintf(params, sizeof params,
           "{\"threadId\":\"%s\",\"input\":[{\"type\":\"text\",\"text\":\"write the note\"}]}",
           thread_id);
  r = cc_client_request(client, "turn/start", params, buf, sizeof buf, NULL);
  if (r != CC_OK) return fail("turn/start", r, client);

  for (int waited = 0; waited < 300; waited++) {
    r = cc_client_next_notification(client, 100, buf, sizeof buf, NULL);
    if (r == CC_ERR_TIMEOUT) continue;
    if (r != CC_OK) return fail("receive", r, client);
    printf("%s\n", buf);
    if (strstr(buf, "\"method\":\"turn/completed\"")) break;
  }

  bool ok = false;
  uint64_t events = 0;
  cc_server_verify_thread(server, thread_id, &ok, &events);
  printf("rollout verified: %s (%llu events)\n", ok ? "ok" : "BROKEN", (unsigned long long)events);
  cc_client_free(client);
  cc_server_free(server);
  return ok ? 0 : 1;
}

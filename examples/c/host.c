/* A minimal C host: opens an in-process CC App Server, starts a thread, runs a scripted turn that
 * asks to write a file, approves it from a callback, prints the turn's notifications until it
 * completes and then the assistant's text, and shuts down. Build against the installed library
 * (docs/ffi.md, "Install"), from the repository root:
 *
 *   scripts/install-c.sh --prefix "$HOME/.local/cc-app-server"
 *   export PKG_CONFIG_PATH="$HOME/.local/cc-app-server/lib/pkgconfig"
 *   gcc -Wall -Wextra -Werror examples/c/host.c -o host $(pkg-config --cflags --libs cc-app-server) \
 *       -Wl,-rpath,"$(pkg-config --variable=libdir cc-app-server)"
 *   ./host /tmp/cc-demo-state
 */
#include <cc_app_server.h>

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
  /* The thread id sits in the result, {"thread":{"id":"…",…}}: read it by JSON pointer. */
  char thread_id[160] = "";
  r = cc_client_last_result_string(client, "/thread/id", thread_id, sizeof thread_id, NULL);
  if (r != CC_OK) return fail("thread id", r, client);
  printf("thread %s\n", thread_id);

  /* The turn's own events: subscribed before turn/start is sent, ending with its turn/completed. */
  cc_client_turn *turn = NULL; /* owned by us: cc_client_turn_free */
  r = cc_client_turn_start(client, thread_id, "write the note", &turn);
  if (r != CC_OK) return fail("turn/start", r, client);
  bool last = false;
  while (!last) {
    r = cc_client_turn_next(turn, 30000, buf, sizeof buf, NULL, &last);
    if (r != CC_OK) return fail("turn events", r, client);
    printf("%s\n", buf);
  }
  r = cc_client_turn_text(turn, 0, buf, sizeof buf, NULL);
  if (r != CC_OK) return fail("turn text", r, client);
  printf("assistant: %s\n", buf);
  cc_client_turn_free(turn);

  bool ok = false;
  uint64_t events = 0;
  cc_server_verify_thread(server, thread_id, &ok, &events);
  printf("rollout verified: %s (%llu events)\n", ok ? "ok" : "BROKEN", (unsigned long long)events);
  cc_client_free(client);
  cc_server_free(server);
  return ok ? 0 : 1;
}

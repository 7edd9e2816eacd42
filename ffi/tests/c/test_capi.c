/* The C ABI test: a real host program against libcc_app_server_ffi, run under valgrind by
 * scripts/test-ffi.sh. Open, raw handshake, client with an approval callback, a thread and a turn
 * with a tool approval, a receive loop to the terminal notification, buffers that are too small,
 * a host kernel through a function pointer, verification, and a clean shutdown (no leaks). */
#define _DEFAULT_SOURCE
#include "cc_app_server.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"

static char big[256 * 1024];

/* ---- approval callback: accepts once, counts calls ------------------------------------------ */
static int32_t approve(void *user_data, const char *params_json) {
  atomic_int *calls = user_data;
  atomic_fetch_add(calls, 1);
  /* The published ApprovalRequest: its id, the binding (there for the host to check before it
   * shows anything), the operation, its risk and the reason. */
  if (strstr(params_json, "\"nonce\"") == NULL || strstr(params_json, "\"fs.write\"") == NULL ||
      strstr(params_json, "\"id\":\"approval-") == NULL || strstr(params_json, "\"risk\":\"") == NULL ||
      strstr(params_json, "\"reason\":\"") == NULL) {
    return CC_DECISION_DECLINE;
  }
  return CC_DECISION_ACCEPT_ONCE;
}

/* ---- host kernel: one agent message in two deltas ------------------------------------------- */
struct kernel_state {
  atomic_int turns;
  atomic_int released;
};

static int32_t run_turn(void *user_data, cc_turn *turn, const char *input_json) {
  struct kernel_state *state = user_data;
  atomic_fetch_add(&state->turns, 1);
  if (strstr(input_json, "\"text\"") == NULL) {
    cc_turn_fail(turn, "no text input");
    return CC_ERR_FAILED;
  }
  char id[128], item[512], done[512];
  if (cc_turn_new_item_id(turn, id, sizeof id, NULL) != CC_OK) return CC_ERR_FAILED;
  snprintf(item, sizeof item, "{\"type\":\"agentMessage\",\"id\":\"%s\",\"text\":\"\"}", id);
  if (cc_turn_item_started(turn, item) != CC_OK) return CC_ERR_FAILED;
  if (cc_turn_is_cancelled(turn)) return CC_ERR_CANCELLED;
  if (cc_turn_item_delta(turn, id, "{\"type\":\"text\",\"text\":\"hello \"}") != CC_OK) return CC_ERR_FAILED;
  if (cc_turn_item_delta(turn, id, "{\"type\":\"text\",\"text\":\"from C\"}") != CC_OK) return CC_ERR_FAILED;
  snprintf(done, sizeof done, "{\"type\":\"agentMessage\",\"id\":\"%s\",\"text\":\"hello from C\"}", id);
  return cc_turn_item_completed(turn, done);
}

static void release(void *user_data) {
  struct kernel_state *state = user_data;
  atomic_fetch_add(&state->released, 1);
}

/* ---- helpers -------------------------------------------------------------------------------- */
static cc_server *open_server(const char *dir, const char *extra, const cc_kernel *kernel) {
  char config[1024], error[256] = "";
  snprintf(config, sizeof config, "{\"stateDir\":\"%s\",\"durability\":\"buffered\"%s}", dir, extra);
  cc_server *server = NULL;
  cc_result r = cc_server_open(config, kernel, &server, error, sizeof error);
  CHECK(r == CC_OK && server != NULL, "open: %s %s", cc_result_name(r), error);
  return server;
}

/* Waits for the notification `method` and leaves it in `big`. */
static int wait_for(cc_client *client, const char *method, int *deltas) {
  char needle[128];
  snprintf(needle, sizeof needle, "\"method\":\"%s\"", method);
  for (int i = 0; i < 600; i++) {
    cc_result r = cc_client_next_notification(client, 100, big, sizeof big, NULL);
    if (r == CC_ERR_TIMEOUT) continue;
    if (r != CC_OK) return 0;
    if (deltas && strstr(big, "\"method\":\"item/delta\"")) (*deltas)++;
    if (strstr(big, needle)) return 1;
  }
  return 0;
}

static void test_raw_handshake(cc_server *server) {
  cc_connection *conn = NULL;
  CHECK(cc_server_connect(server, &conn) == CC_OK, "connect");
  const char *init =
      "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\",\"params\":{\"protocolVersion\":1,"
      "\"minimumProtocolVersion\":1,\"client\":{\"name\":\"c-test\",\"version\":\"1\"},"
      "\"features\":[\"structured_approval\"]}}";
  CHECK(cc_connection_send(conn, init, NULL) == CC_OK, "send initialize");
  size_t needed = 0;
  /* Ask for the size first; the message is kept for the next call. */
  cc_result r = cc_connection_recv(conn, 20000, NULL, 0, &needed);
  CHECK(r == CC_ERR_BUFFER_TOO_SMALL && needed > 10, "size query: %s", cc_result_name(r));
  char *buf = malloc(needed);
  r = cc_connection_recv(conn, 0, buf, needed, NULL);
  CHECK(r == CC_OK, "recv kept: %s", cc_result_name(r));
  CHECK(strstr(buf, "\"result\"") && strstr(buf, "\"schemaDigest\""), "initialize result: %s", buf);
  free(buf);
  /* A second initialize on the same connection: -32009. */
  CHECK(cc_connection_send(conn, init, NULL) == CC_OK, "send again");
  r = cc_connection_recv(conn, 20000, big, sizeof big, NULL);
  CHECK(r == CC_OK && strstr(big, "-32009"), "second initialize: %s", big);
  CHECK(cc_connection_recv(conn, 10, big, sizeof big, NULL) == CC_ERR_TIMEOUT, "nothing more");
  cc_connection_close(conn);
  CHECK(cc_connection_send(conn, init, NULL) == CC_ERR_CLOSED, "send after close");
  char err[128];
  CHECK(cc_connection_last_error(conn, err, sizeof err, NULL) == CC_OK && strstr(err, "closed"), "last error: %s", err);
  cc_connection_free(conn);
}

static void test_turn_with_approval(cc_server *server) {
  atomic_int calls = 0;
  cc_client *client = NULL;
  CHECK(cc_client_connect(server, approve, &calls, 0, &client) == CC_OK, "client connect");
  const char *start =
      "{\"threadId\":\"c-thread\",\"title\":\"From C\",\"agentOptions\":{\"script\":{\"steps\":["
      "{\"type\":\"tool\",\"tool\":\"fs.write\",\"arguments\":{\"path\":\"a.txt\"}},"
      "{\"type\":\"message\",\"text\":\"written\",\"chunks\":3}]}}}";
  cc_result r = cc_client_request(client, "thread/start", start, big, sizeof big, NULL);
  CHECK(r == CC_OK && strstr(big, "\"From C\""), "thread/start: %s %s", cc_result_name(r), big);
  r = cc_client_request(client, "turn/start",
                        "{\"threadId\":\"c-thread\",\"input\":[{\"type\":\"text\",\"text\":\"go\"}]}",
                        big, sizeof big, NULL);
  CHECK(r == CC_OK && strstr(big, "\"turn\""), "turn/start: %s", big);
  int deltas = 0;
  CHECK(wait_for(client, "approval/resolved", &deltas), "approval resolved");
  CHECK(strstr(big, "\"kind\":\"acceptOnce\"") != NULL, "accepted: %s", big);
  CHECK(wait_for(client, "turn/completed", &deltas), "turn completed");
  CHECK(strstr(big, "\"status\":\"completed\"") != NULL, "completed: %s", big);
  /* The published Turn: its terminal evidence inside, the error (none) beside it. */
  CHECK(strstr(big, "\"terminalEvidence\":{") != NULL && strstr(big, "\"status\":\"succeeded\"") != NULL,
        "terminal evidence: %s", big);
  CHECK(strstr(big, "\"error\":null") != NULL, "no error beside the turn: %s", big);
  CHECK(deltas == 3, "three deltas, got %d", deltas);
  CHECK(atomic_load(&calls) == 1, "one approval call, got %d", atomic_load(&calls));

  /* A protocol error fills the buffer with the error object. */
  r = cc_client_request(client, "thread/read", "{\"threadId\":\"missing\"}", big, sizeof big, NULL);
  CHECK(r == CC_ERR_NOT_FOUND && strstr(big, "-32004"), "not found: %s %s", cc_result_name(r), big);
  CHECK(cc_client_last_error_code(client) == -32004, "last code");

  /* An answer that does not fit is kept, with the code it had. */
  char small[8];
  size_t needed = 0;
  r = cc_client_request(client, "thread/read", "{\"threadId\":\"c-thread\"}", small, sizeof small, &needed);
  CHECK(r == CC_ERR_BUFFER_TOO_SMALL && needed > sizeof small, "small buffer: %s", cc_result_name(r));
  char *whole = malloc(needed);
  CHECK(cc_client_last_result(client, whole, needed, NULL) == CC_OK, "kept result");
  CHECK(strstr(whole, "\"events\"") != NULL, "thread/read result: %.80s", whole);
  free(whole);

  bool ok = false;
  uint64_t events = 0;
  CHECK(cc_server_verify_thread(server, "c-thread", &ok, &events) == CC_OK && ok && events > 8,
        "verify: ok=%d events=%llu", ok, (unsigned long long)events);
  cc_client_free(client);
}

/* A callback that declines (without a reason): the tool does not run and its result says so. */
static int32_t decline(void *user_data, const char *params_json) {
  (void)params_json;
  atomic_fetch_add((atomic_int *)user_data, 1);
  return CC_DECISION_DECLINE;
}

static void test_declined_tool(cc_server *server) {
  atomic_int calls = 0;
  cc_client *client = NULL;
  CHECK(cc_client_connect(server, decline, &calls, 0, &client) == CC_OK, "client connect");
  const char *start =
      "{\"threadId\":\"c-declined\",\"agentOptions\":{\"script\":{\"steps\":["
      "{\"type\":\"tool\",\"tool\":\"fs.write\",\"arguments\":{\"path\":\"b.txt\"}}]}}}";
  CHECK(cc_client_request(client, "thread/start", start, big, sizeof big, NULL) == CC_OK, "thread/start");
  CHECK(cc_client_request(client, "turn/start",
                          "{\"threadId\":\"c-declined\",\"input\":[{\"type\":\"text\",\"text\":\"go\"}]}",
                          big, sizeof big, NULL) == CC_OK, "turn/start");
  CHECK(wait_for(client, "approval/resolved", NULL), "approval resolved");
  CHECK(strstr(big, "\"outcome\":\"declined\"") && strstr(big, "\"kind\":\"decline\""), "declined: %s", big);
  CHECK(wait_for(client, "tool/result", NULL), "tool result");
  CHECK(strstr(big, "\"status\":\"denied\"") && strstr(big, "the user declined"), "denied: %s", big);
  CHECK(wait_for(client, "turn/completed", NULL), "turn completed");
  CHECK(atomic_load(&calls) == 1, "one approval call, got %d", atomic_load(&calls));
  cc_client_free(client);
}

static void test_host_kernel(const char *dir) {
  struct kernel_state state = {0, 0};
  cc_kernel kernel = {run_turn, &state, release};
  cc_server *server = open_server(dir, "", &kernel);
  if (!server) return;
  cc_client *client = NULL;
  CHECK(cc_client_connect(server, NULL, NULL, 0, &client) == CC_OK, "client");
  cc_client_request(client, "thread/start", "{\"threadId\":\"k\"}", big, sizeof big, NULL);
  cc_client_request(client, "turn/start",
                    "{\"threadId\":\"k\",\"input\":[{\"type\":\"text\",\"text\":\"hi\"}]}", big,
                    sizeof big, NULL);
  int deltas = 0;
  /* The kernel reported the body; clients get the published Item envelope around it. */
  CHECK(wait_for(client, "item/completed", &deltas), "kernel item completed");
  CHECK(strstr(big, "\"kind\":\"assistant_message\"") && strstr(big, "\"content\":{") &&
        strstr(big, "\"text\":\"hello from C\""), "item envelope: %s", big);
  CHECK(wait_for(client, "turn/completed", &deltas), "kernel turn completed");
  CHECK(strstr(big, "\"status\":\"completed\"") != NULL, "completed: %s", big);
  CHECK(deltas == 2, "two deltas from C, got %d", deltas);
  cc_client_request(client, "thread/read", "{\"threadId\":\"k\"}", big, sizeof big, NULL);
  CHECK(strstr(big, "\"revision\":") != NULL && strstr(big, "\"forkedFrom\":null") != NULL,
        "the published thread, fork origin beside it: %.300s", big);
  cc_result r = cc_client_request(client, "thread/read", "{\"threadId\":\"k\"}", big, sizeof big, NULL);
  CHECK(r == CC_OK && strstr(big, "hello from C"), "the message is in the rollout");
  CHECK(atomic_load(&state.turns) == 1, "one turn");
  cc_client_free(client);
  cc_server_free(server);
  for (int i = 0; i < 200 && atomic_load(&state.released) == 0; i++) usleep(10000);
  CHECK(atomic_load(&state.released) == 1, "user_data released once, got %d", atomic_load(&state.released));
}

int main(void) {
  char tmpl[] = "/tmp/cc-capi-XXXXXX";
  char *root = mkdtemp(tmpl);
  if (!root) return 2;
  char dir1[256], dir2[256];
  snprintf(dir1, sizeof dir1, "%s/a", root);
  snprintf(dir2, sizeof dir2, "%s/b", root);

  char digest[80];
  size_t needed = 0;
  CHECK(cc_schema_digest(digest, sizeof digest, &needed) == CC_OK && strncmp(digest, "sha256:", 7) == 0 && needed == 72, "digest %s", digest);
  CHECK(cc_protocol_version() == 1, "protocol version");

  char error[256] = "";
  cc_server *bad = NULL;
  CHECK(cc_server_open("{\"stateDir\":\"/tmp\",\"policy\":\"yolo\"}", NULL, &bad, error, sizeof error) == CC_ERR_INVALID_ARGUMENT && bad == NULL && strstr(error, "policy"), "bad config: %s", error);

  cc_server *server = open_server(dir1, "", NULL);
  if (server) {
    test_raw_handshake(server);
    test_turn_with_approval(server);
    test_declined_tool(server);
    cc_server_free(server);
  }
  test_host_kernel(dir2);

  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
  if (system(cmd) != 0) failed++;
  printf("c-abi: %d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}

/* The C ABI's error classes, per-turn handles, blocking waits, the notification callback and the
 * JSON accessors, against the installed library (scripts/test-ffi.sh builds it with pkg-config
 * and runs it under valgrind). Every error class is made to really happen: a missing thread, a
 * second turn on a busy thread, bad params, a flood of requests on a one-message inbound queue,
 * a second open of a state directory, a world-writable directory and a regular file as the state
 * directory, a tampered rollout, a kernel that fails, an interrupted turn, a closed client. */
#define _DEFAULT_SOURCE
#include <cc_app_server.h>

#include <dirent.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"

static char buf[256 * 1024];

/* ---- a host kernel that can fail, block until released, or answer in two messages ---------- */
static atomic_int release_blocked;

static int32_t message(cc_turn *turn, const char *text) {
  char id[128], item[512];
  if (cc_turn_new_item_id(turn, id, sizeof id, NULL) != CC_OK) return CC_ERR_FAILED;
  snprintf(item, sizeof item, "{\"type\":\"agentMessage\",\"id\":\"%s\",\"text\":\"\"}", id);
  if (cc_turn_item_started(turn, item) != CC_OK) return CC_ERR_FAILED;
  snprintf(item, sizeof item, "{\"type\":\"agentMessage\",\"id\":\"%s\",\"text\":\"%s\"}", id, text);
  return cc_turn_item_completed(turn, item);
}

static int32_t run_turn(void *user_data, cc_turn *turn, const char *input_json) {
  (void)user_data;
  if (strstr(input_json, "please fail")) {
    cc_turn_fail(turn, "the C kernel refused");
    return CC_ERR_FAILED;
  }
  if (strstr(input_json, "please block")) {
    while (!atomic_load(&release_blocked)) {
      if (cc_turn_is_cancelled(turn)) return CC_ERR_CANCELLED;
      usleep(2000);
    }
  }
  int32_t r = message(turn, "first");
  return r == CC_OK ? message(turn, "second") : r;
}

static cc_server *open_with(const char *dir, const char *extra, cc_result *code) {
  char config[1024], error[512] = "";
  snprintf(config, sizeof config, "{\"stateDir\":\"%s\",\"durability\":\"buffered\"%s}", dir, extra);
  cc_kernel kernel = {run_turn, NULL, NULL};
  cc_server *server = NULL;
  *code = cc_server_open(config, &kernel, &server, error, sizeof error);
  return server;
}

static cc_server *open_server(const char *dir, const char *extra) {
  cc_result r;
  cc_server *server = open_with(dir, extra, &r);
  CHECK(r == CC_OK && server, "open %s: %s", dir, cc_result_name(r));
  return server;
}

/* thread/start with a chosen id; leaves the result in buf. */
static void start_thread(cc_client *client, const char *id) {
  char params[256];
  snprintf(params, sizeof params, "{\"threadId\":\"%s\"}", id);
  cc_result r = cc_client_request(client, "thread/start", params, buf, sizeof buf, NULL);
  CHECK(r == CC_OK, "thread/start %s: %s %s", id, cc_result_name(r), buf);
}

static void wait_turn_completed(cc_client *client) {
  for (int i = 0; i < 400; i++) {
    cc_result r = cc_client_next_notification(client, 50, buf, sizeof buf, NULL);
    if (r == CC_OK && strstr(buf, "\"method\":\"turn/completed\"")) return;
    if (r != CC_OK && r != CC_ERR_TIMEOUT) break;
  }
  CHECK(0, "no turn/completed");
}

/* ---- error classes -------------------------------------------------------------------------- */
static void test_request_classes(cc_server *server) {
  cc_client *client = NULL;
  CHECK(cc_client_connect(server, NULL, NULL, 0, &client) == CC_OK, "connect");

  /* not found: the buffer holds the error object, the code its class. */
  cc_result r = cc_client_request(client, "thread/read", "{\"threadId\":\"nope\"}", buf, sizeof buf, NULL);
  CHECK(r == CC_ERR_NOT_FOUND && strstr(buf, "-32004"), "not found: %s %s", cc_result_name(r), buf);
  CHECK(cc_client_last_error_code(client) == -32004, "code %lld", (long long)cc_client_last_error_code(client));
  char message[256] = "";
  CHECK(cc_json_get_string(buf, "/message", message, sizeof message, NULL) == CC_OK && message[0], "message");
  cc_client_turn *turn = NULL;
  r = cc_client_turn_start(client, "nope", "hi", &turn);
  CHECK(r == CC_ERR_NOT_FOUND && turn == NULL, "turn on a missing thread: %s", cc_result_name(r));

  /* invalid params: from the server (-32602), and params that are not JSON (nothing sent). */
  r = cc_client_request(client, "thread/read", "{\"threadId\":5}", buf, sizeof buf, NULL);
  CHECK(r == CC_ERR_INVALID_PARAMS && cc_client_last_error_code(client) == -32602, "invalid params: %s %s",
        cc_result_name(r), buf);
  r = cc_client_request(client, "thread/read", "{not json", buf, sizeof buf, NULL);
  CHECK(r == CC_ERR_INVALID_PARAMS && cc_client_last_error_code(client) == -32602, "not JSON: %s", cc_result_name(r));

  /* accessors on the last result */
  start_thread(client, "classes");
  char id[64] = "";
  size_t needed = 0;
  CHECK(cc_client_last_result_string(client, "/thread/id", id, sizeof id, &needed) == CC_OK &&
            strcmp(id, "classes") == 0 && needed == strlen("classes") + 1,
        "thread id %s", id);
  CHECK(cc_client_last_result_string(client, "/thread/nothing", id, sizeof id, NULL) == CC_ERR_NOT_FOUND, "absent");
  CHECK(cc_client_last_result_string(client, "/thread/id", id, 3, &needed) == CC_ERR_BUFFER_TOO_SMALL && needed == 8,
        "short buffer");
  int64_t revision = -1;
  CHECK(cc_client_last_result_int(client, "/thread/revision", &revision) == CC_OK && revision >= 0, "revision %lld",
        (long long)revision);
  CHECK(cc_client_last_result_int(client, "/thread/id", &revision) == CC_ERR_INVALID_ARGUMENT, "not an int");

  /* conflict: a second turn while the first is running. */
  atomic_store(&release_blocked, 0);
  CHECK(cc_client_turn_start(client, "classes", "please block", &turn) == CC_OK && turn, "first turn");
  cc_client_turn *second = NULL;
  r = cc_client_turn_start(client, "classes", "again", &second);
  CHECK(r == CC_ERR_CONFLICT && second == NULL && cc_client_last_error_code(client) == -32009, "busy thread: %s (%lld)",
        cc_result_name(r), (long long)cc_client_last_error_code(client));
  char why[512] = "";
  cc_client_last_error(client, why, sizeof why, NULL);
  CHECK(strstr(why, "-32009") != NULL, "the error object is the last error: %s", why);
  /* interrupted: turn_text says CC_ERR_CANCELLED. */
  char turn_id[128] = "", params[512];
  CHECK(cc_client_turn_id(turn, turn_id, sizeof turn_id, NULL) == CC_OK && turn_id[0], "turn id");
  snprintf(params, sizeof params, "{\"threadId\":\"classes\",\"turnId\":\"%s\"}", turn_id);
  r = cc_client_request(client, "turn/interrupt", params, buf, sizeof buf, NULL);
  CHECK(r == CC_OK, "interrupt: %s %s", cc_result_name(r), buf);
  r = cc_client_turn_text(turn, CC_WAIT_FOREVER, buf, sizeof buf, NULL);
  CHECK(r == CC_ERR_CANCELLED, "interrupted: %s", cc_result_name(r));
  cc_client_turn_free(turn);

  /* kernel failed: the reason is the turn's last error. */
  CHECK(cc_client_turn_start(client, "classes", "please fail", &turn) == CC_OK, "failing turn");
  r = cc_client_turn_text(turn, 20000, buf, sizeof buf, NULL);
  why[0] = 0;
  cc_client_turn_last_error(turn, why, sizeof why, NULL);
  CHECK(r == CC_ERR_KERNEL_FAILED && strstr(why, "the C kernel refused"), "kernel failed: %s %s", cc_result_name(r), why);
  CHECK(cc_client_turn_completion(turn, 0, buf, sizeof buf, NULL) == CC_OK, "completion");
  char status[32] = "", code[64] = "";
  CHECK(cc_json_get_string(buf, "/turn/status", status, sizeof status, NULL) == CC_OK && strcmp(status, "failed") == 0,
        "status %s", status);
  CHECK(cc_json_get_string(buf, "/error/code", code, sizeof code, NULL) == CC_OK && strncmp(why, code, strlen(code)) == 0,
        "reason %s in %s", code, why);
  cc_client_turn_free(turn);

  /* closed */
  cc_client_free(client);
}

/* overloaded: concurrent requests on a server whose inbound queue holds one message. */
struct flood {
  cc_client *client;
  atomic_int overloaded;
  atomic_llong retry_after;
};

static void *flood_thread(void *arg) {
  struct flood *f = arg;
  char local[4096];
  for (int i = 0; i < 300 && atomic_load(&f->overloaded) == 0; i++) {
    cc_result r = cc_client_request(f->client, "thread/read", "{\"threadId\":\"nope\"}", local, sizeof local, NULL);
    if (r == CC_ERR_OVERLOADED) {
      /* last_* are per client: another thread may have replaced them, so only a positive value counts. */
      int64_t ms = cc_client_last_retry_after_ms(f->client);
      if (ms > 0) atomic_store(&f->retry_after, ms);
      atomic_fetch_add(&f->overloaded, 1);
    }
  }
  return NULL;
}

static void test_overloaded(const char *dir) {
  cc_server *server = open_server(dir, ",\"inboundMessages\":1");
  if (!server) return;
  struct flood f = {NULL, 0, 0};
  CHECK(cc_client_connect(server, NULL, NULL, 0, &f.client) == CC_OK, "connect");
  pthread_t threads[6];
  for (int i = 0; i < 6; i++) pthread_create(&threads[i], NULL, flood_thread, &f);
  for (int i = 0; i < 6; i++) pthread_join(threads[i], NULL);
  CHECK(atomic_load(&f.overloaded) > 0 && atomic_load(&f.retry_after) > 0, "overloaded %d times, retry after %lld ms",
        atomic_load(&f.overloaded), (long long)atomic_load(&f.retry_after));
  cc_client_free(f.client);
  cc_server_free(server);
}

static void test_store_classes(const char *root) {
  char dir[512], path[1024];
  cc_result r;
  /* locked: a second open of the same directory in this process. */
  snprintf(dir, sizeof dir, "%s/locked", root);
  cc_server *first = open_server(dir, "");
  cc_server *second = open_with(dir, "", &r);
  CHECK(r == CC_ERR_STORE_LOCKED && second == NULL, "locked: %s", cc_result_name(r));
  cc_server_free(first);
  /* unsafe: a world-writable directory, and a regular file. */
  snprintf(dir, sizeof dir, "%s/open-dir", root);
  mkdir(dir, 0700);
  chmod(dir, 0777);
  cc_server *s = open_with(dir, "", &r);
  CHECK(r == CC_ERR_STORE_UNSAFE && s == NULL, "0777: %s", cc_result_name(r));
  snprintf(dir, sizeof dir, "%s/a-file", root);
  FILE *file = fopen(dir, "w");
  if (file) fclose(file);
  s = open_with(dir, "", &r);
  CHECK(r == CC_ERR_STORE_UNSAFE && s == NULL, "regular file: %s", cc_result_name(r));
  /* damaged: a rollout whose bytes were changed. */
  snprintf(dir, sizeof dir, "%s/damaged", root);
  s = open_server(dir, ",\"durability\":\"sync\"");
  if (!s) return;
  cc_client *client = NULL;
  CHECK(cc_client_connect(s, NULL, NULL, 0, &client) == CC_OK, "connect");
  start_thread(client, "tampered");
  cc_client_turn *turn = NULL;
  CHECK(cc_client_turn_start(client, "tampered", "hello", &turn) == CC_OK, "turn");
  CHECK(cc_client_turn_text(turn, 20000, buf, sizeof buf, NULL) == CC_OK, "text");
  cc_client_turn_free(turn);
  cc_client_free(client);
  cc_server_free(s);
  /* A changed event: verification reports it (ok false, not an error); reading the thread is
   * refused by the server (-32603, internal: CC_ERR_PROTOCOL). */
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "sed -i 's/\"first\"/\"FIRST\"/' '%s/threads/tampered.jsonl'", dir);
  CHECK(system(cmd) == 0, "tamper");
  s = open_server(dir, "");
  if (!s) return;
  bool ok = true;
  CHECK(cc_server_verify_thread(s, "tampered", &ok, NULL) == CC_OK && !ok, "a changed event is found");
  CHECK(cc_client_connect(s, NULL, NULL, 0, &client) == CC_OK, "connect");
  r = cc_client_request(client, "thread/read", "{\"threadId\":\"tampered\"}", buf, sizeof buf, NULL);
  CHECK(r == CC_ERR_PROTOCOL && cc_client_last_error_code(client) == -32603, "unreadable: %s", cc_result_name(r));
  cc_client_free(client);
  cc_server_free(s);
  /* Acknowledged events cut off (the log shorter than its anchor says): damaged. */
  snprintf(path, sizeof path, "%s/threads/tampered.jsonl", dir);
  CHECK(truncate(path, 1000) == 0, "truncate");
  s = open_server(dir, "");
  if (!s) return;
  r = cc_server_verify_thread(s, "tampered", &ok, NULL);
  char why[512] = "";
  cc_server_last_error(s, why, sizeof why, NULL);
  CHECK(r == CC_ERR_STORE_DAMAGED && strstr(why, "restore"), "cut off: %s %s", cc_result_name(r), why);
  cc_server_free(s);
  (void)path;
}

/* ---- per-turn handles ----------------------------------------------------------------------- */
static void test_turn_handles(cc_server *server) {
  cc_client *client = NULL;
  CHECK(cc_client_connect(server, NULL, NULL, 0, &client) == CC_OK, "connect");
  start_thread(client, "one");
  start_thread(client, "two");
  cc_client_turn *a = NULL, *b = NULL;
  CHECK(cc_client_turn_start(client, "one", "hello", &a) == CC_OK, "turn a");
  CHECK(cc_client_turn_start(client, "two", "hello", &b) == CC_OK, "turn b");
  char id_a[128] = "", id_b[128] = "", needle[200];
  cc_client_turn_id(a, id_a, sizeof id_a, NULL);
  cc_client_turn_id(b, id_b, sizeof id_b, NULL);
  CHECK(cc_client_turn_started(b, buf, sizeof buf, NULL) == CC_OK && strstr(buf, id_b), "started: %s", buf);
  /* b's events: only b's, ending with its turn/completed, read without a deadline. */
  snprintf(needle, sizeof needle, "\"%s\"", id_b);
  int count = 0, foreign = 0;
  bool last = false;
  while (!last) {
    cc_result r = cc_client_turn_next(b, CC_WAIT_FOREVER, buf, sizeof buf, NULL, &last);
    if (r != CC_OK) {
      CHECK(0, "turn_next: %s", cc_result_name(r));
      break;
    }
    count++;
    if (!strstr(buf, needle) || strstr(buf, id_a)) foreign++;
  }
  CHECK(count >= 5 && foreign == 0, "%d events, %d not b's", count, foreign);
  CHECK(strstr(buf, "\"method\":\"turn/completed\""), "the last is turn/completed: %s", buf);
  CHECK(cc_client_turn_next(b, 0, buf, sizeof buf, NULL, &last) == CC_ERR_CLOSED && !last, "after the end");
  /* b's text after its events were read; a's text with a short buffer first. */
  CHECK(cc_client_turn_text(b, 0, buf, sizeof buf, NULL) == CC_OK && strcmp(buf, "first\nsecond") == 0, "b text: %s", buf);
  size_t needed = 0;
  char small[4];
  CHECK(cc_client_turn_text(a, 20000, small, sizeof small, &needed) == CC_ERR_BUFFER_TOO_SMALL && needed == 13, "needed %zu",
        needed);
  CHECK(cc_client_turn_text(a, 0, buf, needed, NULL) == CC_OK && strcmp(buf, "first\nsecond") == 0, "a text: %s", buf);
  cc_client_turn_free(a);
  cc_client_turn_free(b);
  /* Thread-level notifications (no turn id) went to the poll queue; nothing of a or b did. */
  int turn_events = 0;
  while (cc_client_next_notification(client, 100, buf, sizeof buf, NULL) == CC_OK) {
    if (strstr(buf, id_a) || strstr(buf, id_b)) turn_events++;
  }
  CHECK(turn_events == 0, "%d of the turns' events reached the poll queue", turn_events);
  /* A handle that outlives its client reports closed. */
  CHECK(cc_client_turn_start(client, "one", "hello", &a) == CC_OK, "turn");
  cc_client_free(client);
  cc_result r = cc_client_turn_text(a, 5000, buf, sizeof buf, NULL);
  CHECK(r == CC_ERR_CLOSED || r == CC_OK, "after the client: %s", cc_result_name(r));
  cc_client_turn_free(a);
}

/* A poll on another thread (waiting without a deadline) while the main thread reads a turn
 * handle: each notification reaches one of them, the turn's all reach the handle. */
struct poller {
  cc_client *client;
  char turn_id[128];
  atomic_int got;
  atomic_int stolen;
  cc_result end;
};

static void *poll_thread(void *arg) {
  struct poller *p = arg;
  static char local[64 * 1024];
  for (;;) {
    cc_result r = cc_client_next_notification(p->client, CC_WAIT_FOREVER, local, sizeof local, NULL);
    if (r != CC_OK) {
      p->end = r;
      return NULL;
    }
    atomic_fetch_add(&p->got, 1);
    if (p->turn_id[0] && strstr(local, p->turn_id)) atomic_fetch_add(&p->stolen, 1);
  }
}

static void test_poll_beside_a_turn(const char *dir) {
  cc_server *server = open_server(dir, "");
  if (!server) return;
  struct poller p = {0};
  p.end = CC_OK;
  CHECK(cc_client_connect(server, NULL, NULL, 0, &p.client) == CC_OK, "connect");
  start_thread(p.client, "side");
  start_thread(p.client, "main");
  pthread_t poller;
  pthread_create(&poller, NULL, poll_thread, &p);
  int events = 0, rounds = 5;
  for (int round = 0; round < rounds; round++) {
    cc_client_turn *turn = NULL;
    /* A turn nobody has a handle for: its events go to the poller. */
    char params[256];
    snprintf(params, sizeof params, "{\"threadId\":\"side\",\"input\":[{\"type\":\"text\",\"text\":\"x\"}]}");
    static char local[4096];
    CHECK(cc_client_request(p.client, "turn/start", params, local, sizeof local, NULL) == CC_OK, "side turn");
    CHECK(cc_client_turn_start(p.client, "main", "hello", &turn) == CC_OK, "turn");
    cc_client_turn_id(turn, p.turn_id, sizeof p.turn_id, NULL);
    bool last = false;
    while (!last && cc_client_turn_next(turn, 20000, buf, sizeof buf, NULL, &last) == CC_OK) events++;
    CHECK(last, "round %d ended", round);
    cc_client_turn_free(turn);
  }
  for (int i = 0; i < 400 && atomic_load(&p.got) < rounds * 5; i++) usleep(5000);
  /* A server shutdown closes the client: the blocked poll returns (never free a handle that
   * another thread is inside). */
  cc_server_free(server);
  pthread_join(poller, NULL);
  cc_client_free(p.client);
  CHECK(events >= rounds * 5 && atomic_load(&p.stolen) == 0 && atomic_load(&p.got) >= rounds * 5,
        "turn events %d, poller got %d, of which the handle's %d", events, atomic_load(&p.got), atomic_load(&p.stolen));
  CHECK(p.end == CC_ERR_CLOSED, "the blocked poll ends with the client: %s", cc_result_name(p.end));
}

/* ---- blocking wait and the notification callback ------------------------------------------- */
struct seen {
  atomic_int calls;
  atomic_int inside;
  atomic_int overlapped;
  atomic_int completed;
  atomic_int closed;
  atomic_llong last_seq;
  atomic_int out_of_order;
};

static void on_notification(void *user_data, const char *message_json) {
  struct seen *s = user_data;
  if (atomic_fetch_add(&s->inside, 1) != 0) atomic_fetch_add(&s->overlapped, 1);
  if (message_json == NULL) {
    atomic_fetch_add(&s->closed, 1);
  } else {
    atomic_fetch_add(&s->calls, 1);
    int64_t seq = 0;
    if (cc_json_get_int(message_json, "/params/eventSeq", &seq) == CC_OK) {
      if (seq <= atomic_load(&s->last_seq)) atomic_fetch_add(&s->out_of_order, 1);
      atomic_store(&s->last_seq, seq);
    }
    if (strstr(message_json, "\"method\":\"turn/completed\"")) atomic_fetch_add(&s->completed, 1);
  }
  usleep(200);
  atomic_fetch_sub(&s->inside, 1);
}

static void test_callback(cc_server *server) {
  cc_client *client = NULL;
  CHECK(cc_client_connect(server, NULL, NULL, 0, &client) == CC_OK, "connect");
  start_thread(client, "cb");
  char params[256];
  snprintf(params, sizeof params, "{\"threadId\":\"cb\",\"input\":[{\"type\":\"text\",\"text\":\"hi\"}]}");
  /* A blocking wait: the first notification of a turn, without a deadline. */
  CHECK(cc_client_request(client, "turn/start", params, buf, sizeof buf, NULL) == CC_OK, "turn/start");
  CHECK(cc_client_next_notification(client, CC_WAIT_FOREVER, buf, sizeof buf, NULL) == CC_OK, "blocking wait");
  wait_turn_completed(client);

  struct seen s = {0};
  atomic_store(&s.last_seq, 0);
  CHECK(cc_client_set_notification_callback(client, on_notification, &s) == CC_OK, "set callback");
  CHECK(cc_client_next_notification(client, 0, buf, sizeof buf, NULL) == CC_ERR_INVALID_ARGUMENT, "no polling meanwhile");
  for (int turn = 0; turn < 3; turn++) {
    CHECK(cc_client_request(client, "turn/start", params, buf, sizeof buf, NULL) == CC_OK, "turn/start");
    for (int i = 0; i < 2000 && atomic_load(&s.completed) <= turn; i++) usleep(5000);
  }
  CHECK(atomic_load(&s.completed) == 3, "3 turns seen by the callback, got %d", atomic_load(&s.completed));
  CHECK(cc_client_set_notification_callback(client, NULL, NULL) == CC_OK, "unset");
  int calls = atomic_load(&s.calls);
  CHECK(calls >= 15 && atomic_load(&s.overlapped) == 0 && atomic_load(&s.out_of_order) == 0,
        "%d calls, %d overlapped, %d out of order", calls, atomic_load(&s.overlapped), atomic_load(&s.out_of_order));
  /* After unregistration: no call, and notifications queue for polling again. */
  CHECK(cc_client_request(client, "turn/start", params, buf, sizeof buf, NULL) == CC_OK, "turn/start");
  wait_turn_completed(client);
  CHECK(atomic_load(&s.calls) == calls, "no call after unregistering");

  /* Close: the callback hears NULL once. */
  struct seen t = {0};
  CHECK(cc_client_set_notification_callback(client, on_notification, &t) == CC_OK, "set again");
  cc_server_free(server);
  for (int i = 0; i < 400 && atomic_load(&t.closed) == 0; i++) usleep(5000);
  CHECK(atomic_load(&t.closed) == 1, "closed once, got %d", atomic_load(&t.closed));
  cc_client_free(client);
  CHECK(atomic_load(&t.closed) == 1 && atomic_load(&t.inside) == 0, "nothing after free");
}

int main(void) {
  char tmpl[] = "/tmp/cc-capi-classes-XXXXXX";
  char *root = mkdtemp(tmpl);
  if (!root) return 2;
  char dir[512];
  CHECK(strcmp(cc_result_name(CC_ERR_KERNEL_FAILED), "CC_ERR_KERNEL_FAILED") == 0, "names");
  CHECK(strcmp(cc_result_name(CC_ERR_STORE_DAMAGED), "CC_ERR_STORE_DAMAGED") == 0, "names");

  snprintf(dir, sizeof dir, "%s/main", root);
  cc_server *server = open_server(dir, "");
  if (server) {
    test_request_classes(server);
    test_turn_handles(server);
    cc_client *closed = NULL;
    CHECK(cc_client_connect(server, NULL, NULL, 0, &closed) == CC_OK, "connect");
    test_callback(server); /* frees the server */
    cc_result r = cc_client_request(closed, "thread/list", NULL, buf, sizeof buf, NULL);
    CHECK(r == CC_ERR_CLOSED, "closed: %s", cc_result_name(r));
    cc_client_free(closed);
  }
  snprintf(dir, sizeof dir, "%s/side", root);
  test_poll_beside_a_turn(dir);
  snprintf(dir, sizeof dir, "%s/flood", root);
  test_overloaded(dir);
  test_store_classes(root);

  char cmd[600];
  snprintf(cmd, sizeof cmd, "chmod -R u+rwx '%s'; rm -rf '%s'", root, root);
  if (system(cmd) != 0) failed++;
  printf("c-classes: %d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}

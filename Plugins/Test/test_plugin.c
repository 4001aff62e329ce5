/* The Coffer test plugin: a minimal authenticator in plain C proving the plugin ABI is
 * language-neutral. Its control commands choose what the NEXT evaluation does:
 *   succeed | fail | crash (abort) | hang (until cancelled) | wedge (ignores cancel and deadline)
 *   enroll NAME (report one enrolled finger) | present ACTION (one of the above: as the agent's biometry plugin)
 *   | code N (return N) | status
 * and, to test that a hostile plugin can make the agent grant nothing, modes that write raw frames onto
 * the host's socket to the agent (descriptor 3) as code in the host could:
 *   garbage (a frame of an unknown type) | oversized (a header announcing 1 MiB) | long-text (a FEEDBACK
 *   longer than the protocol allows) | stray (a successful RESULT for ids other than this evaluation's,
 *   then a failure) | out-of-order (a CONTROL_REPLY for this evaluation and a successful RESULT, then a
 *   failure) | fail-then-succeed (a failed RESULT for this evaluation and a successful one, then a failure)
 *   | hello (a HELLO_REPLY with id 0 listing no plugin, then a failure)
 * The default is succeed. Each evaluation sends one feedback message before its result. */
#include <coffer/coffer_plugin.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum next_action { NEXT_SUCCEED, NEXT_FAIL, NEXT_CRASH, NEXT_HANG, NEXT_WEDGE, NEXT_CODE,
                   NEXT_GARBAGE, NEXT_OVERSIZED, NEXT_LONG_TEXT, NEXT_STRAY, NEXT_OUT_OF_ORDER, NEXT_FAIL_THEN_SUCCEED,
                   NEXT_HELLO };

/* The host's socket to the agent (coffer-plugin-host serves descriptor 3). */
enum { AGENT_SOCKET = 3 };

static void put_u32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)(v >> 24); p[1] = (unsigned char)(v >> 16); p[2] = (unsigned char)(v >> 8); p[3] = (unsigned char)v;
}

/* Writes bytes to the agent's socket as a hostile plugin would, whatever the host is sending. */
static void write_raw(const unsigned char *bytes, size_t n) {
    while (n > 0) {
        ssize_t w = write(AGENT_SOCKET, bytes, n);
        if (w <= 0) return;
        bytes += w;
        n -= (size_t)w;
    }
}

/* A RESULT frame (type 0x82) for `id` with `code` and no domain state, at `out` (14 bytes). */
static size_t result_frame(unsigned char *out, uint32_t id, int32_t code) {
    put_u32(out, 10);
    out[4] = 0x82;
    put_u32(out + 5, id);
    put_u32(out + 9, (uint32_t)code);
    out[13] = 0;
    return 14;
}

struct test_state {
    pthread_mutex_t lock;
    pthread_cond_t changed;
    enum next_action next;
    int next_code;
    int running;            /* an evaluation is blocked in hang */
    uint64_t running_id;
    int cancel_result;      /* non-zero once cancel() named the running evaluation */
    unsigned evaluations;
    int enrolled;           /* "enroll NAME": report one enrolled finger, as a biometric plugin would */
    const struct coffer_host_v1 *host;
};

static int test_init(const struct coffer_host_v1 *host, void **state) {
    struct test_state *s = calloc(1, sizeof *s);
    if (s == NULL) return COFFER_STATUS_FAILED;
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->changed, NULL);
    s->host = host;
    *state = s;
    host->log(host->host_context, COFFER_LOG_INFO, "test plugin ready");
    return COFFER_STATUS_OK;
}

static int test_enrollment_state(void *state, uint32_t *count, uint8_t domain[COFFER_DOMAIN_STATE_BYTES]) {
    struct test_state *s = state;
    pthread_mutex_lock(&s->lock);
    int enrolled = s->enrolled;
    pthread_mutex_unlock(&s->lock);
    *count = enrolled ? 1 : 0;
    memset(domain, enrolled ? 0x42 : 0, COFFER_DOMAIN_STATE_BYTES);
    return enrolled ? COFFER_STATUS_OK : COFFER_STATUS_UNSUPPORTED;
}

static int test_begin(void *state, const struct coffer_evaluation_v1 *e) {
    struct test_state *s = state;
    pthread_mutex_lock(&s->lock);
    enum next_action action = s->next;
    int code = s->next_code;
    s->next = NEXT_SUCCEED;
    s->evaluations++;
    pthread_mutex_unlock(&s->lock);
    if (e->feedback != NULL) e->feedback(e->feedback_context, "test plugin: evaluating");
    switch (action) {
    case NEXT_SUCCEED: return COFFER_LA_SUCCESS;
    case NEXT_FAIL: return COFFER_LA_AUTHENTICATION_FAILED;
    case NEXT_CODE: return code;
    case NEXT_CRASH: abort();
    case NEXT_GARBAGE: {
        unsigned char f[13];
        put_u32(f, 9);
        f[4] = 0x7E; /* no such message type */
        put_u32(f + 5, (uint32_t)e->id);
        put_u32(f + 9, 0);
        write_raw(f, sizeof f);
        return COFFER_LA_SUCCESS;
    }
    case NEXT_OVERSIZED: {
        unsigned char f[4];
        put_u32(f, 1u << 20);
        write_raw(f, sizeof f);
        return COFFER_LA_SUCCESS;
    }
    case NEXT_LONG_TEXT: {
        /* FEEDBACK (0xC1) whose text (a short string: u16 length) is 4000 bytes: over the 1024 limit. */
        static unsigned char f[4 + 5 + 2 + 4000];
        put_u32(f, 5 + 2 + 4000);
        f[4] = 0xC1;
        put_u32(f + 5, (uint32_t)e->id);
        f[9] = 4000 >> 8; f[10] = 4000 & 0xFF;
        memset(f + 11, 'A', 4000);
        write_raw(f, sizeof f);
        return COFFER_LA_SUCCESS;
    }
    case NEXT_STRAY: {
        unsigned char f[4 * 14];
        uint32_t id = (uint32_t)e->id;
        size_t n = result_frame(f, id + 1, COFFER_LA_SUCCESS);
        n += result_frame(f + n, id + 2, COFFER_LA_SUCCESS);
        n += result_frame(f + n, 0, COFFER_LA_SUCCESS);
        n += result_frame(f + n, 0xFFFFFFFFu, COFFER_LA_SUCCESS);
        write_raw(f, n);
        return COFFER_LA_AUTHENTICATION_FAILED;
    }
    case NEXT_OUT_OF_ORDER:
    case NEXT_FAIL_THEN_SUCCEED: {
        /* In one write: a first reply for this evaluation (a CONTROL_REPLY 0x84, code 0, text "ok"; or a
           failed RESULT), then a successful RESULT for it; the plugin itself then fails, a while later. */
        unsigned char f[17 + 14];
        size_t n;
        if (action == NEXT_OUT_OF_ORDER) {
            put_u32(f, 5 + 4 + 2 + 2);
            f[4] = 0x84;
            put_u32(f + 5, (uint32_t)e->id);
            put_u32(f + 9, 0);
            f[13] = 0; f[14] = 2; f[15] = 'o'; f[16] = 'k';
            n = 17;
        } else {
            n = result_frame(f, (uint32_t)e->id, COFFER_LA_AUTHENTICATION_FAILED);
        }
        n += result_frame(f + n, (uint32_t)e->id, COFFER_LA_SUCCESS);
        write_raw(f, n);
        usleep(200 * 1000);
        return COFFER_LA_AUTHENTICATION_FAILED;
    }
    case NEXT_HELLO: {
        /* HELLO_REPLY (0x81), id 0: version 1, no plugin, no refused file. */
        unsigned char f[4 + 11];
        put_u32(f, 11);
        f[4] = 0x81;
        put_u32(f + 5, 0);
        f[9] = 0; f[10] = 1;
        f[11] = 0; f[12] = 0;
        f[13] = 0; f[14] = 0;
        write_raw(f, sizeof f);
        return COFFER_LA_AUTHENTICATION_FAILED;
    }
    case NEXT_WEDGE:
        for (;;) pause();
    case NEXT_HANG: {
        pthread_mutex_lock(&s->lock);
        s->running = 1;
        s->running_id = e->id;
        s->cancel_result = 0;
        pthread_cond_broadcast(&s->changed);
        while (s->cancel_result == 0) pthread_cond_wait(&s->changed, &s->lock);
        int result = s->cancel_result;
        s->running = 0;
        pthread_mutex_unlock(&s->lock);
        return result;
    }
    }
    return COFFER_LA_AUTHENTICATION_FAILED;
}

static void test_cancel(void *state, uint64_t id, int result) {
    struct test_state *s = state;
    pthread_mutex_lock(&s->lock);
    if (s->running && s->running_id == id) {
        s->cancel_result = result;
        pthread_cond_broadcast(&s->changed);
    }
    pthread_mutex_unlock(&s->lock);
}

static int test_control(void *state, const char *command, const char *const *args, size_t argc,
                        char *reply, size_t reply_size) {
    struct test_state *s = state;
    int status = COFFER_STATUS_OK;
    pthread_mutex_lock(&s->lock);
    /* As the agent's biometry plugin (`coffer bio enroll X`, `coffer bio present ACTION`): enroll makes
       it report one finger; present names what its next evaluation does. */
    if (strcmp(command, "enroll") == 0 && argc == 1) { s->enrolled = 1; pthread_mutex_unlock(&s->lock); snprintf(reply, reply_size, "ok"); return COFFER_STATUS_OK; }
    if (strcmp(command, "present") == 0 && argc == 1) { command = args[0]; argc = 0; }
    if (strcmp(command, "succeed") == 0 && argc == 0) s->next = NEXT_SUCCEED;
    else if (strcmp(command, "fail") == 0 && argc == 0) s->next = NEXT_FAIL;
    else if (strcmp(command, "crash") == 0 && argc == 0) s->next = NEXT_CRASH;
    else if (strcmp(command, "hang") == 0 && argc == 0) s->next = NEXT_HANG;
    else if (strcmp(command, "wedge") == 0 && argc == 0) s->next = NEXT_WEDGE;
    else if (strcmp(command, "code") == 0 && argc == 1) { s->next = NEXT_CODE; s->next_code = atoi(args[0]); }
    else if (strcmp(command, "garbage") == 0 && argc == 0) s->next = NEXT_GARBAGE;
    else if (strcmp(command, "oversized") == 0 && argc == 0) s->next = NEXT_OVERSIZED;
    else if (strcmp(command, "long-text") == 0 && argc == 0) s->next = NEXT_LONG_TEXT;
    else if (strcmp(command, "stray") == 0 && argc == 0) s->next = NEXT_STRAY;
    else if (strcmp(command, "out-of-order") == 0 && argc == 0) s->next = NEXT_OUT_OF_ORDER;
    else if (strcmp(command, "fail-then-succeed") == 0 && argc == 0) s->next = NEXT_FAIL_THEN_SUCCEED;
    else if (strcmp(command, "hello") == 0 && argc == 0) s->next = NEXT_HELLO;
    else if (strcmp(command, "status") == 0 && argc == 0) {
        snprintf(reply, reply_size, "evaluations: %u\nwaiting: %s", s->evaluations, s->running ? "yes" : "no");
        pthread_mutex_unlock(&s->lock);
        return COFFER_STATUS_OK;
    } else if (strcmp(command, "succeed") == 0 || strcmp(command, "fail") == 0 || strcmp(command, "crash") == 0
               || strcmp(command, "hang") == 0 || strcmp(command, "wedge") == 0 || strcmp(command, "code") == 0) {
        status = COFFER_STATUS_BAD_ARGUMENTS;
    } else {
        status = COFFER_STATUS_UNKNOWN_COMMAND;
    }
    pthread_mutex_unlock(&s->lock);
    snprintf(reply, reply_size, "%s", status == COFFER_STATUS_OK ? "ok" : status == COFFER_STATUS_BAD_ARGUMENTS
             ? "wrong arguments" : "unknown command");
    return status;
}

static void test_destroy(void *state) {
    struct test_state *s = state;
    pthread_cond_destroy(&s->changed);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

static const struct coffer_plugin_v1 table = {
    .abi_version = COFFER_PLUGIN_ABI_VERSION,
    .struct_size = sizeof(struct coffer_plugin_v1),
    .name = "test",
    .description = "Coffer test plugin (scripted results)",
    .version = "1",
    .kind = COFFER_KIND_USER_PRESENCE,
    .capabilities = COFFER_CAP_USER_PRESENCE,
    .init = test_init,
    .enrollment_state = test_enrollment_state,
    .begin_evaluation = test_begin,
    .cancel = test_cancel,
    .control = test_control,
    .destroy = test_destroy,
};

__attribute__((visibility("default"))) const struct coffer_plugin_v1 *coffer_plugin_entry(void) { return &table; }

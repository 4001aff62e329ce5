/* The Coffer biometric emulator: a software fingerprint sensor behind the plugin ABI.
 *
 * State: the enrolled finger names and a 32-byte domain state, in `fingers` inside the plugin's
 * state directory (mode 0600, replaced atomically: temp file, fsync, rename). The domain state is
 * 32 fresh random bytes after every enroll and remove (all zero before the first enrollment), so
 * an item bound to the enrolled set (biometryCurrentSet) can tell the set changed.
 *
 * Control commands (`coffer bio …`):
 *   enroll NAME       add a finger (NAME: [A-Za-z0-9._-], 1-64 bytes; at most 10 fingers)
 *   remove NAME       remove a finger
 *   present NAME      a finger touches the sensor: wakes the waiting evaluation, which succeeds if
 *                     NAME is enrolled and fails (-1 authenticationFailed) otherwise
 *   present --unknown a finger that is not enrolled touches the sensor (-1)
 *   status            enrolled count, names, domain state, whether an evaluation waits
 * `present` with no evaluation waiting changes nothing and returns COFFER_STATUS_FAILED
 * ("no evaluation is waiting"): a touch is never remembered for a later evaluation.
 *
 * Evaluation: -7 (biometryNotEnrolled) at once when nothing is enrolled; otherwise waits for one
 * touch until the evaluation's deadline: -4 (systemCancel) when the deadline passes, the cancel
 * result (-2 or -4) when cancelled. One touch ends the evaluation (match 0, no match -1). Counting
 * failed matches and locking biometry out after five is the agent's policy, not the sensor's. */
#include <coffer/coffer_plugin.h>

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MAX_FINGERS 10
#define NAME_MAX_BYTES 64

struct bio_state {
    pthread_mutex_t lock;
    pthread_cond_t changed;
    char fingers[MAX_FINGERS][NAME_MAX_BYTES + 1];
    unsigned count;
    uint8_t domain[COFFER_DOMAIN_STATE_BYTES];
    /* the evaluation waiting for a touch */
    int waiting;
    uint64_t waiting_id;
    int touched;        /* 0 none, 1 matched, 2 not matched */
    int cancel_result;  /* non-zero once cancelled */
    char path[4096];
    const struct coffer_host_v1 *host;
};

static void say(struct bio_state *s, int level, const char *text) {
    s->host->log(s->host->host_context, level, text);
}

static int valid_name(const char *name) {
    size_t n = strlen(name);
    if (n == 0 || n > NAME_MAX_BYTES) return 0;
    for (size_t i = 0; i < n; i++) {
        char c = name[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-'))
            return 0;
    }
    return name[0] != '-' && name[0] != '.';
}

static int find(struct bio_state *s, const char *name) {
    for (unsigned i = 0; i < s->count; i++)
        if (strcmp(s->fingers[i], name) == 0) return (int)i;
    return -1;
}

static void hex(const uint8_t *b, size_t n, char *out) {
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) { out[2 * i] = digits[b[i] >> 4]; out[2 * i + 1] = digits[b[i] & 15]; }
    out[2 * n] = 0;
}

/* Writes the state file atomically: `fingers.tmp` (0600, O_EXCL after removing a stale one),
 * fsync, rename over `fingers`. Returns 0 or an errno. */
static int save(struct bio_state *s) {
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", s->path);
    unlink(tmp);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) return errno;
    char buf[MAX_FINGERS * (NAME_MAX_BYTES + 1) + 80];
    char h[2 * COFFER_DOMAIN_STATE_BYTES + 1];
    hex(s->domain, sizeof s->domain, h);
    size_t len = (size_t)snprintf(buf, sizeof buf, "coffer-bio 1\n%s\n", h);
    for (unsigned i = 0; i < s->count; i++) len += (size_t)snprintf(buf + len, sizeof buf - len, "%s\n", s->fingers[i]);
    size_t off = 0;
    while (off < len) {
        ssize_t w = write(fd, buf + off, len - off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) { int e = errno ? errno : EIO; close(fd); unlink(tmp); return e; }
        off += (size_t)w;
    }
    if (fsync(fd) != 0 || close(fd) != 0) { int e = errno; unlink(tmp); return e; }
    if (rename(tmp, s->path) != 0) { int e = errno; unlink(tmp); return e; }
    return 0;
}

static int unhex(const char *h, uint8_t *out, size_t n) {
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        if (sscanf(h + 2 * i, "%2x", &v) != 1) return -1;
        out[i] = (uint8_t)v;
    }
    return h[2 * n] == 0 || h[2 * n] == '\n' ? 0 : -1;
}

/* Loads the state file if there is one; 0, or -1 if it exists but is malformed. */
static int load(struct bio_state *s) {
    FILE *f = fopen(s->path, "re");
    if (f == NULL) return errno == ENOENT ? 0 : -1;
    char line[256];
    int ok = fgets(line, sizeof line, f) != NULL && strcmp(line, "coffer-bio 1\n") == 0
        && fgets(line, sizeof line, f) != NULL && unhex(line, s->domain, sizeof s->domain) == 0;
    while (ok && fgets(line, sizeof line, f) != NULL) {
        line[strcspn(line, "\n")] = 0;
        if (!valid_name(line) || s->count == MAX_FINGERS || find(s, line) >= 0) { ok = 0; break; }
        snprintf(s->fingers[s->count++], NAME_MAX_BYTES + 1, "%s", line);
    }
    fclose(f);
    return ok ? 0 : -1;
}

static int bio_init(const struct coffer_host_v1 *host, void **state) {
    struct bio_state *s = calloc(1, sizeof *s);
    if (s == NULL) return COFFER_STATUS_FAILED;
    s->host = host;
    pthread_mutex_init(&s->lock, NULL);
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&s->changed, &attr);
    pthread_condattr_destroy(&attr);
    if (snprintf(s->path, sizeof s->path, "%s/fingers", host->state_dir) >= (int)sizeof s->path || load(s) != 0) {
        say(s, COFFER_LOG_ERROR, "the state file is unreadable or malformed");
        free(s);
        return COFFER_STATUS_FAILED;
    }
    *state = s;
    return COFFER_STATUS_OK;
}

static int bio_enrollment_state(void *state, uint32_t *count, uint8_t domain[COFFER_DOMAIN_STATE_BYTES]) {
    struct bio_state *s = state;
    pthread_mutex_lock(&s->lock);
    *count = s->count;
    memcpy(domain, s->domain, COFFER_DOMAIN_STATE_BYTES);
    pthread_mutex_unlock(&s->lock);
    return COFFER_STATUS_OK;
}

static int bio_begin(void *state, const struct coffer_evaluation_v1 *e) {
    struct bio_state *s = state;
    struct timespec deadline;
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    deadline.tv_sec += e->timeout_ms / 1000;
    deadline.tv_nsec += (long)(e->timeout_ms % 1000) * 1000000L;
    if (deadline.tv_nsec >= 1000000000L) { deadline.tv_sec++; deadline.tv_nsec -= 1000000000L; }
    pthread_mutex_lock(&s->lock);
    if (s->count == 0) { pthread_mutex_unlock(&s->lock); return COFFER_LA_BIOMETRY_NOT_ENROLLED; }
    s->waiting = 1;
    s->waiting_id = e->id;
    s->touched = 0;
    s->cancel_result = 0;
    pthread_cond_broadcast(&s->changed);
    pthread_mutex_unlock(&s->lock);
    if (e->feedback != NULL) e->feedback(e->feedback_context, "touch the sensor");
    pthread_mutex_lock(&s->lock);
    int result = COFFER_LA_SYSTEM_CANCEL;
    for (;;) {
        if (s->touched) { result = s->touched == 1 ? COFFER_LA_SUCCESS : COFFER_LA_AUTHENTICATION_FAILED; break; }
        if (s->cancel_result) { result = s->cancel_result; break; }
        int rc = pthread_cond_timedwait(&s->changed, &s->lock, &deadline);
        if (rc == ETIMEDOUT && !s->touched && !s->cancel_result) { result = COFFER_LA_SYSTEM_CANCEL; break; }
    }
    s->waiting = 0;
    pthread_mutex_unlock(&s->lock);
    if (result == COFFER_LA_AUTHENTICATION_FAILED && e->feedback != NULL) e->feedback(e->feedback_context, "finger not recognised");
    return result;
}

static void bio_cancel(void *state, uint64_t id, int result) {
    struct bio_state *s = state;
    pthread_mutex_lock(&s->lock);
    if (s->waiting && s->waiting_id == id && !s->touched) {
        s->cancel_result = result == COFFER_LA_USER_CANCEL ? COFFER_LA_USER_CANCEL : COFFER_LA_SYSTEM_CANCEL;
        pthread_cond_broadcast(&s->changed);
    }
    pthread_mutex_unlock(&s->lock);
}

static int new_domain(struct bio_state *s) {
    size_t got = 0;
    while (got < sizeof s->domain) {
        ssize_t n = getrandom(s->domain + got, sizeof s->domain - got, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return -1;
        got += (size_t)n;
    }
    return 0;
}

static int bio_control(void *state, const char *command, const char *const *args, size_t argc, char *reply, size_t size) {
    struct bio_state *s = state;
    int status = COFFER_STATUS_OK;
    pthread_mutex_lock(&s->lock);
    if (strcmp(command, "enroll") == 0 || strcmp(command, "remove") == 0) {
        int enroll = command[0] == 'e';
        if (argc != 1 || !valid_name(args[0])) {
            status = COFFER_STATUS_BAD_ARGUMENTS;
            snprintf(reply, size, "usage: %s NAME (letters, digits, . _ -; at most 64)", command);
        } else if (enroll && find(s, args[0]) >= 0) {
            status = COFFER_STATUS_FAILED;
            snprintf(reply, size, "finger %s is already enrolled", args[0]);
        } else if (enroll && s->count == MAX_FINGERS) {
            status = COFFER_STATUS_FAILED;
            snprintf(reply, size, "at most %d fingers can be enrolled", MAX_FINGERS);
        } else if (!enroll && find(s, args[0]) < 0) {
            status = COFFER_STATUS_FAILED;
            snprintf(reply, size, "finger %s is not enrolled", args[0]);
        } else {
            char saved[MAX_FINGERS][NAME_MAX_BYTES + 1];
            uint8_t saved_domain[COFFER_DOMAIN_STATE_BYTES];
            unsigned saved_count = s->count;
            memcpy(saved, s->fingers, sizeof saved);
            memcpy(saved_domain, s->domain, sizeof saved_domain);
            if (enroll) {
                snprintf(s->fingers[s->count++], NAME_MAX_BYTES + 1, "%s", args[0]);
            } else {
                int i = find(s, args[0]);
                memmove(s->fingers[i], s->fingers[i + 1], (s->count - (unsigned)i - 1) * sizeof s->fingers[0]);
                s->count--;
            }
            int e = new_domain(s) != 0 ? EIO : save(s);
            if (e != 0) {
                memcpy(s->fingers, saved, sizeof saved);
                memcpy(s->domain, saved_domain, sizeof saved_domain);
                s->count = saved_count;
                status = COFFER_STATUS_FAILED;
                snprintf(reply, size, "could not save the state file (%s)", strerror(e));
            } else {
                snprintf(reply, size, "%s %s (%u enrolled)", enroll ? "enrolled" : "removed", args[0], s->count);
            }
        }
    } else if (strcmp(command, "present") == 0) {
        int unknown = argc == 1 && strcmp(args[0], "--unknown") == 0;
        if (argc != 1 || (!unknown && !valid_name(args[0]))) {
            status = COFFER_STATUS_BAD_ARGUMENTS;
            snprintf(reply, size, "usage: present NAME | present --unknown");
        } else if (!s->waiting || s->touched || s->cancel_result) {
            status = COFFER_STATUS_FAILED;
            snprintf(reply, size, "no evaluation is waiting for a touch");
        } else {
            int match = !unknown && find(s, args[0]) >= 0;
            s->touched = match ? 1 : 2;
            pthread_cond_broadcast(&s->changed);
            snprintf(reply, size, "%s", match ? "match" : "no match");
        }
    } else if (strcmp(command, "status") == 0 && argc == 0) {
        char h[2 * COFFER_DOMAIN_STATE_BYTES + 1];
        hex(s->domain, sizeof s->domain, h);
        size_t len = (size_t)snprintf(reply, size, "enrolled: %u\nwaiting: %s\ndomain-state: %s\nfingers:", s->count,
                                      s->waiting ? "yes" : "no", h);
        for (unsigned i = 0; i < s->count && len < size; i++)
            len += (size_t)snprintf(reply + len, size - len, " %s", s->fingers[i]);
    } else {
        status = strcmp(command, "status") == 0 ? COFFER_STATUS_BAD_ARGUMENTS : COFFER_STATUS_UNKNOWN_COMMAND;
        snprintf(reply, size, "%s", status == COFFER_STATUS_BAD_ARGUMENTS ? "usage: status"
                 : "unknown command (enroll, remove, present, status)");
    }
    pthread_mutex_unlock(&s->lock);
    return status;
}

static void bio_destroy(void *state) {
    struct bio_state *s = state;
    pthread_cond_destroy(&s->changed);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

static const struct coffer_plugin_v1 table = {
    .abi_version = COFFER_PLUGIN_ABI_VERSION,
    .struct_size = sizeof(struct coffer_plugin_v1),
    .name = "biometric-emulator",
    .description = "Software fingerprint sensor (coffer bio enroll/remove/present/status)",
    .version = "1",
    .kind = COFFER_KIND_BIOMETRY,
    .capabilities = COFFER_CAP_BIOMETRY | COFFER_CAP_USER_PRESENCE | COFFER_CAP_INTERACTIVE,
    .init = bio_init,
    .enrollment_state = bio_enrollment_state,
    .begin_evaluation = bio_begin,
    .cancel = bio_cancel,
    .control = bio_control,
    .destroy = bio_destroy,
};

__attribute__((visibility("default"))) const struct coffer_plugin_v1 *coffer_plugin_entry(void) { return &table; }

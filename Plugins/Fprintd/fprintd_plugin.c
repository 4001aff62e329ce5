/* The Coffer fprintd plugin: a real fingerprint reader behind the plugin ABI, through fprintd
 * (`net.reactivated.Fprint` on the system bus; libfprint drives the reader).
 *
 * Name `fprintd`, kind biometry. The plugin never enrolls: enrolment stays with `fprintd-enroll`
 * (or the desktop's settings), which write fprintd's own store.
 *
 * The user: COFFER_PAM_USER from the host's environment (the agent sets it to its user), else the
 * name of getuid(). The bus: sd_bus_open_system (DBUS_SYSTEM_BUS_ADDRESS if set, else
 * /run/dbus/system_bus_socket).
 *
 * enrollment_state: Manager.GetDefaultDevice, then Device.ListEnrolledFingers(user). The count is
 * the number of fingers; the domain state is SHA-256 over a label, the user, the device's name and
 * the SORTED finger names (all zero when nothing is enrolled). fprintd exposes no template identity
 * (no id, no hash, no enrolment date): removing or adding a finger changes the domain state, but
 * deleting a finger and enrolling the SAME finger name again (a different person's finger, even)
 * gives the same list and so the same domain state. That is a limit of fprintd's API, documented.
 * Any D-Bus failure is COFFER_STATUS_FAILED (no answer is not "nothing enrolled").
 *
 * begin_evaluation: ONE D-Bus connection from Claim to Release (fprintd ties a claim to the
 * connection that made it and releases it when that connection closes):
 *   GetDefaultDevice, ListEnrolledFingers, Claim(user), VerifyStart("any"), then VerifyStatus
 *   signals until a final one or the deadline:
 *     verify-match                      → 0 (success)
 *     verify-no-match                   → -1 (authenticationFailed; the agent counts it)
 *     verify-retry-scan, verify-swipe-too-short, verify-finger-not-centered,
 *     verify-remove-and-retry           → feedback ("try again" text), keep waiting
 *     verify-disconnected, verify-unknown-error, anything else final → -4 (systemCancel)
 *   then VerifyStop and Release (bounded, a second each), and the connection is closed.
 *   fprintd absent, no reader, the reader claimed by another program (AlreadyInUse), or the bus
 *   unreachable → -6 (biometryNotAvailable), at once; no finger enrolled → -7. fprintd leaving the
 *   bus mid-evaluation (NameOwnerChanged) or the bus connection dropping → -4. Every D-Bus step
 *   waits in one poll loop together with an eventfd that cancel() writes and the deadline, so a
 *   cancel or the deadline ends the evaluation at once, whatever fprintd does.
 *
 * control:
 *   status   device name and scan type, user, enrolled count and finger names, domain state,
 *            whether an evaluation is waiting for a finger, how many evaluations reached VerifyStart
 */
#include <coffer/coffer_plugin.h>

#include <errno.h>
#include <stdarg.h>
#include <poll.h>
#include <pthread.h>
#include <pwd.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <systemd/sd-bus.h>
#include <time.h>
#include <unistd.h>

#define FP_SERVICE "net.reactivated.Fprint"
#define FP_MANAGER_PATH "/net/reactivated/Fprint/Manager"
#define FP_MANAGER_IFACE "net.reactivated.Fprint.Manager"
#define FP_DEVICE_IFACE "net.reactivated.Fprint.Device"
#define FP_ERROR_NO_PRINTS "net.reactivated.Fprint.Error.NoEnrolledPrints"

/* Bounds for the calls made outside begin_evaluation (enrollment_state, control) and for the
 * VerifyStop/Release clean-up. */
#define CALL_TIMEOUT_USEC (3ULL * 1000000ULL)
#define CLEANUP_TIMEOUT_USEC (1ULL * 1000000ULL)
#define MAX_FINGERS 16
#define FINGER_NAME_MAX 64

struct fp_state {
    const struct coffer_host_v1 *host;
    char user[256];
    int wake; /* eventfd: cancel() writes it, the evaluation's poll loop reads it */
    pthread_mutex_t lock;
    int running;          /* an evaluation is between begin and its result */
    uint64_t running_id;
    int cancel_result;    /* non-zero once cancel() named the running evaluation */
    int waiting;          /* VerifyStart succeeded; waiting for a finger */
    uint64_t verifications; /* evaluations that reached VerifyStart (tests wait on this) */
};

static void say(struct fp_state *s, int level, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void say(struct fp_state *s, int level, const char *fmt, ...) {
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    s->host->log(s->host->host_context, level, line);
}

static uint64_t now_usec(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000ULL + (uint64_t)t.tv_nsec / 1000ULL;
}

/* ---- the enrolled set ---- */

struct enrolled {
    char device_path[256];
    char device_name[256];
    char scan_type[32];
    unsigned count;
    char fingers[MAX_FINGERS][FINGER_NAME_MAX + 1];
};

static int compare_names(const void *a, const void *b) { return strcmp(a, b); }

/* Reads an `as` reply into e->fingers (sorted); 0 or a negative errno. */
static int read_fingers(sd_bus_message *reply, struct enrolled *e) {
    int r = sd_bus_message_enter_container(reply, 'a', "s");
    if (r < 0) return r;
    const char *name;
    e->count = 0;
    while ((r = sd_bus_message_read(reply, "s", &name)) > 0) {
        if (e->count == MAX_FINGERS) continue;
        snprintf(e->fingers[e->count++], FINGER_NAME_MAX + 1, "%s", name);
    }
    if (r < 0) return r;
    qsort(e->fingers, e->count, sizeof e->fingers[0], compare_names);
    return sd_bus_message_exit_container(reply);
}

/* SHA-256("coffer-fprintd-domain-1" NUL user NUL device-name NUL finger NUL finger NUL …) over the
 * sorted finger names; all zero when none is enrolled. */
static void domain_state(const char *user, const struct enrolled *e, uint8_t out[COFFER_DOMAIN_STATE_BYTES]) {
    memset(out, 0, COFFER_DOMAIN_STATE_BYTES);
    if (e->count == 0) return;
    crypto_hash_sha256_state h;
    crypto_hash_sha256_init(&h);
    static const char label[] = "coffer-fprintd-domain-1";
    crypto_hash_sha256_update(&h, (const unsigned char *)label, sizeof label);
    crypto_hash_sha256_update(&h, (const unsigned char *)user, strlen(user) + 1);
    crypto_hash_sha256_update(&h, (const unsigned char *)e->device_name, strlen(e->device_name) + 1);
    for (unsigned i = 0; i < e->count; i++)
        crypto_hash_sha256_update(&h, (const unsigned char *)e->fingers[i], strlen(e->fingers[i]) + 1);
    crypto_hash_sha256_final(&h, out);
}

/* Reads a string property with Properties.Get (sd_bus_get_property_string refuses fprintd's
 * "scan-type": a hyphen is not valid in a D-Bus member name). 0 or a negative errno. */
static int string_property(sd_bus *bus, const char *path, const char *property, char *out, size_t size) {
    sd_bus_message *reply = NULL;
    sd_bus_error error = SD_BUS_ERROR_NULL;
    const char *value = NULL;
    int r = sd_bus_call_method(bus, FP_SERVICE, path, "org.freedesktop.DBus.Properties", "Get", &error, &reply, "ss",
                               FP_DEVICE_IFACE, property);
    if (r >= 0) r = sd_bus_message_read(reply, "v", "s", &value);
    if (r > 0) snprintf(out, size, "%s", value);
    sd_bus_error_free(&error);
    sd_bus_message_unref(reply);
    return r < 0 ? r : 0;
}

/* Synchronous look-up (bounded by CALL_TIMEOUT_USEC per call): the default device, its name and
 * scan type, and the user's fingers. 0, or -1 with `why` filled. */
static int look_up(struct fp_state *s, struct enrolled *e, char *why, size_t why_size) {
    memset(e, 0, sizeof *e);
    sd_bus *bus = NULL;
    sd_bus_message *reply = NULL;
    sd_bus_error error = SD_BUS_ERROR_NULL;
    int result = -1;
    int r = sd_bus_open_system(&bus);
    if (r < 0) { snprintf(why, why_size, "the system bus is unreachable (%s)", strerror(-r)); goto out; }
    sd_bus_set_method_call_timeout(bus, CALL_TIMEOUT_USEC);
    r = sd_bus_call_method(bus, FP_SERVICE, FP_MANAGER_PATH, FP_MANAGER_IFACE, "GetDefaultDevice", &error, &reply, "");
    const char *path = NULL;
    if (r < 0 || sd_bus_message_read(reply, "o", &path) < 0) {
        snprintf(why, why_size, "no fingerprint reader (%s)", error.name ? error.name : strerror(-r));
        goto out;
    }
    snprintf(e->device_path, sizeof e->device_path, "%s", path);
    reply = sd_bus_message_unref(reply);
    string_property(bus, e->device_path, "name", e->device_name, sizeof e->device_name);
    string_property(bus, e->device_path, "scan-type", e->scan_type, sizeof e->scan_type);
    r = sd_bus_call_method(bus, FP_SERVICE, e->device_path, FP_DEVICE_IFACE, "ListEnrolledFingers", &error, &reply, "s", s->user);
    if (r < 0) {
        if (sd_bus_error_has_name(&error, FP_ERROR_NO_PRINTS)) { result = 0; goto out; }
        snprintf(why, why_size, "ListEnrolledFingers failed (%s)", error.name ? error.name : strerror(-r));
        goto out;
    }
    if ((r = read_fingers(reply, e)) < 0) { snprintf(why, why_size, "a malformed finger list (%s)", strerror(-r)); goto out; }
    result = 0;
out:
    sd_bus_error_free(&error);
    sd_bus_message_unref(reply);
    sd_bus_flush_close_unref(bus);
    return result;
}

/* ---- plugin entry points ---- */

static int fp_init(const struct coffer_host_v1 *host, void **state) {
    if (sodium_init() < 0) return COFFER_STATUS_FAILED;
    struct fp_state *s = calloc(1, sizeof *s);
    if (s == NULL) return COFFER_STATUS_FAILED;
    s->host = host;
    const char *user = getenv("COFFER_PAM_USER");
    if (user != NULL && user[0] != 0 && strlen(user) < sizeof s->user) {
        snprintf(s->user, sizeof s->user, "%s", user);
    } else {
        struct passwd pw, *found = NULL;
        char buf[4096];
        if (getpwuid_r(getuid(), &pw, buf, sizeof buf, &found) != 0 || found == NULL || strlen(pw.pw_name) >= sizeof s->user) {
            s->host->log(s->host->host_context, COFFER_LOG_ERROR, "cannot tell which user's fingers to use");
            free(s);
            return COFFER_STATUS_FAILED;
        }
        snprintf(s->user, sizeof s->user, "%s", pw.pw_name);
    }
    s->wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (s->wake < 0) { free(s); return COFFER_STATUS_FAILED; }
    pthread_mutex_init(&s->lock, NULL);
    *state = s;
    return COFFER_STATUS_OK;
}

static int fp_enrollment_state(void *state, uint32_t *count, uint8_t domain[COFFER_DOMAIN_STATE_BYTES]) {
    struct fp_state *s = state;
    struct enrolled e;
    char why[256];
    if (look_up(s, &e, why, sizeof why) != 0) {
        say(s, COFFER_LOG_WARNING, "enrolment state unknown: %s", why);
        return COFFER_STATUS_FAILED;
    }
    *count = e.count;
    domain_state(s->user, &e, domain);
    return COFFER_STATUS_OK;
}

/* ---- one evaluation ---- */

enum { PUMP_DONE = 0, PUMP_CANCELLED = 1, PUMP_DEADLINE = 2, PUMP_BUS_LOST = 3 };

struct call {
    int done;
    int failed;
    char error_name[128];
};

struct evaluation {
    struct fp_state *s;
    const struct coffer_evaluation_v1 *e;
    sd_bus *bus;
    uint64_t deadline;   /* CLOCK_MONOTONIC µs */
    int result_known;    /* a final VerifyStatus, or fprintd left */
    int result;
    int swipe;           /* the reader is a swipe sensor */
    int fprintd_left;    /* NameOwnerChanged: fprintd is gone (no clean-up calls then) */
};

static int call_done(sd_bus_message *m, void *userdata, sd_bus_error *ret_error) {
    (void)ret_error;
    struct call *c = userdata;
    c->done = 1;
    const sd_bus_error *error = sd_bus_message_get_error(m);
    if (error != NULL) {
        c->failed = 1;
        snprintf(c->error_name, sizeof c->error_name, "%s", error->name ? error->name : "unknown");
    }
    return 0;
}

/* Drives the connection until *flag is set, cancel() wakes us (if honour_cancel), `until` passes or
 * the connection drops. */
static int pump(struct evaluation *v, const int *flag, uint64_t until, int honour_cancel) {
    for (;;) {
        if (*flag) return PUMP_DONE;
        if (honour_cancel) {
            pthread_mutex_lock(&v->s->lock);
            int cancelled = v->s->cancel_result != 0;
            pthread_mutex_unlock(&v->s->lock);
            if (cancelled) return PUMP_CANCELLED;
        }
        int r = sd_bus_process(v->bus, NULL);
        if (r < 0) return PUMP_BUS_LOST;
        if (*flag) return PUMP_DONE;
        if (r > 0) continue;
        uint64_t now = now_usec();
        if (now >= until) return PUMP_DEADLINE;
        uint64_t wake_at = until;
        uint64_t bus_timeout = 0;
        if (sd_bus_get_timeout(v->bus, &bus_timeout) >= 0 && bus_timeout < wake_at) wake_at = bus_timeout;
        int ms = wake_at <= now ? 0 : (int)((wake_at - now + 999) / 1000);
        int events = sd_bus_get_events(v->bus);
        int fd = sd_bus_get_fd(v->bus);
        if (events < 0 || fd < 0) return PUMP_BUS_LOST;
        struct pollfd fds[2] = { { .fd = fd, .events = (short)events }, { .fd = v->s->wake, .events = POLLIN } };
        r = poll(fds, honour_cancel ? 2 : 1, ms);
        if (r < 0 && errno != EINTR) return PUMP_BUS_LOST;
        if (honour_cancel && r > 0 && (fds[1].revents & POLLIN)) {
            uint64_t n;
            while (read(v->s->wake, &n, sizeof n) > 0) {}
        }
    }
}

/* Calls a method of fprintd (arguments: types and values as sd_bus_call_method) and waits for its
 * reply in pump(). Returns PUMP_DONE with (rc)->c.failed telling a D-Bus error, or another PUMP_ code. */
#define CALL(v, rc, until, honour_cancel, path, iface, member, ...)                                               \
    ({                                                                                                            \
        sd_bus_slot *slot_ = NULL;                                                                                \
        int pr_ = PUMP_BUS_LOST;                                                                                  \
        if (sd_bus_call_method_async((v)->bus, &slot_, FP_SERVICE, path, iface, member, call_done_with_reply,   \
                                     (rc), __VA_ARGS__) >= 0)                                                     \
            pr_ = pump((v), &(rc)->c.done, (until), (honour_cancel));                                             \
        sd_bus_slot_unref(slot_);                                                                                 \
        pr_;                                                                                                      \
    })

/* A call whose reply we keep (GetDefaultDevice, ListEnrolledFingers). */
struct reply_call {
    struct call c; /* first: call_done_with_reply treats userdata as both */
    sd_bus_message *reply;
};

static int call_done_with_reply(sd_bus_message *m, void *userdata, sd_bus_error *ret_error) {
    struct reply_call *rc = userdata;
    call_done(m, &rc->c, ret_error);
    if (!rc->c.failed) rc->reply = sd_bus_message_ref(m);
    return 0;
}

static const char *retry_text(const char *result, int swipe) {
    if (strcmp(result, "verify-retry-scan") == 0)
        return swipe ? "Swipe your finger again" : "Place your finger on the reader again";
    if (strcmp(result, "verify-swipe-too-short") == 0) return "Swipe too short, try again";
    if (strcmp(result, "verify-finger-not-centered") == 0) return "Finger not centred on the reader, try again";
    if (strcmp(result, "verify-remove-and-retry") == 0) return "Remove your finger and try again";
    return NULL;
}

static int on_verify_status(sd_bus_message *m, void *userdata, sd_bus_error *ret_error) {
    (void)ret_error;
    struct evaluation *v = userdata;
    const char *result = NULL;
    int done = 0;
    if (v->result_known || sd_bus_message_read(m, "sb", &result, &done) < 0) return 0;
    const char *retry = retry_text(result, v->swipe);
    if (strcmp(result, "verify-match") == 0) {
        v->result = COFFER_LA_SUCCESS;
        v->result_known = 1;
    } else if (strcmp(result, "verify-no-match") == 0) {
        v->result = COFFER_LA_AUTHENTICATION_FAILED;
        v->result_known = 1;
    } else if (retry != NULL && !done) {
        if (v->e->feedback != NULL) v->e->feedback(v->e->feedback_context, retry);
    } else if (strcmp(result, "verify-disconnected") == 0 || strcmp(result, "verify-unknown-error") == 0 || done) {
        say(v->s, COFFER_LOG_WARNING, "the reader failed: %s", result);
        v->result = COFFER_LA_SYSTEM_CANCEL;
        v->result_known = 1;
    }
    return 0;
}

static int on_owner_changed(sd_bus_message *m, void *userdata, sd_bus_error *ret_error) {
    (void)ret_error;
    struct evaluation *v = userdata;
    const char *name = NULL, *old_owner = NULL, *new_owner = NULL;
    if (v->result_known || sd_bus_message_read(m, "sss", &name, &old_owner, &new_owner) < 0) return 0;
    if (strcmp(name, FP_SERVICE) == 0 && (new_owner == NULL || new_owner[0] == 0)) {
        say(v->s, COFFER_LOG_WARNING, "fprintd left the bus during the evaluation");
        v->fprintd_left = 1;
        v->result = COFFER_LA_SYSTEM_CANCEL;
        v->result_known = 1;
    }
    return 0;
}

/* Maps a pump outcome that is not PUMP_DONE to the evaluation's result. */
static int interrupted(struct evaluation *v, int pr) {
    if (pr == PUMP_CANCELLED) {
        pthread_mutex_lock(&v->s->lock);
        int r = v->s->cancel_result;
        pthread_mutex_unlock(&v->s->lock);
        return r;
    }
    if (pr == PUMP_BUS_LOST) {
        say(v->s, COFFER_LOG_WARNING, "the system bus connection was lost");
        v->fprintd_left = 1;
    }
    return COFFER_LA_SYSTEM_CANCEL;
}

static int evaluate(struct evaluation *v) {
    struct fp_state *s = v->s;
    int r = sd_bus_open_system(&v->bus);
    if (r < 0) {
        say(s, COFFER_LOG_WARNING, "the system bus is unreachable (%s)", strerror(-r));
        return COFFER_LA_BIOMETRY_NOT_AVAILABLE;
    }
    /* Until fprintd has answered the first call, a lost bus means fprintd is not available. */
    uint64_t lookup_until = now_usec() + CALL_TIMEOUT_USEC;
    if (lookup_until > v->deadline) lookup_until = v->deadline;

    struct reply_call device = { 0 };
    int pr = CALL(v, &device, lookup_until, 1, FP_MANAGER_PATH, FP_MANAGER_IFACE, "GetDefaultDevice", "");
    char path[256] = "";
    const char *p = NULL;
    if (pr == PUMP_DONE && !device.c.failed && device.reply != NULL && sd_bus_message_read(device.reply, "o", &p) > 0)
        snprintf(path, sizeof path, "%s", p);
    sd_bus_message_unref(device.reply);
    if (pr == PUMP_CANCELLED) return interrupted(v, pr);
    if (path[0] == 0) {
        say(s, COFFER_LOG_WARNING, "no fingerprint reader (%s)", pr != PUMP_DONE ? "fprintd did not answer" : device.c.error_name);
        return COFFER_LA_BIOMETRY_NOT_AVAILABLE;
    }

    /* Watch fprintd leave the bus, and its VerifyStatus signals, before claiming. */
    sd_bus_slot *owner_slot = NULL, *status_slot = NULL;
    if (sd_bus_add_match(v->bus, &owner_slot,
                         "type='signal',sender='org.freedesktop.DBus',path='/org/freedesktop/DBus',"
                         "interface='org.freedesktop.DBus',member='NameOwnerChanged',arg0='" FP_SERVICE "'",
                         on_owner_changed, v) < 0
        || sd_bus_match_signal(v->bus, &status_slot, NULL, path, FP_DEVICE_IFACE, "VerifyStatus", on_verify_status, v) < 0) {
        sd_bus_slot_unref(owner_slot);
        say(s, COFFER_LOG_WARNING, "cannot watch the reader's signals");
        return COFFER_LA_BIOMETRY_NOT_AVAILABLE;
    }

    int result = COFFER_LA_SYSTEM_CANCEL;
    int claimed = 0, verifying = 0;
    struct reply_call list = { 0 };
    pr = CALL(v, &list, lookup_until, 1, path, FP_DEVICE_IFACE, "ListEnrolledFingers", "s", s->user);
    sd_bus_message_unref(list.reply);
    if (pr != PUMP_DONE) { result = pr == PUMP_CANCELLED ? interrupted(v, pr) : COFFER_LA_BIOMETRY_NOT_AVAILABLE; goto out; }
    if (list.c.failed) {
        result = strcmp(list.c.error_name, FP_ERROR_NO_PRINTS) == 0 ? COFFER_LA_BIOMETRY_NOT_ENROLLED : COFFER_LA_BIOMETRY_NOT_AVAILABLE;
        if (result != COFFER_LA_BIOMETRY_NOT_ENROLLED) say(s, COFFER_LOG_WARNING, "ListEnrolledFingers failed (%s)", list.c.error_name);
        goto out;
    }

    /* (synchronous, bounded: fprintd has just answered) */
    sd_bus_set_method_call_timeout(v->bus, CLEANUP_TIMEOUT_USEC);
    char scan_type[32] = "";
    string_property(v->bus, path, "scan-type", scan_type, sizeof scan_type);
    v->swipe = strcmp(scan_type, "swipe") == 0;

    /* Claim: fails at once (AlreadyInUse) when another program holds the reader. */
    struct reply_call claim = { 0 };
    uint64_t claim_until = now_usec() + CALL_TIMEOUT_USEC;
    if (claim_until > v->deadline) claim_until = v->deadline;
    pr = CALL(v, &claim, claim_until, 1, path, FP_DEVICE_IFACE, "Claim", "s", s->user);
    sd_bus_message_unref(claim.reply);
    if (pr != PUMP_DONE) {
        /* an unanswered Claim may still complete: release below, then close the connection */
        claimed = 1;
        result = pr == PUMP_CANCELLED ? interrupted(v, pr) : COFFER_LA_BIOMETRY_NOT_AVAILABLE;
        goto out;
    }
    if (claim.c.failed) {
        say(s, COFFER_LOG_WARNING, "the reader cannot be claimed (%s)", claim.c.error_name);
        result = COFFER_LA_BIOMETRY_NOT_AVAILABLE;
        goto out;
    }
    claimed = 1;

    struct reply_call start = { 0 };
    pr = CALL(v, &start, v->deadline, 1, path, FP_DEVICE_IFACE, "VerifyStart", "s", "any");
    sd_bus_message_unref(start.reply);
    if (pr != PUMP_DONE) { verifying = 1; result = interrupted(v, pr); goto out; }
    if (start.c.failed) {
        say(s, COFFER_LOG_WARNING, "VerifyStart failed (%s)", start.c.error_name);
        result = strcmp(start.c.error_name, FP_ERROR_NO_PRINTS) == 0 ? COFFER_LA_BIOMETRY_NOT_ENROLLED : COFFER_LA_SYSTEM_CANCEL;
        goto out;
    }
    verifying = 1;
    pthread_mutex_lock(&s->lock);
    s->waiting = 1;
    s->verifications++;
    pthread_mutex_unlock(&s->lock);
    if (v->e->feedback != NULL)
        v->e->feedback(v->e->feedback_context, v->swipe ? "Swipe your finger on the reader" : "Place your finger on the reader");

    pr = pump(v, &v->result_known, v->deadline, 1);
    result = pr == PUMP_DONE ? v->result : interrupted(v, pr);
    if (result == COFFER_LA_AUTHENTICATION_FAILED && v->e->feedback != NULL)
        v->e->feedback(v->e->feedback_context, "Finger not recognised");

out:
    pthread_mutex_lock(&s->lock);
    s->waiting = 0;
    pthread_mutex_unlock(&s->lock);
    /* VerifyStop and Release, each bounded; closing the connection releases the claim anyway. */
    if (claimed && !v->fprintd_left) {
        if (verifying) {
            struct reply_call stop = { 0 };
            CALL(v, &stop, now_usec() + CLEANUP_TIMEOUT_USEC, 0, path, FP_DEVICE_IFACE, "VerifyStop", "");
            sd_bus_message_unref(stop.reply);
        }
        struct reply_call release = { 0 };
        CALL(v, &release, now_usec() + CLEANUP_TIMEOUT_USEC, 0, path, FP_DEVICE_IFACE, "Release", "");
        sd_bus_message_unref(release.reply);
    }
    sd_bus_slot_unref(status_slot);
    sd_bus_slot_unref(owner_slot);
    return result;
}

static int fp_begin(void *state, const struct coffer_evaluation_v1 *e) {
    struct fp_state *s = state;
    pthread_mutex_lock(&s->lock);
    s->running = 1;
    s->running_id = e->id;
    s->cancel_result = 0;
    uint64_t n;
    while (read(s->wake, &n, sizeof n) > 0) {}
    pthread_mutex_unlock(&s->lock);

    struct evaluation v = { .s = s, .e = e, .deadline = now_usec() + (uint64_t)e->timeout_ms * 1000ULL };
    int result = evaluate(&v);
    sd_bus_flush_close_unref(v.bus);

    pthread_mutex_lock(&s->lock);
    s->running = 0;
    s->waiting = 0;
    pthread_mutex_unlock(&s->lock);
    return result;
}

static void fp_cancel(void *state, uint64_t id, int result) {
    struct fp_state *s = state;
    pthread_mutex_lock(&s->lock);
    if (s->running && s->running_id == id && s->cancel_result == 0) {
        s->cancel_result = result == COFFER_LA_USER_CANCEL ? COFFER_LA_USER_CANCEL : COFFER_LA_SYSTEM_CANCEL;
        uint64_t one = 1;
        ssize_t w = write(s->wake, &one, sizeof one);
        (void)w;
    }
    pthread_mutex_unlock(&s->lock);
}

static int fp_control(void *state, const char *command, const char *const *args, size_t argc, char *reply, size_t size) {
    (void)args;
    struct fp_state *s = state;
    if (strcmp(command, "status") != 0) {
        snprintf(reply, size, "unknown command (status; enrol with fprintd-enroll)");
        return COFFER_STATUS_UNKNOWN_COMMAND;
    }
    if (argc != 0) {
        snprintf(reply, size, "usage: status");
        return COFFER_STATUS_BAD_ARGUMENTS;
    }
    struct enrolled e;
    char why[256];
    if (look_up(s, &e, why, sizeof why) != 0) {
        snprintf(reply, size, "fprintd: %s\nuser: %s", why, s->user);
        return COFFER_STATUS_FAILED;
    }
    uint8_t domain[COFFER_DOMAIN_STATE_BYTES];
    domain_state(s->user, &e, domain);
    char hex[2 * COFFER_DOMAIN_STATE_BYTES + 1];
    sodium_bin2hex(hex, sizeof hex, domain, sizeof domain);
    pthread_mutex_lock(&s->lock);
    int waiting = s->waiting;
    unsigned long long verifications = (unsigned long long)s->verifications;
    pthread_mutex_unlock(&s->lock);
    size_t len = (size_t)snprintf(reply, size,
                                  "device: %s\ndevice-path: %s\nscan-type: %s\nuser: %s\nenrolled: %u\nwaiting: %s\n"
                                  "verifications: %llu\ndomain-state: %s\nfingers:",
                                  e.device_name, e.device_path, e.scan_type[0] ? e.scan_type : "unknown", s->user, e.count,
                                  waiting ? "yes" : "no", verifications, hex);
    for (unsigned i = 0; i < e.count && len < size; i++) len += (size_t)snprintf(reply + len, size - len, " %s", e.fingers[i]);
    return COFFER_STATUS_OK;
}

static void fp_destroy(void *state) {
    struct fp_state *s = state;
    close(s->wake);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

static const struct coffer_plugin_v1 table = {
    .abi_version = COFFER_PLUGIN_ABI_VERSION,
    .struct_size = sizeof(struct coffer_plugin_v1),
    .name = "fprintd",
    .description = "Fingerprint reader through fprintd (enrol with fprintd-enroll; coffer bio status)",
    .version = "1",
    .kind = COFFER_KIND_BIOMETRY,
    .capabilities = COFFER_CAP_BIOMETRY | COFFER_CAP_USER_PRESENCE | COFFER_CAP_INTERACTIVE,
    .init = fp_init,
    .enrollment_state = fp_enrollment_state,
    .begin_evaluation = fp_begin,
    .cancel = fp_cancel,
    .control = fp_control,
    .destroy = fp_destroy,
};

__attribute__((visibility("default"))) const struct coffer_plugin_v1 *coffer_plugin_entry(void) { return &table; }

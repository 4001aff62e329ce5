/*
 * pam_coffer: hands the login password to the user's Coffer agent.
 *
 *   auth     optional pam_coffer.so          remembers the password (PAM_AUTHTOK; asks for it if no
 *                                            earlier module set it) in PAM data
 *   session  optional pam_coffer.so          unlocks the agent with it (sets the passcode on first use)
 *   password optional pam_coffer.so          follows a password change (old -> new)
 *
 * Arguments: socket=PATH  agent=/usr/local/bin/cofferd  agentarg=ARG (repeatable)  runtime_root=DIR
 *            systemd_check=PATH  budget_ms=N  lock_on_close  debug
 *
 * Without systemd (PID 1 is not systemd: containers, WSL, minimal servers) nothing makes the user's
 * runtime directory: when the session opens on such a machine (no /run/systemd/system, as sd_booted
 * tests; or whenever runtime_root= is given), XDG_RUNTIME_DIR is not set and no socket= is given, the
 * session part makes RUNTIME_ROOT/UID (runtime_root=, default /run/user): a plain directory owned by
 * the user, mode 0700 (not a size-limited tmpfs as logind mounts), made under a temporary name and
 * renamed into place, through descriptors, never following a symbolic link. It refuses one that
 * exists with another owner or mode, and sets XDG_RUNTIME_DIR in the session's environment.
 *
 * It is a small client of the agent's wire protocol (Sources/CofferProtocol/CofferProtocol.docc/
 * WireProtocol.md) with no cryptography of its own, and no dependency on the Swift runtime. It never
 * decides authentication and never fails a login or a password change: every problem is logged
 * (never the password) and PAM_SUCCESS/PAM_IGNORE is returned.
 *
 * Talking to the agent happens in a child process that first drops to the target user, because
 * the agent refuses peers of another uid; and the child refuses an agent of another uid in turn
 * (SO_PEERCRED), so the password only ever reaches the user's own agent.
 *
 * The password is bound to the uid that authenticated: an application may change PAM_USER between
 * pam_authenticate and pam_open_session (`sudo -i -u bob` authenticates alice, then opens bob's
 * session), and the password of one user must never reach another user's agent. The same holds
 * between the two passes of a password change.
 *
 * Every exchange with the agent has a fixed budget (EXCHANGE_BUDGET_MS, plus AGENT_START_BUDGET_MS
 * when the agent= option may have to start the agent; budget_ms= replaces the sum, at most
 * MAX_BUDGET_MS): a hung or hostile listener delays a login by at most that much, then the login goes
 * on with the keychain locked.
 */
#define _GNU_SOURCE
#define PAM_SM_AUTH
#define PAM_SM_SESSION
#define PAM_SM_PASSWORD

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <pwd.h>
#include <signal.h>
#include <stdint.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <syslog.h>
#include <time.h>
#include <unistd.h>

#include <security/pam_ext.h>
#include <security/pam_modules.h>

#include <coffer/coffer_wire.h>

#define DATA_KEY "pam_coffer_authtok"
#define CHAUTHTOK_UID_KEY "pam_coffer_chauthtok_uid"
#define MAX_FRAME COFFER_MAX_BODY_BYTES
#define MAX_AGENT_ARGS 8
/* Where the user's runtime directory is made when no XDG_RUNTIME_DIR is set (logind's place). */
#define RUNTIME_ROOT_DEFAULT "/run/user"
/* Present when systemd is PID 1 (sd_booted's test): then logind makes the runtime directory. */
#define SYSTEMD_CHECK_DEFAULT "/run/systemd/system"
/* The whole exchange with the agent (connect, HELLO, request, reply) must fit in this. */
#define EXCHANGE_BUDGET_MS 2000
/* Added to the budget when the agent= option is given: the time a freshly started agent gets to listen. */
#define AGENT_START_BUDGET_MS 3000
/* The most budget_ms= may give (a hung listener must not hold a login for minutes). */
#define MAX_BUDGET_MS 60000
/* How long past the budget the parent waits before it kills the child. */
#define KILL_GRACE_MS 250

#define MSG_HELLO COFFER_MSG_HELLO
#define MSG_UNLOCK COFFER_MSG_UNLOCK
#define MSG_SESSION COFFER_MSG_SESSION
#define MSG_LOCK COFFER_MSG_LOCK
#define MSG_SET_PASSCODE COFFER_MSG_SET_PASSCODE
#define MSG_OK COFFER_MSG_OK
#define MSG_HELLO_REPLY COFFER_MSG_HELLO_REPLY
#define MSG_EVENT COFFER_MSG_EVENT
#define MSG_ERROR COFFER_MSG_ERROR
#define ERR_SEC_NOT_AVAILABLE COFFER_ERR_NOT_AVAILABLE

/* Child exit codes, logged by the parent. */
enum { CHILD_OK = 0, CHILD_NO_AGENT = 10, CHILD_PROTOCOL = 11, CHILD_REFUSED = 12, CHILD_PRIVS = 13, CHILD_IMPOSTOR = 14,
       CHILD_TIMEOUT = 15 };

/* connect_socket's answer for a socket served by a process of another uid. */
#define NOT_THE_USERS_AGENT (-2)

struct options {
    const char *socket;
    const char *agent;
    const char *agent_args[MAX_AGENT_ARGS];
    int n_agent_args;
    const char *runtime_root;
    int runtime_root_given;
    const char *systemd_check;
    int64_t budget_ms, start_ms; /* the whole exchange; the part of it an agent we start gets to listen */
    int lock_on_close;
    int no_env; /* no_env: leave SSH_AUTH_SOCK and COFFER_SOCKET out of the session's environment */
    int debug;
};

static void parse_options(pam_handle_t *pamh, int argc, const char **argv, struct options *o) {
    memset(o, 0, sizeof *o);
    o->runtime_root = RUNTIME_ROOT_DEFAULT;
    o->systemd_check = SYSTEMD_CHECK_DEFAULT;
    long budget = 0;
    for (int i = 0; i < argc; i++) {
        if (strncmp(argv[i], "socket=", 7) == 0) o->socket = argv[i] + 7;
        else if (strncmp(argv[i], "agent=", 6) == 0) o->agent = argv[i] + 6;
        else if (strncmp(argv[i], "agentarg=", 9) == 0 && o->n_agent_args < MAX_AGENT_ARGS)
            o->agent_args[o->n_agent_args++] = argv[i] + 9;
        else if (strncmp(argv[i], "runtime_root=", 13) == 0 && argv[i][13] == '/') {
            o->runtime_root = argv[i] + 13;
            o->runtime_root_given = 1;
        } else if (strncmp(argv[i], "systemd_check=", 14) == 0 && argv[i][14] == '/') o->systemd_check = argv[i] + 14;
        else if (strncmp(argv[i], "budget_ms=", 10) == 0) {
            char *end = NULL;
            errno = 0;
            budget = strtol(argv[i] + 10, &end, 10);
            if (errno || end == argv[i] + 10 || *end || budget < 1) {
                pam_syslog(pamh, LOG_WARNING, "invalid option: %s", argv[i]);
                budget = 0;
            } else if (budget > MAX_BUDGET_MS) budget = MAX_BUDGET_MS;
        }
        else if (strcmp(argv[i], "lock_on_close") == 0) o->lock_on_close = 1;
        else if (strcmp(argv[i], "no_env") == 0) o->no_env = 1;
        else if (strcmp(argv[i], "debug") == 0) o->debug = 1;
        else pam_syslog(pamh, LOG_WARNING, "unknown option: %s", argv[i]);
    }
    /* The whole exchange's budget; with agent=, an agent it starts may take the same share of it to
       begin listening as by default (3000 of 5000 ms), the rest is left for the exchange. */
    int64_t start_share = o->agent ? AGENT_START_BUDGET_MS : 0;
    o->budget_ms = budget ? budget : EXCHANGE_BUDGET_MS + start_share;
    o->start_ms = o->budget_ms * start_share / (EXCHANGE_BUDGET_MS + start_share);
}

/* The password remembered between authentication and session, with the uid that authenticated. */
struct stash {
    uid_t uid;
    size_t len;
    char tok[]; /* NUL-terminated */
};

static void wipe_stash(pam_handle_t *pamh, void *data, int status) {
    (void)pamh; (void)status;
    struct stash *s = data;
    if (s) { explicit_bzero(s->tok, s->len); free(s); }
}

static void free_data(pam_handle_t *pamh, void *data, int status) {
    (void)pamh; (void)status;
    free(data);
}

/* The passwd entry of the current PAM user (into pwbuf/strbuf); NULL if there is none. An unknown
   name is logged only when `log_unknown` (at authentication it may be a mistyped password). */
static struct passwd *pam_user_entry(pam_handle_t *pamh, struct passwd *pwbuf, char *strbuf, size_t n, const char **user,
                                     int log_unknown) {
    struct passwd *pw = NULL;
    *user = NULL;
    if (pam_get_user(pamh, user, NULL) != PAM_SUCCESS || !*user) return NULL;
    if (getpwnam_r(*user, pwbuf, strbuf, n, &pw) != 0 || !pw) {
        if (log_unknown) pam_syslog(pamh, LOG_NOTICE, "unknown user %s", *user);
        return NULL;
    }
    return pw;
}

static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(long ms) {
    struct timespec ts = { ms / 1000, (ms % 1000) * 1000 * 1000 };
    nanosleep(&ts, NULL);
}

/* Closes every descriptor above stderr (nothing the login process had open reaches the child's work). */
static void close_inherited_descriptors(void) {
    if (close_range(3, ~0U, 0) == 0) return;
    struct rlimit rl;
    long max = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY ? (long)rl.rlim_cur : 65536;
    if (max > 1 << 20) max = 1 << 20;
    for (long fd = 3; fd < max; fd++) close((int)fd);
}

/* ---- wire protocol (big-endian, length-prefixed frames) ---- */

struct buf { unsigned char *p; size_t len, cap; };

static int buf_put(struct buf *b, const void *src, size_t n) {
    if (b->len + n > b->cap) return -1;
    memcpy(b->p + b->len, src, n);
    b->len += n;
    return 0;
}
static int put_u8(struct buf *b, uint8_t v) { return buf_put(b, &v, 1); }
static int put_u16(struct buf *b, uint16_t v) { unsigned char x[2] = { v >> 8, v & 0xff }; return buf_put(b, x, 2); }
static int put_u32(struct buf *b, uint32_t v) {
    unsigned char x[4] = { v >> 24, (v >> 16) & 0xff, (v >> 8) & 0xff, v & 0xff };
    return buf_put(b, x, 4);
}
static int put_blob(struct buf *b, const char *s) {
    size_t n = s ? strlen(s) : 0;
    return put_u32(b, (uint32_t)n) || (n && buf_put(b, s, n));
}

/* Waits until fd is ready for `events` or the deadline passes (then -1). */
static int wait_fd(int fd, short events, int64_t deadline) {
    for (;;) {
        int64_t left = deadline - now_ms();
        if (left <= 0) return -1;
        struct pollfd p = { .fd = fd, .events = events };
        int r = poll(&p, 1, (int)left);
        if (r > 0) return 0; /* ready, or an error/hangup the next send/recv reports */
        if (r == 0 || errno != EINTR) return -1;
    }
}

static int write_all(int fd, const unsigned char *p, size_t n, int64_t deadline) {
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            if (wait_fd(fd, POLLOUT, deadline)) return -1;
            continue;
        }
        if (w <= 0) return -1;
        p += w; n -= (size_t)w;
    }
    return 0;
}

static int read_all(int fd, unsigned char *p, size_t n, int64_t deadline) {
    while (n > 0) {
        ssize_t r = recv(fd, p, n, MSG_DONTWAIT);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            if (wait_fd(fd, POLLIN, deadline)) return -1;
            continue;
        }
        if (r <= 0) return -1;
        p += r; n -= (size_t)r;
    }
    return 0;
}

/* Sends one request (type, id, payload parts) and wipes the frame buffer afterwards. */
static int send_request(int fd, int64_t deadline, uint8_t type, uint32_t id, const char *blob1, const char *blob2, int nblobs) {
    size_t cap = 9 + 4 + 2 + 2 + 2 + 16 + (blob1 ? strlen(blob1) : 0) + (blob2 ? strlen(blob2) : 0) + 8;
    struct buf b = { malloc(cap), 0, cap };
    if (!b.p) return -1;
    int rc = put_u32(&b, 0) || put_u8(&b, type) || put_u32(&b, id);
    if (!rc && type == MSG_HELLO) {
        rc = put_u16(&b, COFFER_WIRE_MIN_VERSION) || put_u16(&b, COFFER_WIRE_VERSION) || put_u16(&b, 10) || buf_put(&b, "pam_coffer", 10);
    }
    if (!rc && nblobs >= 1) rc = put_blob(&b, blob1);
    if (!rc && nblobs >= 2) rc = put_blob(&b, blob2);
    if (!rc) {
        uint32_t body = (uint32_t)(b.len - 4);
        b.p[0] = body >> 24; b.p[1] = (body >> 16) & 0xff; b.p[2] = (body >> 8) & 0xff; b.p[3] = body & 0xff;
        rc = write_all(fd, b.p, b.len, deadline);
    }
    explicit_bzero(b.p, b.cap);
    free(b.p);
    return rc ? -1 : 0;
}

/* Reads the reply to `id`, skipping events. Returns the message type, or -1; *status gets an ERROR's code. */
static int read_reply(int fd, int64_t deadline, uint32_t id, int32_t *status) {
    for (;;) {
        unsigned char hdr[4];
        if (read_all(fd, hdr, 4, deadline)) return -1;
        uint32_t len = (uint32_t)hdr[0] << 24 | (uint32_t)hdr[1] << 16 | (uint32_t)hdr[2] << 8 | hdr[3];
        if (len < COFFER_MIN_BODY_BYTES || len > MAX_FRAME) return -1;
        unsigned char *body = malloc(len);
        if (!body) return -1;
        if (read_all(fd, body, len, deadline)) { free(body); return -1; }
        int type = body[0];
        uint32_t rid = (uint32_t)body[1] << 24 | (uint32_t)body[2] << 16 | (uint32_t)body[3] << 8 | body[4];
        if (type == MSG_ERROR && len >= 9)
            *status = (int32_t)((uint32_t)body[5] << 24 | (uint32_t)body[6] << 16 | (uint32_t)body[7] << 8 | body[8]);
        explicit_bzero(body, len);
        free(body);
        if (type == MSG_EVENT) continue;
        if (rid != id) return -1;
        return type;
    }
}

/* ---- the child: runs as the user ---- */

static int connect_socket(const char *path, int64_t deadline) {
    struct sockaddr_un addr;
    if (strlen(path) >= sizeof addr.sun_path) return -1;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return -1;
    memset(&addr, 0, sizeof addr);
    addr.sun_family = AF_UNIX;
    strcpy(addr.sun_path, path);
    for (;;) {
        if (connect(fd, (struct sockaddr *)&addr, sizeof addr) == 0) break;
        if (errno == EINTR) continue;
        if (errno == EAGAIN && now_ms() < deadline) { sleep_ms(20); continue; } /* the listener's backlog is full */
        int connected = 0;
        if (errno == EINPROGRESS && wait_fd(fd, POLLOUT, deadline) == 0) {
            int err = 0;
            socklen_t elen = sizeof err;
            connected = getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen) == 0 && err == 0;
        }
        if (connected) break;
        close(fd);
        return -1;
    }
    /* The password goes only to the user's own agent (this child runs as the user): a socket served
       by any other uid -- a stale path, a hostile XDG_RUNTIME_DIR -- gets nothing, not even HELLO. */
    struct ucred peer;
    socklen_t len = sizeof peer;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &len) != 0 || len != sizeof peer || peer.uid != getuid()) {
        close(fd);
        return NOT_THE_USERS_AGENT;
    }
    return fd;
}

/* The agent gets a minimal environment, not whatever the login process carried. */
struct agent_env { char home[1024], user[300], logname[300], runtime[1024]; };

static void start_agent(const struct options *o, const char *socket_path, const struct agent_env *env) {
    pid_t pid = fork();
    if (pid != 0) { if (pid > 0) waitpid(pid, NULL, 0); return; }
    /* Intermediate child: detach fully so the agent outlives the PAM conversation. */
    if (setsid() < 0 || fork() != 0) _exit(0);
    int null = open("/dev/null", O_RDWR);
    if (null >= 0) { dup2(null, 0); dup2(null, 1); dup2(null, 2); if (null > 2) close(null); }
    /* Nothing the login process had open may leak into a long-lived agent. */
    close_inherited_descriptors();
    const char *argv[4 + MAX_AGENT_ARGS];
    int n = 0;
    argv[n++] = o->agent;
    argv[n++] = "--socket";
    argv[n++] = socket_path;
    for (int i = 0; i < o->n_agent_args; i++) argv[n++] = o->agent_args[i];
    argv[n] = NULL;
    const char *envp[] = { "PATH=/usr/local/bin:/usr/bin:/bin", env->home, env->user, env->logname,
                           env->runtime[0] ? env->runtime : NULL, NULL };
    execve(o->agent, (char *const *)argv, (char *const *)envp);
    _exit(127);
}

static int connect_or_start(const struct options *o, const char *path, const struct agent_env *env, int64_t start_deadline,
                            int64_t deadline) {
    int fd = connect_socket(path, deadline);
    if (fd >= 0 || fd == NOT_THE_USERS_AGENT || !o->agent) return fd;
    start_agent(o, path, env);
    /* Up to start_deadline, leaving the rest of the budget for the exchange. */
    while (fd == -1 && now_ms() < start_deadline) {
        sleep_ms(50);
        fd = connect_socket(path, deadline);
    }
    return fd;
}

static int drop_privileges(const struct passwd *pw) {
    if (geteuid() != 0 || pw->pw_uid == 0) return getuid() == pw->pw_uid ? 0 : -1;
    if (initgroups(pw->pw_name, pw->pw_gid) != 0) return -1;
    if (setgid(pw->pw_gid) != 0 || setuid(pw->pw_uid) != 0) return -1;
    if (setuid(0) == 0 || getuid() != pw->pw_uid || geteuid() != pw->pw_uid) return -1; /* must not regain root */
    return 0;
}

enum op { OP_NONE, OP_UNLOCK, OP_LOCK, OP_CHANGE };

/* SESSION: one byte, the event (COFFER_SESSION_OPENED or COFFER_SESSION_CLOSED). */
static int send_session(int fd, int64_t deadline, uint32_t id, uint8_t event) {
    unsigned char f[10] = { 0, 0, 0, 6, MSG_SESSION, (unsigned char)(id >> 24), (unsigned char)(id >> 16),
                            (unsigned char)(id >> 8), (unsigned char)id, event };
    return write_all(fd, f, sizeof f, deadline) ? -1 : 0;
}

static int child_main(const struct options *o, const char *socket_path, const struct agent_env *env, enum op op, int session,
                      const char *old_tok, const char *new_tok, int64_t start_deadline, int64_t deadline) {
    int fd = connect_or_start(o, socket_path, env, start_deadline, deadline);
    if (fd == NOT_THE_USERS_AGENT) return CHILD_IMPOSTOR;
    if (fd < 0) return now_ms() >= deadline ? CHILD_TIMEOUT : CHILD_NO_AGENT;
    int32_t status = 0;
    int type = -1;
    if (send_request(fd, deadline, MSG_HELLO, 1, NULL, NULL, 0) || read_reply(fd, deadline, 1, &status) != MSG_HELLO_REPLY)
        goto failed;
    /* The login session's opening or closing goes first, pipelined with the operation (no wait between
       them): the agent counts the session even when the operation (an unlock, which may take a while)
       runs out of time. Its reply comes first; an agent from before SESSION answers it -50, and the
       operation's own answer decides the result. */
    int32_t session_status = 0;
    if (session && send_session(fd, deadline, 4, (uint8_t)session)) goto failed;
#define SESSION_REPLY() do { if (session && read_reply(fd, deadline, 4, &session_status) < 0) goto failed; } while (0)
    switch (op) {
    case OP_LOCK:
        if (send_request(fd, deadline, MSG_LOCK, 2, NULL, NULL, 0)) goto failed;
        SESSION_REPLY();
        type = read_reply(fd, deadline, 2, &status);
        break;
    case OP_UNLOCK:
        if (send_request(fd, deadline, MSG_UNLOCK, 2, new_tok, NULL, 1)) goto failed;
        SESSION_REPLY();
        type = read_reply(fd, deadline, 2, &status);
        if (type == MSG_ERROR && status == ERR_SEC_NOT_AVAILABLE) {
            /* No passcode yet: from now on the keybag follows the login password. */
            if (send_request(fd, deadline, MSG_SET_PASSCODE, 3, "", new_tok, 2)) goto failed;
            type = read_reply(fd, deadline, 3, &status);
        }
        break;
    case OP_CHANGE:
        if (send_request(fd, deadline, MSG_SET_PASSCODE, 2, old_tok, new_tok, 2)) goto failed;
        SESSION_REPLY();
        type = read_reply(fd, deadline, 2, &status);
        break;
    default:
        if (session) type = read_reply(fd, deadline, 4, &session_status);
        break;
    }
#undef SESSION_REPLY
    close(fd);
    if (type == MSG_OK) return CHILD_OK;
    if (type == MSG_ERROR) return CHILD_REFUSED;
    return now_ms() >= deadline ? CHILD_TIMEOUT : CHILD_PROTOCOL;
failed:
    close(fd);
    return now_ms() >= deadline ? CHILD_TIMEOUT : CHILD_PROTOCOL;
}

/* ---- the parent: forks the child, waits with a timeout ---- */

static void resolve_socket(pam_handle_t *pamh, const struct options *o, const struct passwd *pw, char *out, size_t n) {
    if (o->socket) { snprintf(out, n, "%s", o->socket); return; }
    const char *runtime = pam_getenv(pamh, "XDG_RUNTIME_DIR");
    if (runtime && *runtime) snprintf(out, n, "%s/coffer/agent.sock", runtime);
    else snprintf(out, n, "%s/%u/coffer/agent.sock", o->runtime_root, (unsigned)pw->pw_uid);
}

/* Runs `op` against the agent of the current PAM user. With `expected_uid`, only if that user is
   still the one with this uid; otherwise nothing is sent anywhere. */
static int talk_to_agent(pam_handle_t *pamh, const struct options *o, enum op op, int session, const uid_t *expected_uid,
                         const char *old_tok, const char *new_tok) {
    const char *user = NULL;
    struct passwd pwbuf, *pw;
    char strbuf[4096];
    if (!(pw = pam_user_entry(pamh, &pwbuf, strbuf, sizeof strbuf, &user, 1))) return -1;
    if (expected_uid && pw->pw_uid != *expected_uid) {
        pam_syslog(pamh, LOG_NOTICE, "the PAM user changed to %s (uid %u) after uid %u gave the password; "
                   "the password was not handed to any agent", user, (unsigned)pw->pw_uid, (unsigned)*expected_uid);
        if (!session) return -1;
        /* The session is still this user's: its agent hears of it, without any password. */
        op = OP_NONE;
        old_tok = NULL;
        new_tok = NULL;
    }
    char socket_path[sizeof(((struct sockaddr_un *)0)->sun_path) + 64];
    resolve_socket(pamh, o, pw, socket_path, sizeof socket_path);
    struct agent_env env;
    memset(&env, 0, sizeof env);
    snprintf(env.home, sizeof env.home, "HOME=%s", pw->pw_dir);
    snprintf(env.user, sizeof env.user, "USER=%s", pw->pw_name);
    snprintf(env.logname, sizeof env.logname, "LOGNAME=%s", pw->pw_name);
    const char *runtime = pam_getenv(pamh, "XDG_RUNTIME_DIR");
    if (runtime && *runtime) snprintf(env.runtime, sizeof env.runtime, "XDG_RUNTIME_DIR=%s", runtime);

    int64_t start = now_ms(), deadline = start + o->budget_ms, start_deadline = start + o->start_ms;
    pid_t pid = fork();
    if (pid < 0) { pam_syslog(pamh, LOG_ERR, "fork: %m"); return -1; }
    if (pid == 0) {
        /* Before anything touches the password: no core dump, no ptrace by the user's other
           processes, none of the login process's descriptors. */
        prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
        close_inherited_descriptors();
        signal(SIGPIPE, SIG_IGN);
        if (drop_privileges(pw) != 0) _exit(CHILD_PRIVS);
        prctl(PR_SET_DUMPABLE, 0, 0, 0, 0); /* a uid change resets it to fs.suid_dumpable */
        _exit(child_main(o, socket_path, &env, op, session, old_tok, new_tok, start_deadline, deadline));
    }
    int status = 0;
    for (;;) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid) break;
        if (r < 0 && errno != EINTR) return -1;
        if (now_ms() >= deadline + KILL_GRACE_MS) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            status = -1;
            break;
        }
        sleep_ms(10);
    }
    int code = status != -1 && WIFEXITED(status) ? WEXITSTATUS(status) : CHILD_TIMEOUT;
    const char *what = code == CHILD_OK ? "ok" : code == CHILD_NO_AGENT ? "no agent listening"
        : code == CHILD_REFUSED ? "the agent refused" : code == CHILD_PRIVS ? "cannot drop privileges"
        : code == CHILD_IMPOSTOR ? "the socket is served by another user's process; the password was not sent"
        : code == CHILD_TIMEOUT ? "no answer within the time allowed; going on without it" : "protocol error";
    if (code != CHILD_OK || o->debug)
        pam_syslog(pamh, code == CHILD_OK ? LOG_DEBUG : LOG_NOTICE, "coffer agent at %s for %s: %s", socket_path, user, what);
    return code == CHILD_OK ? 0 : -1;
}

/* ---- the runtime directory (what logind makes; nobody does without it) ---- */

/* Makes ROOT/NAME (ROOT open as rootfd) for the user unless something has that name already: first
   under a random temporary name, handed to the user through its descriptor, then renamed into place
   without replacing anything. A process killed half way leaves only a temporary directory, never a
   final one the user cannot use; a login racing this one finds the name taken and both check what
   is there. Returns 0 (made, or the name exists) or -1 (logged). */
static int make_user_dir(pam_handle_t *pamh, int rootfd, const char *name, const struct passwd *pw, const char *path) {
    struct stat st;
    if (fstatat(rootfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0) return 0;
    char tmp[64];
    int made = 0;
    for (int i = 0; i < 8 && !made; i++) {
        unsigned char r[6];
        if (getrandom(r, sizeof r, 0) != (ssize_t)sizeof r) break;
        snprintf(tmp, sizeof tmp, ".%s.%02x%02x%02x%02x%02x%02x", name, r[0], r[1], r[2], r[3], r[4], r[5]);
        made = mkdirat(rootfd, tmp, 0700) == 0;
        if (!made && errno != EEXIST) break;
    }
    if (!made) {
        pam_syslog(pamh, LOG_NOTICE, "runtime directory: cannot make %s: %m", path);
        return -1;
    }
    int fd = openat(rootfd, tmp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    int ok = fd >= 0 && fstat(fd, &st) == 0 && st.st_uid == geteuid() && fchown(fd, pw->pw_uid, pw->pw_gid) == 0
             && fchmod(fd, 0700) == 0;
    if (fd >= 0) close(fd);
    if (ok && renameat2(rootfd, tmp, rootfd, name, RENAME_NOREPLACE) == 0) {
        pam_syslog(pamh, LOG_INFO, "runtime directory %s made for %s", path, pw->pw_name);
        return 0;
    }
    int err = errno;
    unlinkat(rootfd, tmp, AT_REMOVEDIR);
    if (ok && err == EEXIST) return 0; /* another login was first */
    errno = err;
    pam_syslog(pamh, LOG_NOTICE, "runtime directory: cannot make %s for %s: %m", path, pw->pw_name);
    return -1;
}

/* Makes sure the user's runtime directory ROOT/UID exists: a directory owned by the user, mode 0700.
   ROOT (made 0755 if missing) must be a real directory of root or of this process, writable by
   nobody else (so nobody can swap what is made in it) and traversable by everyone (the user's agent
   must reach its directory). Everything after the open of ROOT goes through descriptors and never
   follows a symbolic link. A directory that exists with another owner or mode is refused, never
   repaired (someone else may have made it). Returns 0 with the path in `out`, or -1 (logged). */
static int ensure_runtime_dir(pam_handle_t *pamh, const char *root, const struct passwd *pw, char *out, size_t n) {
    char name[24];
    snprintf(name, sizeof name, "%u", (unsigned)pw->pw_uid);
    snprintf(out, n, "%s/%s", root, name);
    int rootfd = open(root, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC), made_root = 0;
    if (rootfd < 0 && errno == ENOENT && ((made_root = mkdir(root, 0755) == 0) || errno == EEXIST))
        rootfd = open(root, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (rootfd < 0) {
        pam_syslog(pamh, LOG_NOTICE, "runtime directory: cannot open %s: %m", root);
        return -1;
    }
    /* Every user must reach their own directory in it, whatever the login process's umask. */
    if (made_root) fchmod(rootfd, 0755);
    struct stat st;
    if (fstat(rootfd, &st) != 0 || (st.st_uid != 0 && st.st_uid != geteuid()) || (st.st_mode & (S_IWGRP | S_IWOTH))
        || !(st.st_mode & S_IXOTH)) {
        pam_syslog(pamh, LOG_NOTICE, "runtime directory: refusing %s: it must belong to root, be writable by nobody else "
                   "and be searchable by everyone (mode 0755 or 0711)", root);
        close(rootfd);
        return -1;
    }
    int fd = -1, ok = make_user_dir(pamh, rootfd, name, pw, out) == 0;
    if (ok) {
        fd = openat(rootfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        ok = fd >= 0 && fstat(fd, &st) == 0;
        if (!ok) {
            pam_syslog(pamh, LOG_NOTICE, "runtime directory: refusing %s: not a directory (or a symbolic link)", out);
        } else if (st.st_uid != pw->pw_uid || (st.st_mode & 07777) != 0700) {
            pam_syslog(pamh, LOG_NOTICE, "runtime directory: refusing %s: owned by uid %u with mode %04o, not by %s (uid %u) with mode 0700",
                       out, (unsigned)st.st_uid, (unsigned)(st.st_mode & 07777), pw->pw_name, (unsigned)pw->pw_uid);
            ok = 0;
        }
    }
    if (fd >= 0) close(fd);
    close(rootfd);
    return ok ? 0 : -1;
}

/* Without systemd (or with runtime_root= given), without XDG_RUNTIME_DIR and without socket=, makes
   the runtime directory and puts XDG_RUNTIME_DIR into the session's environment. Under systemd a
   session without it (su - OTHER inside a session, a stack without pam_systemd or with it later) is
   logind's business: nothing is made. -1: it is unusable, talk to no agent. */
static int prepare_runtime_dir(pam_handle_t *pamh, const struct options *o) {
    if (o->socket) return 0;
    const char *runtime = pam_getenv(pamh, "XDG_RUNTIME_DIR");
    if (runtime && *runtime) return 0;
    if (!o->runtime_root_given && access(o->systemd_check, F_OK) == 0) {
        if (o->debug) pam_syslog(pamh, LOG_DEBUG, "systemd is running (%s): the runtime directory is logind's", o->systemd_check);
        return 0;
    }
    const char *user = NULL;
    struct passwd pwbuf, *pw;
    char strbuf[4096];
    if (!(pw = pam_user_entry(pamh, &pwbuf, strbuf, sizeof strbuf, &user, 1))) return -1;
    char path[1024], env[1100];
    if (ensure_runtime_dir(pamh, o->runtime_root, pw, path, sizeof path) != 0) return -1;
    snprintf(env, sizeof env, "XDG_RUNTIME_DIR=%s", path);
    if (pam_putenv(pamh, env) != PAM_SUCCESS) {
        pam_syslog(pamh, LOG_NOTICE, "cannot set XDG_RUNTIME_DIR for the session");
        return -1;
    }
    return 0;
}

/* ---- PAM entry points ---- */

PAM_EXTERN int pam_sm_authenticate(pam_handle_t *pamh, int flags, int argc, const char **argv) {
    (void)flags;
    struct options o;
    parse_options(pamh, argc, argv, &o);
    /* A new authentication forgets what an earlier one on this handle remembered. */
    pam_set_data(pamh, DATA_KEY, NULL, NULL);
    const void *tok = NULL;
    if (pam_get_item(pamh, PAM_AUTHTOK, &tok) != PAM_SUCCESS || !tok) {
        /* No earlier module set the password item (pam_unix does): ask for it, which also sets the
           item for later modules that take try_first_pass / use_first_pass. */
        const char *asked = NULL;
        if (pam_get_authtok(pamh, PAM_AUTHTOK, &asked, NULL) == PAM_SUCCESS) tok = asked;
    }
    if (tok && *(const char *)tok) {
        /* Remember who gave it: the session may be opened for someone else (sudo -i -u OTHER). */
        const char *user = NULL;
        struct passwd pwbuf, *pw;
        char strbuf[4096];
        if (!(pw = pam_user_entry(pamh, &pwbuf, strbuf, sizeof strbuf, &user, 0))) return PAM_IGNORE;
        size_t len = strlen(tok);
        struct stash *s = malloc(sizeof *s + len + 1);
        if (!s) return PAM_IGNORE;
        s->uid = pw->pw_uid;
        s->len = len;
        memcpy(s->tok, tok, len + 1);
        if (pam_set_data(pamh, DATA_KEY, s, wipe_stash) != PAM_SUCCESS) wipe_stash(pamh, s, 0);
    } else if (o.debug) {
        pam_syslog(pamh, LOG_DEBUG, "no password to remember (place pam_coffer after the module that asks for it)");
    }
    return PAM_IGNORE;
}

/* Account management comes after a successful authentication, in the same process. sshd's
   keyboard-interactive authentication runs PAM's authentication and account steps in a process of
   their own, so what authentication remembered never reaches the session: with an
   "account optional pam_coffer.so" line (pam_coffer(8), SSH LOGINS) the password goes to a running
   agent here instead, and is forgotten. No agent is started at this step (the session starts it). */
PAM_EXTERN int pam_sm_acct_mgmt(pam_handle_t *pamh, int flags, int argc, const char **argv) {
    (void)flags;
    struct options o;
    parse_options(pamh, argc, argv, &o);
    o.agent = NULL;
    const void *data = NULL;
    if (pam_get_data(pamh, DATA_KEY, &data) != PAM_SUCCESS || !data) return PAM_IGNORE;
    const struct stash *s = data;
    talk_to_agent(pamh, &o, OP_UNLOCK, 0, &s->uid, NULL, s->tok);
    pam_set_data(pamh, DATA_KEY, NULL, NULL); /* runs the wiping cleanup now */
    return PAM_IGNORE;
}

PAM_EXTERN int pam_sm_setcred(pam_handle_t *pamh, int flags, int argc, const char **argv) {
    (void)pamh; (void)flags; (void)argc; (void)argv;
    return PAM_IGNORE;
}

/* Puts where the agent listens into the session's environment, as pam_gnome_keyring does: so that a
   session without systemd's environment.d (a console or ssh login, a display manager's session)
   finds the agent's ssh-agent socket. SSH_AUTH_SOCK is the ssh-agent socket beside the agent's
   (cofferd's default; an agent configured otherwise wants no_env) unless the environment already
   has one; COFFER_SOCKET only when socket= names a place clients would not find by themselves. */
static void export_sockets(pam_handle_t *pamh, const struct options *o) {
    if (o->no_env) return;
    const char *user = NULL;
    struct passwd pwbuf, *pw;
    char strbuf[4096];
    if (!(pw = pam_user_entry(pamh, &pwbuf, strbuf, sizeof strbuf, &user, 1))) return;
    char socket_path[sizeof(((struct sockaddr_un *)0)->sun_path) + 64];
    resolve_socket(pamh, o, pw, socket_path, sizeof socket_path);
    char env[sizeof socket_path + 32];
    const char *slash = strrchr(socket_path, '/');
    const char *have = pam_getenv(pamh, "SSH_AUTH_SOCK");
    if (slash && !(have && *have)) {
        snprintf(env, sizeof env, "SSH_AUTH_SOCK=%.*s/ssh-agent.sock", (int)(slash - socket_path), socket_path);
        if (pam_putenv(pamh, env) != PAM_SUCCESS) pam_syslog(pamh, LOG_NOTICE, "cannot set SSH_AUTH_SOCK for the session");
    }
    if (o->socket) {
        snprintf(env, sizeof env, "COFFER_SOCKET=%s", socket_path);
        if (pam_putenv(pamh, env) != PAM_SUCCESS) pam_syslog(pamh, LOG_NOTICE, "cannot set COFFER_SOCKET for the session");
    }
}

PAM_EXTERN int pam_sm_open_session(pam_handle_t *pamh, int flags, int argc, const char **argv) {
    (void)flags;
    struct options o;
    parse_options(pamh, argc, argv, &o);
    if (prepare_runtime_dir(pamh, &o) != 0) {
        /* No usable place for the agent's socket: the password goes nowhere. */
        pam_set_data(pamh, DATA_KEY, NULL, NULL);
        return PAM_SUCCESS;
    }
    export_sockets(pamh, &o);
    const void *data = NULL;
    if (pam_get_data(pamh, DATA_KEY, &data) != PAM_SUCCESS || !data) {
        /* No password (a key login): the agent still counts the session, so it knows the last logout. */
        talk_to_agent(pamh, &o, OP_NONE, COFFER_SESSION_OPENED, NULL, NULL, NULL);
        return PAM_SUCCESS;
    }
    const struct stash *s = data;
    {
        /* The session is another user's than the one who gave the password (sudo -i -u OTHER): the
           password is wiped before any child exists, and that user's agent only hears of the session. */
        const char *user = NULL;
        struct passwd pwbuf, *pw;
        char strbuf[4096];
        if ((pw = pam_user_entry(pamh, &pwbuf, strbuf, sizeof strbuf, &user, 1)) && pw->pw_uid != s->uid) {
            pam_syslog(pamh, LOG_NOTICE, "the PAM user changed to %s (uid %u) after uid %u gave the password; "
                       "the password was not handed to any agent", user, (unsigned)pw->pw_uid, (unsigned)s->uid);
            pam_set_data(pamh, DATA_KEY, NULL, NULL); /* runs the wiping cleanup now */
            talk_to_agent(pamh, &o, OP_NONE, COFFER_SESSION_OPENED, NULL, NULL, NULL);
            return PAM_SUCCESS;
        }
    }
    /* Only to the agent of the uid that authenticated (talk_to_agent checks the PAM user again). */
    talk_to_agent(pamh, &o, OP_UNLOCK, COFFER_SESSION_OPENED, &s->uid, NULL, s->tok);
    pam_set_data(pamh, DATA_KEY, NULL, NULL); /* runs the wiping cleanup now */
    return PAM_SUCCESS;
}

PAM_EXTERN int pam_sm_close_session(pam_handle_t *pamh, int flags, int argc, const char **argv) {
    (void)flags;
    struct options o;
    parse_options(pamh, argc, argv, &o);
    /* The agent counts the user's sessions: at the close of the last it locks and ends what lasts until
       the last logout (until-first-auth directories); lock_on_close locks at every close. */
    o.agent = NULL; /* never start an agent to tell it a session closed */
    talk_to_agent(pamh, &o, o.lock_on_close ? OP_LOCK : OP_NONE, COFFER_SESSION_CLOSED, NULL, NULL, NULL);
    return PAM_SUCCESS;
}

PAM_EXTERN int pam_sm_chauthtok(pam_handle_t *pamh, int flags, int argc, const char **argv) {
    const void *old_tok = NULL, *new_tok = NULL;
    if (flags & PAM_PRELIM_CHECK) {
        /* pam_unix sets the old password here; if no module did, ask so the update can use it --
           but only when users change their own password: root running "passwd USER" knows none. */
        if (getuid() != 0 && (pam_get_item(pamh, PAM_OLDAUTHTOK, &old_tok) != PAM_SUCCESS || !old_tok)) {
            const char *asked = NULL;
            pam_get_authtok(pamh, PAM_OLDAUTHTOK, &asked, "Current password: ");
        }
        /* Remember whose password this is: the update must concern the same uid. */
        const char *user = NULL;
        struct passwd pwbuf, *pw;
        char strbuf[4096];
        uid_t *uid = NULL;
        if ((pw = pam_user_entry(pamh, &pwbuf, strbuf, sizeof strbuf, &user, 1)) && (uid = malloc(sizeof *uid))) {
            *uid = pw->pw_uid;
            if (pam_set_data(pamh, CHAUTHTOK_UID_KEY, uid, free_data) != PAM_SUCCESS) free(uid);
        }
        return PAM_SUCCESS;
    }
    if (!(flags & PAM_UPDATE_AUTHTOK)) return PAM_IGNORE;
    struct options o;
    parse_options(pamh, argc, argv, &o);
    const void *prelim_uid = NULL;
    if (pam_get_data(pamh, CHAUTHTOK_UID_KEY, &prelim_uid) != PAM_SUCCESS || !prelim_uid) {
        pam_syslog(pamh, LOG_NOTICE, "password update without a preliminary check; the Coffer passcode is unchanged");
        return PAM_SUCCESS;
    }
    uid_t expected = *(const uid_t *)prelim_uid;
    pam_set_data(pamh, CHAUTHTOK_UID_KEY, NULL, NULL);
    pam_get_item(pamh, PAM_OLDAUTHTOK, &old_tok);
    pam_get_item(pamh, PAM_AUTHTOK, &new_tok);
    if (!old_tok || !*(const char *)old_tok || !new_tok || !*(const char *)new_tok) {
        pam_syslog(pamh, LOG_NOTICE, "password change without old and new passwords; the Coffer passcode is unchanged");
        return PAM_SUCCESS;
    }
    talk_to_agent(pamh, &o, OP_CHANGE, 0, &expected, old_tok, new_tok);
    return PAM_SUCCESS;
}

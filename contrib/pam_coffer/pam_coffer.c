/*
 * pam_coffer: hands the login password to the user's Coffer agent.
 *
 *   auth     optional pam_coffer.so          remembers the password (PAM_AUTHTOK; asks for it if no
 *                                            earlier module set it) in PAM data
 *   session  optional pam_coffer.so          unlocks the agent with it (sets the passcode on first use)
 *   password optional pam_coffer.so          follows a password change (old -> new)
 *
 * Arguments: socket=PATH  agent=/usr/local/bin/cofferd  agentarg=ARG (repeatable)  lock_on_close  debug
 *
 * It is a small client of the agent's wire protocol (Sources/CofferProtocol/CofferProtocol.docc/
 * WireProtocol.md) with no cryptography of its own, and no dependency on the Swift runtime. It never
 * decides authentication and never fails a login or a password change: every problem is logged
 * (never the password) and PAM_SUCCESS/PAM_IGNORE is returned.
 *
 * Talking to the agent happens in a child process that first drops to the target user, because
 * the agent refuses peers of another uid; and the child refuses an agent of another uid in turn
 * (SO_PEERCRED), so the password only ever reaches the user's own agent.
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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <syslog.h>
#include <time.h>
#include <unistd.h>

#include <security/pam_ext.h>
#include <security/pam_modules.h>

#define DATA_KEY "pam_coffer_authtok"
#define MAX_FRAME (256 * 1024)
#define MAX_AGENT_ARGS 8
#define IO_TIMEOUT_SECONDS 30
#define CHILD_TIMEOUT_MS 40000

#define MSG_HELLO 0x01
#define MSG_UNLOCK 0x03
#define MSG_LOCK 0x04
#define MSG_SET_PASSCODE 0x05
#define MSG_OK 0x80
#define MSG_HELLO_REPLY 0x81
#define MSG_EVENT 0xC0
#define MSG_ERROR 0xFF
#define ERR_SEC_NOT_AVAILABLE (-25291)

/* Child exit codes, logged by the parent. */
enum { CHILD_OK = 0, CHILD_NO_AGENT = 10, CHILD_PROTOCOL = 11, CHILD_REFUSED = 12, CHILD_PRIVS = 13, CHILD_IMPOSTOR = 14 };

/* connect_socket's answer for a socket served by a process of another uid. */
#define NOT_THE_USERS_AGENT (-2)

struct options {
    const char *socket;
    const char *agent;
    const char *agent_args[MAX_AGENT_ARGS];
    int n_agent_args;
    int lock_on_close;
    int debug;
};

static void parse_options(pam_handle_t *pamh, int argc, const char **argv, struct options *o) {
    memset(o, 0, sizeof *o);
    for (int i = 0; i < argc; i++) {
        if (strncmp(argv[i], "socket=", 7) == 0) o->socket = argv[i] + 7;
        else if (strncmp(argv[i], "agent=", 6) == 0) o->agent = argv[i] + 6;
        else if (strncmp(argv[i], "agentarg=", 9) == 0 && o->n_agent_args < MAX_AGENT_ARGS)
            o->agent_args[o->n_agent_args++] = argv[i] + 9;
        else if (strcmp(argv[i], "lock_on_close") == 0) o->lock_on_close = 1;
        else if (strcmp(argv[i], "debug") == 0) o->debug = 1;
        else pam_syslog(pamh, LOG_WARNING, "unknown option: %s", argv[i]);
    }
}

static void wipe_and_free(pam_handle_t *pamh, void *data, int status) {
    (void)pamh; (void)status;
    if (data) { explicit_bzero(data, strlen(data)); free(data); }
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

static int write_all(int fd, const unsigned char *p, size_t n) {
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        p += w; n -= (size_t)w;
    }
    return 0;
}

static int read_all(int fd, unsigned char *p, size_t n) {
    while (n > 0) {
        ssize_t r = recv(fd, p, n, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        p += r; n -= (size_t)r;
    }
    return 0;
}

/* Sends one request (type, id, payload parts) and wipes the frame buffer afterwards. */
static int send_request(int fd, uint8_t type, uint32_t id, const char *blob1, const char *blob2, int nblobs) {
    size_t cap = 9 + 4 + 2 + 2 + 2 + 16 + (blob1 ? strlen(blob1) : 0) + (blob2 ? strlen(blob2) : 0) + 8;
    struct buf b = { malloc(cap), 0, cap };
    if (!b.p) return -1;
    int rc = put_u32(&b, 0) || put_u8(&b, type) || put_u32(&b, id);
    if (!rc && type == MSG_HELLO) {
        rc = put_u16(&b, 1) || put_u16(&b, 1) || put_u16(&b, 10) || buf_put(&b, "pam_coffer", 10);
    }
    if (!rc && nblobs >= 1) rc = put_blob(&b, blob1);
    if (!rc && nblobs >= 2) rc = put_blob(&b, blob2);
    if (!rc) {
        uint32_t body = (uint32_t)(b.len - 4);
        b.p[0] = body >> 24; b.p[1] = (body >> 16) & 0xff; b.p[2] = (body >> 8) & 0xff; b.p[3] = body & 0xff;
        rc = write_all(fd, b.p, b.len);
    }
    explicit_bzero(b.p, b.cap);
    free(b.p);
    return rc ? -1 : 0;
}

/* Reads the reply to `id`, skipping events. Returns the message type, or -1; *status gets an ERROR's code. */
static int read_reply(int fd, uint32_t id, int32_t *status) {
    for (;;) {
        unsigned char hdr[4];
        if (read_all(fd, hdr, 4)) return -1;
        uint32_t len = (uint32_t)hdr[0] << 24 | (uint32_t)hdr[1] << 16 | (uint32_t)hdr[2] << 8 | hdr[3];
        if (len < 5 || len > MAX_FRAME) return -1;
        unsigned char *body = malloc(len);
        if (!body) return -1;
        if (read_all(fd, body, len)) { free(body); return -1; }
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

static int connect_socket(const char *path) {
    struct sockaddr_un addr;
    if (strlen(path) >= sizeof addr.sun_path) return -1;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    memset(&addr, 0, sizeof addr);
    addr.sun_family = AF_UNIX;
    strcpy(addr.sun_path, path);
    if (connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0) { close(fd); return -1; }
    /* The password goes only to the user's own agent (this child runs as the user): a socket served
       by any other uid -- a stale path, a hostile XDG_RUNTIME_DIR -- gets nothing, not even HELLO. */
    struct ucred peer;
    socklen_t len = sizeof peer;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &len) != 0 || len != sizeof peer || peer.uid != getuid()) {
        close(fd);
        return NOT_THE_USERS_AGENT;
    }
    struct timeval tv = { IO_TIMEOUT_SECONDS, 0 };
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
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
    if (close_range(3, ~0U, 0) != 0) for (int fd = 3; fd < 4096; fd++) close(fd);
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

static int connect_or_start(const struct options *o, const char *path, const struct agent_env *env) {
    int fd = connect_socket(path);
    if (fd >= 0 || fd == NOT_THE_USERS_AGENT || !o->agent) return fd;
    start_agent(o, path, env);
    for (int i = 0; i < 60 && fd == -1; i++) { /* up to 3 s */
        struct timespec ts = { 0, 50 * 1000 * 1000 };
        nanosleep(&ts, NULL);
        fd = connect_socket(path);
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

enum op { OP_UNLOCK, OP_LOCK, OP_CHANGE };

static int child_main(const struct options *o, const char *socket_path, const struct agent_env *env, enum op op,
                      const char *old_tok, const char *new_tok) {
    int fd = connect_or_start(o, socket_path, env);
    if (fd == NOT_THE_USERS_AGENT) return CHILD_IMPOSTOR;
    if (fd < 0) return CHILD_NO_AGENT;
    int32_t status = 0;
    if (send_request(fd, MSG_HELLO, 1, NULL, NULL, 0) || read_reply(fd, 1, &status) != MSG_HELLO_REPLY) return CHILD_PROTOCOL;
    int type;
    switch (op) {
    case OP_LOCK:
        if (send_request(fd, MSG_LOCK, 2, NULL, NULL, 0)) return CHILD_PROTOCOL;
        type = read_reply(fd, 2, &status);
        break;
    case OP_UNLOCK:
        if (send_request(fd, MSG_UNLOCK, 2, new_tok, NULL, 1)) return CHILD_PROTOCOL;
        type = read_reply(fd, 2, &status);
        if (type == MSG_ERROR && status == ERR_SEC_NOT_AVAILABLE) {
            /* No passcode yet: from now on the keybag follows the login password. */
            if (send_request(fd, MSG_SET_PASSCODE, 3, "", new_tok, 2)) return CHILD_PROTOCOL;
            type = read_reply(fd, 3, &status);
        }
        break;
    case OP_CHANGE:
        if (send_request(fd, MSG_SET_PASSCODE, 2, old_tok, new_tok, 2)) return CHILD_PROTOCOL;
        type = read_reply(fd, 2, &status);
        break;
    default:
        return CHILD_PROTOCOL;
    }
    close(fd);
    if (type == MSG_OK) return CHILD_OK;
    return type == MSG_ERROR ? CHILD_REFUSED : CHILD_PROTOCOL;
}

/* ---- the parent: forks the child, waits with a timeout ---- */

static void resolve_socket(pam_handle_t *pamh, const struct options *o, const struct passwd *pw, char *out, size_t n) {
    if (o->socket) { snprintf(out, n, "%s", o->socket); return; }
    const char *runtime = pam_getenv(pamh, "XDG_RUNTIME_DIR");
    if (runtime && *runtime) snprintf(out, n, "%s/coffer/agent.sock", runtime);
    else snprintf(out, n, "/run/user/%u/coffer/agent.sock", (unsigned)pw->pw_uid);
}

static int talk_to_agent(pam_handle_t *pamh, const struct options *o, enum op op, const char *old_tok, const char *new_tok) {
    const char *user = NULL;
    if (pam_get_user(pamh, &user, NULL) != PAM_SUCCESS || !user) return -1;
    struct passwd pwbuf, *pw = NULL;
    char strbuf[4096];
    if (getpwnam_r(user, &pwbuf, strbuf, sizeof strbuf, &pw) != 0 || !pw) {
        pam_syslog(pamh, LOG_NOTICE, "unknown user %s", user);
        return -1;
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

    pid_t pid = fork();
    if (pid < 0) { pam_syslog(pamh, LOG_ERR, "fork: %m"); return -1; }
    if (pid == 0) {
        signal(SIGPIPE, SIG_IGN);
        if (drop_privileges(pw) != 0) _exit(CHILD_PRIVS);
        _exit(child_main(o, socket_path, &env, op, old_tok, new_tok));
    }
    int status = 0, waited = 0;
    for (;;) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid) break;
        if (r < 0 && errno != EINTR) return -1;
        if (waited >= CHILD_TIMEOUT_MS) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            pam_syslog(pamh, LOG_WARNING, "the Coffer agent did not answer in time");
            return -1;
        }
        struct timespec ts = { 0, 20 * 1000 * 1000 };
        nanosleep(&ts, NULL);
        waited += 20;
    }
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    const char *what = code == CHILD_OK ? "ok" : code == CHILD_NO_AGENT ? "no agent listening"
        : code == CHILD_REFUSED ? "the agent refused" : code == CHILD_PRIVS ? "cannot drop privileges"
        : code == CHILD_IMPOSTOR ? "the socket is served by another user's process; the password was not sent" : "protocol error";
    if (code != CHILD_OK || o->debug)
        pam_syslog(pamh, code == CHILD_OK ? LOG_DEBUG : LOG_NOTICE, "coffer agent at %s for %s: %s", socket_path, user, what);
    return code == CHILD_OK ? 0 : -1;
}

/* ---- PAM entry points ---- */

PAM_EXTERN int pam_sm_authenticate(pam_handle_t *pamh, int flags, int argc, const char **argv) {
    (void)flags;
    struct options o;
    parse_options(pamh, argc, argv, &o);
    const void *tok = NULL;
    if (pam_get_item(pamh, PAM_AUTHTOK, &tok) != PAM_SUCCESS || !tok) {
        /* No earlier module set the password item (pam_unix does): ask for it, which also sets the
           item for later modules that take try_first_pass / use_first_pass. */
        const char *asked = NULL;
        if (pam_get_authtok(pamh, PAM_AUTHTOK, &asked, NULL) == PAM_SUCCESS) tok = asked;
    }
    if (tok && *(const char *)tok) {
        char *copy = strdup(tok);
        if (copy && pam_set_data(pamh, DATA_KEY, copy, wipe_and_free) != PAM_SUCCESS) wipe_and_free(pamh, copy, 0);
    } else if (o.debug) {
        pam_syslog(pamh, LOG_DEBUG, "no password to remember (place pam_coffer after the module that asks for it)");
    }
    return PAM_IGNORE;
}

PAM_EXTERN int pam_sm_setcred(pam_handle_t *pamh, int flags, int argc, const char **argv) {
    (void)pamh; (void)flags; (void)argc; (void)argv;
    return PAM_IGNORE;
}

PAM_EXTERN int pam_sm_open_session(pam_handle_t *pamh, int flags, int argc, const char **argv) {
    (void)flags;
    struct options o;
    parse_options(pamh, argc, argv, &o);
    const void *tok = NULL;
    if (pam_get_data(pamh, DATA_KEY, &tok) != PAM_SUCCESS || !tok) return PAM_SUCCESS;
    talk_to_agent(pamh, &o, OP_UNLOCK, NULL, tok);
    pam_set_data(pamh, DATA_KEY, NULL, NULL); /* runs the wiping cleanup now */
    return PAM_SUCCESS;
}

PAM_EXTERN int pam_sm_close_session(pam_handle_t *pamh, int flags, int argc, const char **argv) {
    (void)flags;
    struct options o;
    parse_options(pamh, argc, argv, &o);
    if (o.lock_on_close) talk_to_agent(pamh, &o, OP_LOCK, NULL, NULL);
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
        return PAM_SUCCESS;
    }
    if (!(flags & PAM_UPDATE_AUTHTOK)) return PAM_IGNORE;
    struct options o;
    parse_options(pamh, argc, argv, &o);
    pam_get_item(pamh, PAM_OLDAUTHTOK, &old_tok);
    pam_get_item(pamh, PAM_AUTHTOK, &new_tok);
    if (!old_tok || !*(const char *)old_tok || !new_tok || !*(const char *)new_tok) {
        pam_syslog(pamh, LOG_NOTICE, "password change without old and new passwords; the Coffer passcode is unchanged");
        return PAM_SUCCESS;
    }
    talk_to_agent(pamh, &o, OP_CHANGE, old_tok, new_tok);
    return PAM_SUCCESS;
}

#define _GNU_SOURCE
#include "CSystemShims.h"
#include <malloc.h>
#include <sys/socket.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <errno.h>
#include <stddef.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>
#include <sys/syscall.h>
#include <sys/wait.h>

int coffer_peer_credentials(int fd, pid_t *pid, uid_t *uid, gid_t *gid) {
    struct ucred cred;
    socklen_t len = sizeof(cred);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return -1;
    if (len != sizeof(cred)) { errno = EPROTO; return -1; }
    *pid = cred.pid; *uid = cred.uid; *gid = cred.gid;
    return 0;
}

int coffer_disable_core_dumps(void) {
    struct rlimit none = { 0, 0 };
    if (setrlimit(RLIMIT_CORE, &none) != 0) return -1;
    return prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
}

int coffer_is_dumpable(void) { return prctl(PR_GET_DUMPABLE, 0, 0, 0, 0); }

int coffer_set_parent_death_signal(int sig) { return prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0); }

int coffer_accept_cloexec(int fd) { return accept4(fd, NULL, NULL, SOCK_CLOEXEC); }

int coffer_pipe_cloexec(int fds[2]) { return pipe2(fds, O_CLOEXEC); }

/* Closes every descriptor in [low, high] (high inclusive). Async-signal-safe. */
static void close_range_fallback(unsigned low, unsigned high) {
#ifdef SYS_close_range
    if (low > high) return;
    if (syscall(SYS_close_range, low, high, 0) == 0) return;
#endif
    struct rlimit rl;
    unsigned limit = 65536;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < limit) limit = (unsigned)rl.rlim_cur;
    if (high > limit) high = limit;
    for (unsigned fd = low; fd <= high && fd < limit; fd++) close((int)fd);
}

pid_t coffer_spawn(const char *path, char *const argv[], char *const envp[], int child_fd,
                   const int *targets, int ntargets) {
    int report[2];
    if (pipe2(report, O_CLOEXEC) != 0) return -1;
    int top = 2;
    for (int i = 0; i < ntargets; i++) if (targets[i] > top) top = targets[i];
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        int e = errno;
        close(report[0]); close(report[1]);
        errno = e;
        return -1;
    }
    if (pid == 0) {
        int err = 0;
        /* Move the report pipe and the child's end above every target, so no dup2 clobbers them. */
        int w = fcntl(report[1], F_DUPFD_CLOEXEC, top + 1);
        int s = w < 0 ? -1 : fcntl(child_fd, F_DUPFD_CLOEXEC, top + 1);
        if (w < 0 || s < 0) { err = errno; goto fail; }
        for (int i = 0; i < ntargets; i++) {
            if (dup2(s, targets[i]) < 0) { err = errno; goto fail; }
        }
        /* Everything above the targets and stdio goes, except the report pipe (close-on-exec). */
        close_range_fallback((unsigned)top + 1, (unsigned)w - 1);
        close_range_fallback((unsigned)w + 1, ~0U);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        for (int sig = 1; sig < NSIG; sig++) {
            if (sig == SIGKILL || sig == SIGSTOP) continue;
            signal(sig, SIG_DFL);
        }
        if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0) { err = errno; goto fail; }
        if (getppid() != parent) _exit(127); /* the parent died before the death signal was set */
        execve(path, argv, envp);
        err = errno;
    fail:
        if (w >= 0) { ssize_t n = write(w, &err, sizeof err); (void)n; }
        else { ssize_t n = write(report[1], &err, sizeof err); (void)n; }
        _exit(127);
    }
    close(report[1]);
    int child_errno = 0;
    ssize_t n;
    do { n = read(report[0], &child_errno, sizeof child_errno); } while (n < 0 && errno == EINTR);
    close(report[0]);
    if (n == (ssize_t)sizeof child_errno) {
        int status;
        while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
        errno = child_errno ? child_errno : ECHILD;
        return -1;
    }
    return pid;
}

int coffer_release_free_heap(void) {
    return malloc_trim(0);
}

int coffer_syncfs(int fd) { return syncfs(fd); }

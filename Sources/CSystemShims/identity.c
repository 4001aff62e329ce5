#define _GNU_SOURCE
#include "identity.h"
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <unistd.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/vfs.h>

#ifndef SO_PEERPIDFD
#define SO_PEERPIDFD 77
#endif
#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_pidfd_send_signal
#define SYS_pidfd_send_signal 424
#endif

/* linux/pidfd.h of 6.13 (PIDFD_INFO_SIZE_VER0 = 64); Debian 12's headers predate it. */
struct coffer_pidfd_info {
    uint64_t mask;
    uint64_t cgroupid;
    uint32_t pid, tgid, ppid, ruid, rgid, euid, egid, suid, sgid, fsuid, fsgid;
    uint32_t spare0[1];
};
#define COFFER_PIDFD_INFO_PID (1ULL << 0)
#define COFFER_PIDFD_GET_INFO _IOWR(0xFF, 11, struct coffer_pidfd_info)

int coffer_peer_pidfd(int socket_fd) {
    int pidfd = -1;
    socklen_t len = sizeof(pidfd);
    if (getsockopt(socket_fd, SOL_SOCKET, SO_PEERPIDFD, &pidfd, &len) != 0) return -1;
    if (len != sizeof(pidfd) || pidfd < 0) { errno = EPROTO; return -1; }
    return pidfd;
}

int coffer_pidfd_open(pid_t pid) { return (int)syscall(SYS_pidfd_open, pid, 0); }

/* 1 info filled, 0 process gone (ESRCH), -1 unsupported/other (errno set). */
static int get_info(int pidfd, struct coffer_pidfd_info *info) {
    memset(info, 0, sizeof(*info));
    info->mask = COFFER_PIDFD_INFO_PID;
    if (ioctl(pidfd, COFFER_PIDFD_GET_INFO, info) == 0) return 1;
    if (errno == ESRCH) return 0;
    return -1;
}

int coffer_pidfd_alive(int pidfd) {
    struct coffer_pidfd_info info;
    int r = get_info(pidfd, &info);
    if (r >= 0) return r;
    if (syscall(SYS_pidfd_send_signal, pidfd, 0, NULL, 0) == 0) return 1;
    if (errno == EPERM) return 1;  /* exists, only not ours to signal */
    if (errno == ESRCH) return 0;
    return -1;
}

pid_t coffer_pidfd_pid(int pidfd) {
    struct coffer_pidfd_info info;
    int r = get_info(pidfd, &info);
    if (r == 1) return (pid_t)info.pid;
    if (r == 0) { errno = ESRCH; return -1; }
    char path[64];
    snprintf(path, sizeof(path), "/proc/self/fdinfo/%d", pidfd);
    FILE *f = fopen(path, "re");
    if (!f) return -1;
    char line[256];
    long pid = -2;
    while (fgets(line, sizeof(line), f)) {
        if (strncmp(line, "Pid:", 4) == 0) { pid = strtol(line + 4, NULL, 10); break; }
    }
    fclose(f);
    if (pid == -2) { errno = ENOTSUP; return -1; }
    if (pid == -1) { errno = ESRCH; return -1; }
    return (pid_t)pid;
}

int coffer_is_pidfd(int fd) {
    char path[64], target[64];
    snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    ssize_t n = readlink(path, target, sizeof(target) - 1);
    if (n < 0) return -1;
    target[n] = 0;
    return strcmp(target, "anon_inode:[pidfd]") == 0 ? 1 : 0;
}

#define COFFER_MAX_PASSED_FDS 8

long coffer_recv_with_fds(int socket_fd, void *buffer, unsigned long length, int flags,
                          int *fds, int max_fds, int *fd_count, int *truncated) {
    union {
        struct cmsghdr align;
        char bytes[CMSG_SPACE(sizeof(int) * COFFER_MAX_PASSED_FDS)];
    } control;
    struct iovec iov = { .iov_base = buffer, .iov_len = length };
    struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.bytes, .msg_controllen = sizeof(control.bytes) };
    ssize_t n = recvmsg(socket_fd, &msg, flags | MSG_CMSG_CLOEXEC);
    if (n < 0) return n;
    if (msg.msg_flags & MSG_CTRUNC) *truncated = 1;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
        size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        const unsigned char *data = CMSG_DATA(c);
        for (size_t i = 0; i < count; i++) {
            int fd;
            memcpy(&fd, data + i * sizeof(int), sizeof(int));
            if (*fd_count < max_fds) {
                fds[(*fd_count)++] = fd;
            } else {
                close(fd);
                *truncated = 1;
            }
        }
    }
    return n;
}

long coffer_send_with_fds(int socket_fd, const void *buffer, unsigned long length, const int *fds, int fd_count) {
    if (fd_count < 0 || fd_count > COFFER_MAX_PASSED_FDS) { errno = EINVAL; return -1; }
    union {
        struct cmsghdr align;
        char bytes[CMSG_SPACE(sizeof(int) * COFFER_MAX_PASSED_FDS)];
    } control;
    memset(&control, 0, sizeof(control));
    struct iovec iov = { .iov_base = (void *)buffer, .iov_len = length };
    struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };
    if (fd_count > 0) {
        msg.msg_control = control.bytes;
        msg.msg_controllen = CMSG_SPACE(sizeof(int) * fd_count);
        struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int) * fd_count);
        memcpy(CMSG_DATA(c), fds, sizeof(int) * fd_count);
    }
    return sendmsg(socket_fd, &msg, MSG_NOSIGNAL);
}

long coffer_filesystem_type(int fd) {
    struct statfs s;
    if (fstatfs(fd, &s) != 0) return -1;
    return (long)s.f_type;
}

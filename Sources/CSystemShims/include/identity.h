#ifndef COFFER_SYSTEM_IDENTITY_H
#define COFFER_SYSTEM_IDENTITY_H

#include <sys/types.h>

/// A pidfd for the peer of a connected Unix socket (getsockopt SO_PEERPIDFD, Linux 6.5+), close-on-exec.
/// Returns the descriptor, or -1 with errno set (ENOPROTOOPT on older kernels; ESRCH or EINVAL
/// when the peer has already exited and been reaped).
int coffer_peer_pidfd(int socket_fd);

/// pidfd_open(pid, 0): a close-on-exec pidfd for the process that has `pid` now. -1 with errno set.
int coffer_pidfd_open(pid_t pid);

/// 1 if the process behind `pidfd` has not been reaped (a zombie still counts: its pid cannot be
/// reused), 0 if it is gone, -1 with errno set if neither PIDFD_GET_INFO nor pidfd_send_signal works.
int coffer_pidfd_alive(int pidfd);

/// The pid (in this process's pid namespace) of the process behind `pidfd`: PIDFD_GET_INFO
/// (Linux 6.13+), else the `Pid:` line of /proc/self/fdinfo/FD. Returns the pid, 0 if the process is
/// in another pid namespace, or -1 with errno set (ESRCH once it has been reaped).
pid_t coffer_pidfd_pid(int pidfd);

/// 1 if `fd` is a pidfd (its /proc/self/fd link reads `anon_inode:[pidfd]`, as on every kernel with
/// pidfds, pidfs included), 0 if it is another kind of file, -1 with errno set if it cannot be told.
/// Checked before any pidfd call on a descriptor another process handed over.
int coffer_is_pidfd(int fd);

/// One recvmsg on a stream socket that also takes the descriptors passed with the bytes
/// (SCM_RIGHTS, received close-on-exec): up to `max_fds` are stored in `fds` and counted in
/// `*fd_count`; any beyond that (and any the kernel cut off, MSG_CTRUNC) are closed and set
/// `*truncated` to 1. `flags` as for recv (MSG_DONTWAIT). Returns what recv returns.
long coffer_recv_with_fds(int socket_fd, void *buffer, unsigned long length, int flags,
                          int *fds, int max_fds, int *fd_count, int *truncated);

/// One sendmsg of `length` bytes with `fd_count` descriptors passed as SCM_RIGHTS (at most 8),
/// MSG_NOSIGNAL. Returns what sendmsg returns.
long coffer_send_with_fds(int socket_fd, const void *buffer, unsigned long length, const int *fds, int fd_count);

/// The type of the filesystem the open file `fd` is on (fstatfs f_type: FUSE_SUPER_MAGIC,
/// EXT4_SUPER_MAGIC, …), or -1 with errno set.
long coffer_filesystem_type(int fd);

#endif

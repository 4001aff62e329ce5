#ifndef COFFER_SYSTEM_SHIMS_H
#define COFFER_SYSTEM_SHIMS_H

#include <sys/types.h>

/// Credentials of a Unix-socket peer (SO_PEERCRED). Returns 0 or -1 with errno set.
int coffer_peer_credentials(int fd, pid_t *pid, uid_t *uid, gid_t *gid);

/// Disables core dumps and ptrace attach for this process: PR_SET_DUMPABLE 0 and
/// RLIMIT_CORE 0. Returns 0, or -1 with errno set.
int coffer_disable_core_dumps(void);

/// Reads PR_GET_DUMPABLE (1 dumpable, 0 not, -1 error).
int coffer_is_dumpable(void);

/// Sets the parent-death signal (PR_SET_PDEATHSIG); used for helper children.
int coffer_set_parent_death_signal(int sig);

/// accept4(fd, NULL, NULL, SOCK_CLOEXEC).
int coffer_accept_cloexec(int fd);

/// pipe2(fds, O_CLOEXEC).
int coffer_pipe_cloexec(int fds[2]);

/// Starts `path` with `argv` and `envp` (NULL-terminated) as a child of this process: fork, then
/// in the child only async-signal-safe calls: `child_fd` is duplicated onto each of the `ntargets`
/// descriptor numbers in `targets` (close-on-exec cleared), every descriptor above
/// max(targets, 2) is closed (close_range, or a loop up to RLIMIT_NOFILE), the signal mask is
/// emptied and every signal's disposition reset to the default, PR_SET_PDEATHSIG is set to
/// SIGKILL (and the child exits at once if the parent is already gone), then execve.
/// Returns the child's pid, or -1 with errno set (fork failed, or the child could not exec: its
/// errno comes back through a close-on-exec pipe and the child is reaped).
/// The death signal fires when the *thread* that called this exits (Linux semantics): call it from
/// a thread that lives as long as the child should.
pid_t coffer_spawn(const char *path, char *const argv[], char *const envp[], int child_fd,
                   const int *targets, int ntargets);

/// malloc_trim(0): returns the free pages of every malloc arena to the kernel. Returns 1 if any
/// memory was released, 0 if none.
int coffer_release_free_heap(void);

/// syncfs(2): writes out every dirty page of the filesystem holding `fd` (one call for a batch of new
/// files, instead of an fsync each). 0, or -1 with errno.
int coffer_syncfs(int fd);

#include "identity.h"

#endif

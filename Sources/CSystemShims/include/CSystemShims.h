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

#endif

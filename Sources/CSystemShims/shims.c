#define _GNU_SOURCE
#include "CSystemShims.h"
#include <sys/socket.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <errno.h>
#include <stddef.h>

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

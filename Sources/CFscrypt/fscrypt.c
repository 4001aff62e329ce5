#define _GNU_SOURCE
#include "CFscrypt.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/fscrypt.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <unistd.h>

_Static_assert(sizeof(struct fscrypt_add_key_arg) == 80, "fscrypt_add_key_arg is 80 bytes before the raw key");

/// Zeroes `n` bytes at `p` in a way the compiler does not remove.
static void wipe(void *p, size_t n) {
    volatile uint8_t *v = p;
    while (n--) *v++ = 0;
}

int coffer_fscrypt_add_key(int fd, const uint8_t *key, size_t length, uint8_t *identifier) {
    if (length == 0 || length > FSCRYPT_MAX_KEY_SIZE) return -EINVAL;
    union {
        struct fscrypt_add_key_arg arg;
        uint8_t bytes[sizeof(struct fscrypt_add_key_arg) + FSCRYPT_MAX_KEY_SIZE];
    } buffer;
    memset(&buffer, 0, sizeof buffer);
    buffer.arg.key_spec.type = FSCRYPT_KEY_SPEC_TYPE_IDENTIFIER;
    buffer.arg.raw_size = (uint32_t)length;
    memcpy(buffer.arg.raw, key, length);
    int rc = ioctl(fd, FS_IOC_ADD_ENCRYPTION_KEY, &buffer.arg);
    int saved = errno;
    if (rc == 0) memcpy(identifier, buffer.arg.key_spec.u.identifier, FSCRYPT_KEY_IDENTIFIER_SIZE);
    wipe(&buffer, sizeof buffer);
    return rc == 0 ? 0 : -saved;
}

int coffer_fscrypt_remove_key(int fd, const uint8_t *identifier, uint32_t *removal_flags) {
    struct fscrypt_remove_key_arg arg;
    memset(&arg, 0, sizeof arg);
    arg.key_spec.type = FSCRYPT_KEY_SPEC_TYPE_IDENTIFIER;
    memcpy(arg.key_spec.u.identifier, identifier, FSCRYPT_KEY_IDENTIFIER_SIZE);
    if (ioctl(fd, FS_IOC_REMOVE_ENCRYPTION_KEY, &arg) != 0) return -errno;
    *removal_flags = arg.removal_status_flags;
    return 0;
}

int coffer_fscrypt_key_status(int fd, const uint8_t *identifier, uint32_t *status, uint32_t *flags, uint32_t *user_count) {
    struct fscrypt_get_key_status_arg arg;
    memset(&arg, 0, sizeof arg);
    arg.key_spec.type = FSCRYPT_KEY_SPEC_TYPE_IDENTIFIER;
    memcpy(arg.key_spec.u.identifier, identifier, FSCRYPT_KEY_IDENTIFIER_SIZE);
    if (ioctl(fd, FS_IOC_GET_ENCRYPTION_KEY_STATUS, &arg) != 0) return -errno;
    *status = arg.status;
    *flags = arg.status_flags;
    *user_count = arg.user_count;
    return 0;
}

int coffer_fscrypt_set_policy(int fd, const uint8_t *identifier) {
    struct fscrypt_policy_v2 policy;
    memset(&policy, 0, sizeof policy);
    policy.version = FSCRYPT_POLICY_V2;
    policy.contents_encryption_mode = FSCRYPT_MODE_AES_256_XTS;
    policy.filenames_encryption_mode = FSCRYPT_MODE_AES_256_CTS;
    policy.flags = FSCRYPT_POLICY_FLAGS_PAD_32;
    memcpy(policy.master_key_identifier, identifier, FSCRYPT_KEY_IDENTIFIER_SIZE);
    // FS_IOC_SET_ENCRYPTION_POLICY (the v1 number) takes either version; the kernel reads `version`.
    if (ioctl(fd, FS_IOC_SET_ENCRYPTION_POLICY, &policy) != 0) return -errno;
    return 0;
}

int coffer_fscrypt_get_policy(int fd, uint8_t *version, uint8_t *identifier) {
    struct fscrypt_get_policy_ex_arg arg;
    memset(&arg, 0, sizeof arg);
    arg.policy_size = sizeof arg.policy;
    if (ioctl(fd, FS_IOC_GET_ENCRYPTION_POLICY_EX, &arg) != 0) return -errno;
    *version = arg.policy.version;
    if (arg.policy.version == FSCRYPT_POLICY_V2) {
        memcpy(identifier, arg.policy.v2.master_key_identifier, FSCRYPT_KEY_IDENTIFIER_SIZE);
    } else {
        memset(identifier, 0, FSCRYPT_KEY_IDENTIFIER_SIZE);
    }
    return 0;
}

int coffer_fscrypt_exchange(const char *from, const char *to) {
    if (renameat2(AT_FDCWD, from, AT_FDCWD, to, RENAME_EXCHANGE) != 0) return -errno;
    return 0;
}

int coffer_fscrypt_rename_noreplace(const char *from, const char *to) {
    if (renameat2(AT_FDCWD, from, AT_FDCWD, to, RENAME_NOREPLACE) != 0) return -errno;
    return 0;
}

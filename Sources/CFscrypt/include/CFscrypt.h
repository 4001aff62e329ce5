#ifndef COFFER_FSCRYPT_H
#define COFFER_FSCRYPT_H

// The kernel's fscrypt ioctls (<linux/fscrypt.h>, Documentation/filesystems/fscrypt.rst) for CofferFiles,
// the one module that imports this wall. One function per ioctl; every one returns 0 or -errno (errno
// captured at once). No policy decisions here: which key, which directory and why are CofferFiles's.

#include <stddef.h>
#include <stdint.h>

/// FSCRYPT_KEY_IDENTIFIER_SIZE: a v2 policy's key identifier.
#define COFFER_FSCRYPT_IDENTIFIER_BYTES 16
/// FSCRYPT_MAX_KEY_SIZE: the largest raw key the kernel accepts.
#define COFFER_FSCRYPT_MAX_KEY_BYTES 64

/// FSCRYPT_KEY_STATUS_*: what GET_ENCRYPTION_KEY_STATUS reports.
#define COFFER_FSCRYPT_KEY_ABSENT 1
#define COFFER_FSCRYPT_KEY_PRESENT 2
#define COFFER_FSCRYPT_KEY_INCOMPLETELY_REMOVED 3
/// FSCRYPT_KEY_STATUS_FLAG_ADDED_BY_SELF.
#define COFFER_FSCRYPT_KEY_ADDED_BY_SELF 0x1
/// FSCRYPT_KEY_REMOVAL_STATUS_FLAG_FILES_BUSY / _OTHER_USERS.
#define COFFER_FSCRYPT_REMOVAL_FILES_BUSY 0x1
#define COFFER_FSCRYPT_REMOVAL_OTHER_USERS 0x2

/// FS_IOC_ADD_ENCRYPTION_KEY on `fd` (any file or directory of the filesystem): adds the raw key `key`
/// (`length` bytes, at most 64) by identifier; the kernel's identifier is written to `identifier`
/// (16 bytes). The argument (80 bytes plus the key) is built in a stack buffer here and wiped before
/// returning, whatever the outcome.
int coffer_fscrypt_add_key(int fd, const uint8_t *key, size_t length, uint8_t *identifier);

/// FS_IOC_REMOVE_ENCRYPTION_KEY for `identifier` (16 bytes): this user's claim on the key goes away.
/// `removal_flags` receives the kernel's removal status flags (COFFER_FSCRYPT_REMOVAL_*): FILES_BUSY
/// when files stayed open (the key is then incompletely removed; call again once they are closed).
int coffer_fscrypt_remove_key(int fd, const uint8_t *identifier, uint32_t *removal_flags);

/// FS_IOC_GET_ENCRYPTION_KEY_STATUS for `identifier`: `status` (COFFER_FSCRYPT_KEY_*), `flags`
/// (COFFER_FSCRYPT_KEY_ADDED_BY_SELF) and `user_count`.
int coffer_fscrypt_key_status(int fd, const uint8_t *identifier, uint32_t *status, uint32_t *flags, uint32_t *user_count);

/// FS_IOC_SET_ENCRYPTION_POLICY on the empty directory `fd` with the v2 policy Coffer uses:
/// AES-256-XTS contents, AES-256-CTS names, 32-byte name padding, key `identifier` (16 bytes).
int coffer_fscrypt_set_policy(int fd, const uint8_t *identifier);

/// FS_IOC_GET_ENCRYPTION_POLICY_EX on `fd`: `version` (1 or 2) and, for version 2, the key's
/// `identifier` (16 bytes; zeroed for version 1). -ENODATA: not encrypted; -EOPNOTSUPP: the filesystem
/// lacks the encrypt feature; -ENOTTY: the filesystem has no fscrypt at all.
int coffer_fscrypt_get_policy(int fd, uint8_t *version, uint8_t *identifier);

/// renameat2(AT_FDCWD, from, AT_FDCWD, to, RENAME_EXCHANGE): swaps two directory entries atomically.
int coffer_fscrypt_exchange(const char *from, const char *to);

/// renameat2(AT_FDCWD, from, AT_FDCWD, to, RENAME_NOREPLACE): -EEXIST when `to` exists.
int coffer_fscrypt_rename_noreplace(const char *from, const char *to);

#endif

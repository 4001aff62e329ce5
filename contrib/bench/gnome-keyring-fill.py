#!/usr/bin/python3
"""Write a gnome-keyring binary keyring file holding N generic secrets.

Why: filling gnome-keyring through its API is far too slow to benchmark it at
10,000 or 100,000 items: gnome-keyring-daemon rewrites (and re-encrypts) the
whole keyring file on every `secret-tool store`, so each store costs time
proportional to the items already there (a fraction of a second at 10,000
items, seconds at 100,000) and a 100,000-item fill takes days. This script
writes the file directly, in gnome-keyring's own format, with the content
`secret-tool store` would have left there; the real gnome-keyring-daemon then
loads, unlocks and serves it, and the benchmark times only the daemon.

Usage:
    printf '%s\n' "$PASSWORD" | gnome-keyring-fill.py OUTPUT_FILE N

The password is read from the first line of stdin (trailing newline removed).
Note that `gnome-keyring-daemon --unlock` instead takes all of stdin as the
password, newline included: feed it with printf '%s' "$PASSWORD".
OUTPUT_FILE is usually $XDG_DATA_HOME/keyrings/login.keyring (the file name
without ".keyring" is the collection id; gnome-keyring serves "login" as the
"default" alias when no keyrings/default file exists). It is written to a
temporary file in the same directory and renamed into place, mode 0600.

Items i = 1..N, each as `printf secret-$i | secret-tool store --label=l
service svc$((i % 97)) account acct$i` would create it: item id i, item type 0
(GNOME_KEYRING_ITEM_GENERIC_SECRET), label "l", attributes account=acct<i> and
service=svc<i % 97> (secret-tool's schema sets SECRET_SCHEMA_DONT_MATCH_NAME,
so libsecret adds no xdg:schema attribute), secret "secret-<i>", an empty ACL.

Format reference, gnome-keyring source (GNOME/gnome-keyring, 42.x):
  pkcs11/secret-store/gkm-secret-binary.c  gkm_secret_binary_write() and its
      helpers generate_hashed_items(), generate_encrypted_data(),
      generate_acl_data(), buffer_add_time(), encrypt_buffer(); read side in
      gkm_secret_binary_read()
  pkcs11/secret-store/gkm-secret-fields.c  compat_hash_value_as_string()
      (hashed attribute value = lowercase hex MD5 of the value),
      gkm_secret_fields_get_names() (attributes sorted by name)
  pkcs11/secret-store/gkm-secret-compat.c  gkm_secret_compat_parse_item_type()
  egg/egg-symkey.c   egg_symkey_generate_simple() (key and IV derivation)
  egg/egg-buffer.c   egg_buffer_add_uint32/_string/_byte_array() (encoding)
  pkcs11/secret-store/file-format.txt (overview; it says ctime comes before
      mtime, but gkm_secret_binary_write() writes the collection's mtime first
      and gkm_secret_binary_read() reads that field back as the ctime)

File layout (integers are big-endian uint32; a string or byte array is a
uint32 length then the bytes, NULL being length 0xffffffff; a time is two
uint32s, high half first):
  "GnomeKeyring\\n\\r\\0\\n", bytes 0 0 0 0 (major, minor, crypto AES, hash MD5)
  string keyring label, time mtime, time ctime, uint32 flags, uint32 lock
  timeout, uint32 hash iterations, 8 bytes salt, 4 x uint32 reserved
  uint32 item count, then per item: uint32 id, uint32 type, uint32 attribute
      count, per attribute: string name, uint32 0 (string), string MD5 hex
  uint32 length of the encrypted part, then the encrypted part: AES-128-CBC,
      key and IV from egg_symkey_generate_simple(SHA-256), no padding scheme;
      plaintext = MD5 of the rest, then per item: string label, byte array
      secret, time ctime, time mtime, NULL string, 4 x uint32 0, uint32
      attribute count, per attribute: string name, uint32 0, string value,
      uint32 ACL entry count (0); zero bytes up to a multiple of 16.
"""

import hashlib
import os
import struct
import sys
import tempfile
import time

from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

HEADER = b"GnomeKeyring\n\r\0\n" + bytes([0, 0, 0, 0])
# gnome-keyring labels the login collection it creates "Login" (the file name,
# not this label, gives the collection id "login").
KEYRING_LABEL = "Login"
# gkm_secret_binary_write() draws g_random_int_range (1000, 4096) per save.
HASH_ITERATIONS = 2000
ITEM_TYPE_GENERIC_SECRET = 0
ATTR_TYPE_STRING = 0

u32 = struct.Struct(">I").pack
NULL_STRING = u32(0xFFFFFFFF)


def string(data: bytes) -> bytes:
    return u32(len(data)) + data


def timestamp(t: int) -> bytes:
    return struct.pack(">II", t >> 32, t & 0xFFFFFFFF)


def derive_key_iv(password: bytes, salt: bytes, iterations: int):
    """egg_symkey_generate_simple() for AES-128 with SHA-256: one pass, since
    the 32-byte digest covers the 16-byte key followed by the 16-byte IV."""
    digest = hashlib.sha256(password + salt).digest()
    for _ in range(iterations - 1):
        digest = hashlib.sha256(digest).digest()
    return digest[:16], digest[16:32]


def item_attributes(i: int):
    """The item's attributes, sorted by name as gkm_secret_fields_get_names()."""
    return [(b"account", b"acct%d" % i), (b"service", b"svc%d" % (i % 97))]


def build_keyring(password: bytes, n: int, now: int, salt: bytes) -> bytes:
    hashed = [u32(n)]
    plain = [bytes(16)]  # room for the MD5 checksum
    item_times = timestamp(now) + timestamp(now)
    item_reserved = NULL_STRING + bytes(16)
    for i in range(1, n + 1):
        attrs = item_attributes(i)
        hashed.append(u32(i) + u32(ITEM_TYPE_GENERIC_SECRET) + u32(len(attrs)))
        plain.append(string(b"l") + string(b"secret-%d" % i) + item_times
                     + item_reserved + u32(len(attrs)))
        for name, value in attrs:
            hashed.append(string(name) + u32(ATTR_TYPE_STRING)
                          + string(hashlib.md5(value).hexdigest().encode()))
            plain.append(string(name) + u32(ATTR_TYPE_STRING) + string(value))
        plain.append(u32(0))  # ACL entries
    plain = b"".join(plain)
    plain += bytes(-len(plain) % 16)
    plain = hashlib.md5(plain[16:]).digest() + plain[16:]

    key, iv = derive_key_iv(password, salt, HASH_ITERATIONS)
    enc = Cipher(algorithms.AES(key), modes.CBC(iv)).encryptor()
    encrypted = enc.update(plain) + enc.finalize()

    head = (HEADER + string(KEYRING_LABEL.encode())
            + timestamp(now) + timestamp(now)  # mtime, ctime
            + u32(0) + u32(0)                  # flags, lock timeout: no auto-lock
            + u32(HASH_ITERATIONS) + salt + bytes(16))
    return head + b"".join(hashed) + u32(len(encrypted)) + encrypted


def write_atomically(path: str, data: bytes) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".gnome-keyring-fill-")
    try:
        with os.fdopen(fd, "wb") as f:  # mkstemp creates the file with mode 0600
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def main() -> int:
    try:
        path, n = sys.argv[1], int(sys.argv[2])
        if len(sys.argv) != 3 or n < 0:
            raise ValueError
    except (IndexError, ValueError):
        sys.stderr.write("usage: %s OUTPUT_FILE N   (password on stdin)\n" % sys.argv[0])
        return 2
    password = sys.stdin.buffer.readline()
    if password.endswith(b"\n"):
        password = password[:-1]
    if not password:
        # gnome-keyring stores a keyring with an empty password unencrypted,
        # in its textual format, so this binary format would be wrong for it.
        sys.stderr.write("%s: empty password on stdin\n" % sys.argv[0])
        return 2
    write_atomically(path, build_keyring(password, n, int(time.time()), os.urandom(8)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

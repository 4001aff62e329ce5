import CFscrypt
package import CofferCrypto
package import CofferModel
import Glibc

/// The kernel's fscrypt, one function per ioctl of the `CFscrypt` wall (every other module reaches
/// fscrypt through here). Every call opens the file it acts on itself and closes it; errors come back
/// as ``FileProtectionError``.
package enum Fscrypt {
    /// Bytes of a directory key: fscrypt's maximum (v2 policies need at least 32; AES-256-XTS uses 64).
    package static let keyBytes = 64
    /// Bytes of a key identifier.
    package static let identifierBytes = 16

    /// A directory's encryption policy (GET_ENCRYPTION_POLICY_EX).
    package enum Policy: Equatable, Sendable {
        /// Not encrypted.
        case none
        /// A v1 policy (another tool's; Coffer writes v2 only).
        case v1
        /// A v2 policy naming the key `identifier`.
        case v2(identifier: [UInt8])
    }

    /// What a key removal did.
    package struct Removal: Equatable, Sendable {
        /// Files are still open: the key is incompletely removed until they close and removal is asked again.
        package var filesBusy: Bool
        /// Another user also added this key: it stays present for them.
        package var otherUsers: Bool
    }

    /// Opens `path` for an ioctl: a directory (never following a final symbolic link), read-only.
    private static func open(_ path: String) throws(FileProtectionError) -> Int32 {
        while true {
            let fd = unsafe Glibc.open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
            if fd >= 0 { return fd }
            if errno == EINTR { continue }
            let e = errno
            switch e {
            case ENOENT: throw .notFound(path)
            case ELOOP: throw .symbolicLink(path)
            case ENOTDIR: throw .notADirectory(path)
            default: throw .system(operation: "open", path: path, errno: e)
            }
        }
    }

    /// Adds `key` to the filesystem holding the directory `path` (ADD_ENCRYPTION_KEY) and returns its
    /// identifier (the same key always has the same identifier).
    package static func addKey(_ key: SecureBytes, filesystemOf path: String) throws(FileProtectionError) -> [UInt8] {
        precondition(key.count == keyBytes)
        let fd = try open(path)
        defer { _ = Glibc.close(fd) }
        var identifier = [UInt8](repeating: 0, count: identifierBytes)
        let rc = unsafe key.withUnsafeBytes { k in
            unsafe coffer_fscrypt_add_key(fd, k.baseAddress!.assumingMemoryBound(to: UInt8.self), k.count, &identifier)
        }
        if rc != 0 { throw failure("add an encryption key", path, -rc) }
        return identifier
    }

    /// Removes this user's claim on the key `identifier` from the filesystem holding `path`
    /// (REMOVE_ENCRYPTION_KEY). A key already absent is no error (removal is idempotent).
    package static func removeKey(_ identifier: [UInt8], filesystemOf path: String) throws(FileProtectionError) -> Removal {
        precondition(identifier.count == identifierBytes)
        let fd = try open(path)
        defer { _ = Glibc.close(fd) }
        var flags: UInt32 = 0
        let rc = unsafe coffer_fscrypt_remove_key(fd, identifier, &flags)
        if rc == -ENOKEY { return Removal(filesBusy: false, otherUsers: false) }
        if rc != 0 { throw failure("remove an encryption key", path, -rc) }
        return Removal(filesBusy: flags & UInt32(COFFER_FSCRYPT_REMOVAL_FILES_BUSY) != 0,
                       otherUsers: flags & UInt32(COFFER_FSCRYPT_REMOVAL_OTHER_USERS) != 0)
    }

    /// Whether the filesystem holding `path` has the key `identifier` (GET_ENCRYPTION_KEY_STATUS).
    package static func keyState(_ identifier: [UInt8], filesystemOf path: String) throws(FileProtectionError) -> FileKeyState {
        precondition(identifier.count == identifierBytes)
        let fd = try open(path)
        defer { _ = Glibc.close(fd) }
        var status: UInt32 = 0, flags: UInt32 = 0, users: UInt32 = 0
        let rc = unsafe coffer_fscrypt_key_status(fd, identifier, &status, &flags, &users)
        if rc != 0 { throw failure("ask for an encryption key's status", path, -rc) }
        switch Int32(status) {
        case COFFER_FSCRYPT_KEY_ABSENT: return .absent
        case COFFER_FSCRYPT_KEY_PRESENT: return .present
        case COFFER_FSCRYPT_KEY_INCOMPLETELY_REMOVED: return .incompletelyRemoved
        default: return .unknown
        }
    }

    /// Sets Coffer's v2 policy with key `identifier` on the empty directory `path` (SET_ENCRYPTION_POLICY).
    package static func setPolicy(_ identifier: [UInt8], on path: String) throws(FileProtectionError) {
        precondition(identifier.count == identifierBytes)
        let fd = try open(path)
        defer { _ = Glibc.close(fd) }
        let rc = unsafe coffer_fscrypt_set_policy(fd, identifier)
        switch -rc {
        case 0: return
        case EEXIST: throw .alreadyProtected(path)
        default: throw failure("set an encryption policy", path, -rc)
        }
    }

    /// The encryption policy of the directory `path`.
    package static func policy(of path: String) throws(FileProtectionError) -> Policy {
        let fd = try open(path)
        defer { _ = Glibc.close(fd) }
        var version: UInt8 = 0
        var identifier = [UInt8](repeating: 0, count: identifierBytes)
        let rc = unsafe coffer_fscrypt_get_policy(fd, &version, &identifier)
        switch -rc {
        case 0: return version == 2 ? .v2(identifier: identifier) : .v1
        case ENODATA: return .none
        default: throw failure("read the encryption policy", path, -rc)
        }
    }

    /// Swaps the directory entries `a` and `b` in one step (renameat2 RENAME_EXCHANGE).
    package static func exchange(_ a: String, _ b: String) throws(FileProtectionError) {
        let rc = unsafe coffer_fscrypt_exchange(a, b)
        if rc != 0 { throw .system(operation: "exchange with \(b)", path: a, errno: -rc) }
    }

    /// Renames `from` to `to` unless `to` exists (renameat2 RENAME_NOREPLACE); false if it does.
    package static func renameWithoutReplacing(_ from: String, _ to: String) throws(FileProtectionError) -> Bool {
        let rc = unsafe coffer_fscrypt_rename_noreplace(from, to)
        if rc == -EEXIST { return false }
        if rc != 0 { throw .system(operation: "rename into", path: to, errno: -rc) }
        return true
    }

    /// Maps an ioctl's errno to the reason people can act on.
    private static func failure(_ operation: String, _ path: String, _ e: Int32) -> FileProtectionError {
        switch e {
        case EOPNOTSUPP:
            let fs = Filesystems.describe(path)
            if fs.type == "ext4" && !Filesystems.kernelHasExt4Encryption { return .noKernelSupport(path) }
            return .featureMissing(path, filesystem: fs.type, device: fs.device)
        case ENOTTY: return .otherFilesystem(path, type: Filesystems.describe(path).type)
        default: return .system(operation: operation, path: path, errno: e)
        }
    }
}

package import CofferModel

/// Why a directory cannot be protected (or a protected directory cannot be used), with a stable
/// number each (``code``; never renumbered, FileProtectionFormat.md "Errors") and a message that names
/// the reason and, where one exists, the fix.
package enum FileProtectionError: Error, Sendable, Equatable, CustomStringConvertible {
    /// 1: nothing at the path.
    case notFound(String)
    /// 2: the path is not a directory.
    case notADirectory(String)
    /// 3: the path is a symbolic link (never followed: protect the directory it names instead).
    case symbolicLink(String)
    /// 4: the directory belongs to another user.
    case notOwner(String, owner: UInt32)
    /// 5: the directory is on a filesystem without fscrypt (tmpfs, btrfs, xfs, NFS, …).
    case otherFilesystem(String, type: String)
    /// 6: an ext4 or f2fs filesystem whose `encrypt` feature is off; `device` is what to enable it on.
    case featureMissing(String, filesystem: String, device: String)
    /// 7: the running kernel has no fscrypt for this filesystem.
    case noKernelSupport(String)
    /// 8: the directory is inside an encrypted directory (fscrypt policies are inherited).
    case nested(String, inside: String)
    /// 9: the directory is already encrypted (by Coffer or by another fscrypt tool).
    case alreadyProtected(String)
    /// 10: the directory holds something a migration cannot copy (a device, a FIFO, a socket).
    case cannotCopy(String, what: String)
    /// 11: a migration needs more free space than the filesystem has.
    case noSpace(String, needed: UInt64, available: UInt64)
    /// 12: a system call failed.
    case system(operation: String, path: String, errno: Int32)
    /// 13: the directory is not one Coffer protects.
    case notProtected(String)
    /// 14: the class key that wraps this directory's key is not available (the keychain is locked).
    case classLocked(String)
    /// 15: a file written while locked into a directory that is not CompleteUnlessOpen.
    case notCompleteUnlessOpen(String, FileProtection)
    /// 16: a file name with a `/` or a NUL, `.`, `..`, empty or longer than 255 bytes.
    case badFileName(String)

    /// The stable number of this error.
    package var code: Int {
        switch self {
        case .notFound: 1
        case .notADirectory: 2
        case .symbolicLink: 3
        case .notOwner: 4
        case .otherFilesystem: 5
        case .featureMissing: 6
        case .noKernelSupport: 7
        case .nested: 8
        case .alreadyProtected: 9
        case .cannotCopy: 10
        case .noSpace: 11
        case .system: 12
        case .notProtected: 13
        case .classLocked: 14
        case .notCompleteUnlessOpen: 15
        case .badFileName: 16
        }
    }

    package var description: String {
        switch self {
        case .notFound(let p): "\(p) does not exist"
        case .notADirectory(let p): "\(p) is not a directory"
        case .symbolicLink(let p): "\(p) is a symbolic link: protect the directory it points to, by its own path"
        case .notOwner(let p, let owner): "\(p) belongs to uid \(owner), not to you: only your own directories can be protected"
        case .otherFilesystem(let p, let type):
            "\(p) is on a \(type) filesystem, which has no fscrypt: protected directories need ext4 or f2fs with the encrypt feature"
        case .featureMissing(let p, let fs, let device):
            fs == "f2fs"
                ? "\(p) is on an f2fs filesystem without the encrypt feature: as root, once, with it unmounted: fsck.f2fs -O encrypt \(device)"
                : "\(p) is on an ext4 filesystem without the encrypt feature: as root, once: tune2fs -O encrypt \(device) "
                    + "(works mounted; the filesystem then needs Linux 4.1 or later and e2fsprogs 1.43 or later, and GRUB older than 2.04 cannot boot from it)"
        case .noKernelSupport(let p): "\(p): this kernel has no fscrypt support for its filesystem (CONFIG_FS_ENCRYPTION)"
        case .nested(let p, let inside): "\(p) is inside the encrypted directory \(inside): protect that one, or a directory outside it"
        case .alreadyProtected(let p): "\(p) is already an encrypted directory"
        case .cannotCopy(let p, let what): "\(p) holds \(what), which cannot be moved into a protected directory"
        case .noSpace(let p, let needed, let available):
            "protecting \(p) copies it first: that needs \(needed / 1024) KiB and the filesystem has \(available / 1024) KiB free; nothing was changed"
        case .system(let op, let p, let e): unsafe "\(op) \(p): \(String(cString: strerror(e)))"
        case .notProtected(let p): "\(p) is not a protected directory"
        case .classLocked(let p): "the keychain is locked: unlock it to protect or open \(p)"
        case .notCompleteUnlessOpen(let p, let c):
            "\(p) is a \(c.cliName) directory: only a complete-unless-open directory takes files while locked"
        case .badFileName(let n): "\(n) is not a file name (1 to 255 bytes, no slash, no NUL, not . or ..)"
        }
    }

    /// The status a caller gets on the wire.
    package var status: SecStatus {
        switch self {
        case .notFound, .notProtected: .itemNotFound
        case .notADirectory, .symbolicLink, .nested, .cannotCopy, .notCompleteUnlessOpen, .badFileName: .param
        case .notOwner: .missingEntitlement
        case .otherFilesystem, .featureMissing, .noKernelSupport, .noSpace: .notAvailable
        case .alreadyProtected: .duplicateItem
        case .system: .io
        case .classLocked: .interactionNotAllowed
        }
    }

    /// This error as a ``SecError`` (the message ends with the stable number).
    package var secError: SecError { SecError(status, "\(description) [files error \(code)]") }
}

import Glibc

package import CofferSystem

/// Filesystems whose file contents another process serves, so that hashing an executable there
/// proves nothing about what runs: a FUSE server (any user may mount one, through the setuid
/// `fusermount3`) sees which process reads and can answer the agent's read with a signed program's
/// bytes and the kernel's exec with its own, or change them between the two, and it reports the
/// timestamps the hash cache keys by. An executable on one is unsigned, whatever its hash
/// (`CallerIdentity.UnsignedReason.untrustedFilesystem`; the agent logs the reason).
///
/// What stays out of reach of this check is in the threat model: an overlay or bind mount in the
/// caller's own mount namespace over a FUSE lower layer reports the overlay's type.
package enum UntrustedFilesystem {
    /// `FUSE_SUPER_MAGIC` (linux/magic.h): every FUSE filesystem, `fuseblk` included.
    package static let fuseMagic: Int = 0x6573_5546

    /// The name of the untrusted filesystem type `type` (an `f_type`), nil if it is not one.
    package static func kind(ofType type: Int) -> String? {
        type == fuseMagic ? "FUSE" : nil
    }

    /// The untrusted filesystem the open file `fd` is on, nil if it is not on one. A failing
    /// `fstatfs` counts as untrusted: what cannot be told is not vouched for.
    package static func kind(ofOpenFile file: borrowing FileDescriptor) -> String? {
        guard let type = try? file.filesystemType() else { return "unknown (fstatfs failed)" }
        return kind(ofType: type)
    }
}

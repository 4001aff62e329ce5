package import CofferCrypto
import Glibc

/// Making a directory a protected one on disk: the checks that refuse what cannot be protected
/// (before anything changes), the policy set in place on an empty directory, and the crash-safe
/// migration of a non-empty one (FileProtectionFormat.md, "Protecting a directory").
package enum ProtectedDirectories {
    /// A directory that passed every check of ``check(_:uid:)``.
    package struct Candidate: Sendable {
        /// Its absolute path.
        package let path: String
        /// The directory holding it (same filesystem, not encrypted).
        package let parent: String
        /// True if it has no entries (protected in place; otherwise migrated).
        package let isEmpty: Bool
        /// Bytes its regular files take (what a migration copies).
        package let bytes: UInt64
    }

    /// The name of the staging directory a migration of `path` fills before the swap (beside it, so on
    /// the same filesystem; a leftover one is the migration's own, removed when it is seen again).
    package static func stagingPath(of path: String) -> String {
        let parent = Filesystems.parent(of: path)
        let base = path.split(separator: "/").last.map(String.init) ?? "dir"
        return (parent == "/" ? "" : parent) + "/." + base + ".coffer-protect"
    }

    /// Checks that `path` (absolute, normalized) can become a protected directory of user `uid`:
    /// a directory, not a symbolic link, owned by `uid`, on a filesystem with fscrypt and its encrypt
    /// feature, not encrypted itself, not inside an encrypted directory, holding only regular files,
    /// directories and symbolic links. Changes nothing.
    package static func check(_ path: String, uid: UInt32) throws(FileProtectionError) -> Candidate {
        guard path.hasPrefix("/"), !path.split(separator: "/").contains(where: { $0 == "." || $0 == ".." }) else {
            throw .notFound(path)
        }
        var st = stat()
        if unsafe lstat(path, &st) != 0 {
            throw errno == ENOENT ? .notFound(path) : .system(operation: "lstat", path: path, errno: errno)
        }
        if st.st_mode & S_IFMT == S_IFLNK { throw .symbolicLink(path) }
        guard st.st_mode & S_IFMT == S_IFDIR else { throw .notADirectory(path) }
        guard st.st_uid == uid else { throw .notOwner(path, owner: st.st_uid) }
        let parent = Filesystems.parent(of: path)
        // The directory's own policy first: ENOTTY/EOPNOTSUPP name the filesystem's reason.
        let own = try Fscrypt.policy(of: path)
        // Inside an encrypted directory every directory has the (inherited) policy: name the outer one.
        if let outer = try encryptedAncestor(of: path) { throw .nested(path, inside: outer) }
        guard own == .none else { throw .alreadyProtected(path) }
        var parentStatus = stat()
        guard unsafe stat(parent, &parentStatus) == 0 else { throw .system(operation: "stat", path: parent, errno: errno) }
        guard parentStatus.st_dev == st.st_dev else {
            throw .cannotCopy(path, what: "a mount point (it is the root of its filesystem; protect a directory inside it)")
        }
        var bytes: UInt64 = 0, entries = 0
        try measure(path, device: st.st_dev, bytes: &bytes, entries: &entries)
        return Candidate(path: path, parent: parent, isEmpty: entries == 0, bytes: bytes)
    }

    /// The outermost encrypted directory above `path`, nil if none is.
    static func encryptedAncestor(of path: String) throws(FileProtectionError) -> String? {
        var found: String? = nil
        var p = Filesystems.parent(of: path)
        while true {
            let policy: Fscrypt.Policy
            do {
                policy = try Fscrypt.policy(of: p)
            } catch {
                break   // another filesystem above (or unreadable): no fscrypt policy is inherited across it
            }
            if policy == .none { break }
            found = p
            if p == "/" { break }
            p = Filesystems.parent(of: p)
        }
        return found
    }

    /// Walks the tree under `path`: the bytes of its regular files and the number of entries; refuses
    /// what a copy cannot carry (devices, FIFOs, sockets, other mounts).
    private static func measure(_ path: String, device: dev_t, bytes: inout UInt64, entries: inout Int) throws(FileProtectionError) {
        guard let d = unsafe opendir(path) else { throw .system(operation: "opendir", path: path, errno: errno) }
        defer { unsafe closedir(d) }
        while let e = unsafe readdir(d) {
            let name = unsafe withUnsafeBytes(of: e.pointee.d_name) { raw in
                unsafe String(decoding: raw.prefix(while: { $0 != 0 }), as: UTF8.self)
            }
            if name == "." || name == ".." { continue }
            entries += 1
            let child = path + "/" + name
            var st = stat()
            guard unsafe lstat(child, &st) == 0 else { throw .system(operation: "lstat", path: child, errno: errno) }
            switch st.st_mode & S_IFMT {
            case S_IFREG: bytes += UInt64(st.st_size)
            case S_IFLNK: break
            case S_IFDIR:
                guard st.st_dev == device else { throw .cannotCopy(child, what: "another filesystem mounted on it") }
                try measure(child, device: device, bytes: &bytes, entries: &entries)
            default: throw .cannotCopy(child, what: "a device, FIFO or socket")
            }
        }
    }

    /// Makes the checked `candidate` an encrypted directory with the key `identifier` (already added to
    /// its filesystem). Empty: the policy is set in place. Otherwise a migration: the staging directory
    /// beside it gets the policy, the tree is copied into it and synced, the two are swapped by one
    /// renameat2(RENAME_EXCHANGE), and the old copy is removed (FileProtectionFormat.md). A failure
    /// before the swap leaves the directory as it was and removes the staging copy.
    package static func protect(_ candidate: Candidate, identifier: [UInt8]) throws(FileProtectionError) {
        let path = candidate.path
        if candidate.isEmpty {
            try Fscrypt.setPolicy(identifier, on: path)
            return
        }
        let staging = stagingPath(of: path)
        try removeTree(staging)
        var fs = statvfs()
        guard unsafe statvfs(candidate.parent, &fs) == 0 else { throw .system(operation: "statvfs", path: candidate.parent, errno: errno) }
        let available = UInt64(fs.f_bavail) * UInt64(fs.f_frsize)
        // The copy, its metadata and the ciphertext names' padding: a margin of 1/16 plus 1 MiB.
        let needed = candidate.bytes + candidate.bytes / 16 + (1 << 20)
        guard needed <= available else { throw .noSpace(path, needed: needed, available: available) }
        var st = stat()
        guard unsafe lstat(path, &st) == 0 else { throw .system(operation: "lstat", path: path, errno: errno) }
        guard unsafe mkdir(staging, 0o700) == 0 else { throw .system(operation: "mkdir", path: staging, errno: errno) }
        do {
            try Fscrypt.setPolicy(identifier, on: staging)
            try copyTree(from: path, to: staging)
            try copyMetadata(st, to: staging)
            try sync(staging)
            CrashPoints.hit("files-migrate-before-swap")
        } catch {
            try? removeTree(staging)
            throw error
        }
        try Fscrypt.exchange(staging, path)
        try sync(candidate.parent)
        CrashPoints.hit("files-migrate-after-swap")
        try finishMigration(of: path)
    }

    /// Removes the old (plain) copy a migration of `path` left beside it once `path` is the encrypted
    /// one; nothing when there is none. Called after every swap and for every protected directory when
    /// the agent starts (a crash between the swap and the removal).
    package static func finishMigration(of path: String) throws(FileProtectionError) {
        let staging = stagingPath(of: path)
        var st = stat()
        guard unsafe lstat(staging, &st) == 0 else { return }
        try removeTree(staging)
        try sync(Filesystems.parent(of: path))
    }

    /// Removes a leftover staging directory of an interrupted migration that never swapped (the
    /// original directory is still the plain one).
    package static func discardStaging(of path: String) throws(FileProtectionError) {
        try removeTree(stagingPath(of: path))
    }

    /// True if `name` may be the name of a file written into a protected directory: 1 to 255 bytes,
    /// no `/`, no NUL, not `.` or `..`.
    package static func isFileName(_ name: String) -> Bool {
        let b = Array(name.utf8)
        return !b.isEmpty && b.count <= 255 && !b.contains(0) && !b.contains(UInt8(ascii: "/")) && name != "." && name != ".."
    }

    /// Writes `data` as the file `name` of the (unlocked) protected directory `directory`: into a
    /// temporary name first, fsynced, then renamed to `name` without replacing anything (renameat2
    /// RENAME_NOREPLACE), and the directory fsynced. When `name` exists: nothing is written if it holds
    /// exactly `data` (a delivery a crash interrupted after its rename), else the file goes to
    /// `name (N)` with the first free N. Returns the name written (or found).
    @discardableResult
    package static func deliver(_ data: SecureBytes, name: String, into directory: String, tag: Int64) throws(FileProtectionError) -> String {
        try deliver(parts: 1, { (_: Int) throws(FileProtectionError) -> SecureBytes in data.slice(0..<data.count) }, name: name, into: directory, tag: tag)
    }

    /// ``deliver(_:name:into:tag:)`` for a file given in `parts` pieces, each `part(i)` asked for in order
    /// (and wiped once written), so a large file is never in memory whole.
    @discardableResult
    package static func deliver(parts: Int, _ part: (Int) throws(FileProtectionError) -> SecureBytes, name: String, into directory: String,
                                tag: Int64) throws(FileProtectionError) -> String {
        guard isFileName(name) else { throw .badFileName(name) }
        let target = directory + "/" + name
        if try holds(target, parts: parts, part) { return name }
        let temporary = directory + "/.\(tag).coffer-drop"
        let fd = unsafe open(temporary, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw .system(operation: "create", path: temporary, errno: errno) }
        for i in 0..<parts {
            let data: SecureBytes
            do { data = try part(i) } catch { _ = close(fd); _ = unsafe unlink(temporary); throw error }
            defer { data.wipe() }
            var done = 0
            while done < data.count {
                let w = unsafe data.withUnsafeBytes { unsafe write(fd, $0.baseAddress! + done, data.count - done) }
                if w < 0 && errno == EINTR { continue }
                guard w > 0 else { let e = errno; _ = close(fd); _ = unsafe unlink(temporary); throw .system(operation: "write", path: temporary, errno: w < 0 ? e : ENOSPC) }
                done += w
            }
        }
        guard fsync(fd) == 0 else { let e = errno; _ = close(fd); _ = unsafe unlink(temporary); throw .system(operation: "fsync", path: temporary, errno: e) }
        _ = close(fd)
        var final = name
        var n = 0
        while !(try Fscrypt.renameWithoutReplacing(temporary, directory + "/" + final)) {
            n += 1
            guard n < 1000 else { throw .system(operation: "rename into", path: target, errno: EEXIST) }
            final = "\(name) (\(n))"
        }
        try sync(directory)
        return final
    }

    /// True if the file at `path` holds exactly the bytes of the `parts` pieces (a delivery a crash
    /// interrupted after its rename); false when it is absent or differs.
    private static func holds(_ path: String, parts: Int, _ part: (Int) throws(FileProtectionError) -> SecureBytes) throws(FileProtectionError) -> Bool {
        // Non-blocking, and only a regular file: a FIFO or device put at the name must not hold the delivery.
        let fd = unsafe open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK)
        guard fd >= 0 else { return false }
        defer { _ = close(fd) }
        var st = stat()
        guard unsafe fstat(fd, &st) == 0, st.st_mode & S_IFMT == S_IFREG else { return false }
        var buffer = [UInt8](repeating: 0, count: 65536)
        defer { secureZero(&buffer) }
        for i in 0..<parts {
            let data = try part(i)
            defer { data.wipe() }
            var compared = 0
            while compared < data.count {
                let want = min(buffer.count, data.count - compared)
                let r = unsafe buffer.withUnsafeMutableBytes { unsafe read(fd, $0.baseAddress, want) }
                if r < 0 && errno == EINTR { continue }
                guard r > 0 else { return false }
                let same = unsafe data.withUnsafeBytes { d in unsafe buffer.withUnsafeBytes { b in unsafe memcmp(d.baseAddress! + compared, b.baseAddress!, r) == 0 } }
                guard same else { return false }
                compared += r
            }
        }
        var one: UInt8 = 0
        return unsafe read(fd, &one, 1) == 0
    }

    // MARK: Copying

    private static func copyTree(from source: String, to destination: String) throws(FileProtectionError) {
        guard let d = unsafe opendir(source) else { throw .system(operation: "opendir", path: source, errno: errno) }
        defer { unsafe closedir(d) }
        var names: [String] = []
        while let e = unsafe readdir(d) {
            let name = unsafe withUnsafeBytes(of: e.pointee.d_name) { raw in
                unsafe String(decoding: raw.prefix(while: { $0 != 0 }), as: UTF8.self)
            }
            if name != "." && name != ".." { names.append(name) }
        }
        for name in names {
            let from = source + "/" + name, to = destination + "/" + name
            var st = stat()
            guard unsafe lstat(from, &st) == 0 else { throw .system(operation: "lstat", path: from, errno: errno) }
            switch st.st_mode & S_IFMT {
            case S_IFDIR:
                guard unsafe mkdir(to, 0o700) == 0 else { throw .system(operation: "mkdir", path: to, errno: errno) }
                try copyTree(from: from, to: to)
                try copyMetadata(st, to: to)
                try sync(to)
            case S_IFLNK:
                var buffer = [CChar](repeating: 0, count: Int(PATH_MAX) + 1)
                let n = unsafe readlink(from, &buffer, buffer.count - 1)
                guard n >= 0 else { throw .system(operation: "readlink", path: from, errno: errno) }
                guard unsafe symlink(buffer, to) == 0 else { throw .system(operation: "symlink", path: to, errno: errno) }
            case S_IFREG:
                try copyFile(from, to, st)
            default:
                throw .cannotCopy(from, what: "a device, FIFO or socket")
            }
        }
    }

    private static func copyFile(_ from: String, _ to: String, _ st: stat) throws(FileProtectionError) {
        let input = unsafe open(from, O_RDONLY | O_NOFOLLOW | O_CLOEXEC)
        guard input >= 0 else { throw .system(operation: "open", path: from, errno: errno) }
        defer { _ = close(input) }
        let output = unsafe open(to, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0o600)
        guard output >= 0 else { throw .system(operation: "create", path: to, errno: errno) }
        defer { _ = close(output) }
        var buffer = [UInt8](repeating: 0, count: 1 << 20)
        while true {
            let n = unsafe buffer.withUnsafeMutableBytes { unsafe read(input, $0.baseAddress, $0.count) }
            if n < 0 && errno == EINTR { continue }
            guard n >= 0 else { throw .system(operation: "read", path: from, errno: errno) }
            if n == 0 { break }
            var done = 0
            while done < n {
                let w = unsafe buffer.withUnsafeBytes { unsafe write(output, $0.baseAddress! + done, n - done) }
                if w < 0 && errno == EINTR { continue }
                guard w > 0 else { throw .system(operation: "write", path: to, errno: w < 0 ? errno : ENOSPC) }
                done += w
            }
        }
        guard fchmod(output, st.st_mode & 0o7777) == 0 else { throw .system(operation: "chmod", path: to, errno: errno) }
        var times = [st.st_atim, st.st_mtim]
        _ = unsafe futimens(output, &times)
        guard fsync(output) == 0 else { throw .system(operation: "fsync", path: to, errno: errno) }
    }

    private static func copyMetadata(_ st: stat, to path: String) throws(FileProtectionError) {
        guard unsafe chmod(path, st.st_mode & 0o7777) == 0 else { throw .system(operation: "chmod", path: path, errno: errno) }
        var times = [st.st_atim, st.st_mtim]
        _ = unsafe utimensat(AT_FDCWD, path, &times, AT_SYMLINK_NOFOLLOW)
    }

    private static func sync(_ directory: String) throws(FileProtectionError) {
        let fd = unsafe open(directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard fd >= 0 else { throw .system(operation: "open", path: directory, errno: errno) }
        defer { _ = close(fd) }
        guard fsync(fd) == 0 else { throw .system(operation: "fsync", path: directory, errno: errno) }
    }

    /// Removes `path` and everything under it, never following a symbolic link; missing is no error.
    private static func removeTree(_ path: String) throws(FileProtectionError) {
        var st = stat()
        if unsafe lstat(path, &st) != 0 {
            if errno == ENOENT { return }
            throw .system(operation: "lstat", path: path, errno: errno)
        }
        guard st.st_mode & S_IFMT == S_IFDIR else {
            guard unsafe unlink(path) == 0 else { throw .system(operation: "unlink", path: path, errno: errno) }
            return
        }
        var names: [String] = []
        if let d = unsafe opendir(path) {
            while let e = unsafe readdir(d) {
                let name = unsafe withUnsafeBytes(of: e.pointee.d_name) { raw in
                    unsafe String(decoding: raw.prefix(while: { $0 != 0 }), as: UTF8.self)
                }
                if name != "." && name != ".." { names.append(name) }
            }
            unsafe closedir(d)
        }
        for name in names { try removeTree(path + "/" + name) }
        guard unsafe rmdir(path) == 0 else { throw .system(operation: "rmdir", path: path, errno: errno) }
    }
}

/// Test-only crash points (debug builds), as the keybag's: `COFFER_TEST_CRASH_POINT=name` makes the
/// process `_exit(99)` when it reaches the point of that name.
package enum CrashPoints {
    /// Exits the process if `name` is the configured crash point (debug builds only).
    package static func hit(_ name: String) {
        #if DEBUG
        guard let v = unsafe getenv("COFFER_TEST_CRASH_POINT"), unsafe String(cString: v) == name else { return }
        _exit(99)
        #endif
    }
}

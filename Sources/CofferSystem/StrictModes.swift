package import Glibc

/// The ownership and permission rules for trust roots, as OpenSSH's `StrictModes` applies them to
/// `authorized_keys`: a key or manifest file, and the directory holding it, must be owned by root or
/// by the user the agent runs as (by root alone where the trust module's `TrustDirectory.requireRootOwner`
/// says so) and must not be writable by group or others. Whoever could write there could add a key or
/// a manifest. The plugin host applies the same rules to plugin directories and plugins, which is why
/// they live here, below both.
///
/// Every check is on a descriptor (`fstat` of what was opened with `O_NOFOLLOW`), never a path checked
/// and then opened. The directory's ancestors are checked by path (`stat`), as sshd does; a
/// root-owned ancestor with the sticky bit (`/tmp`) passes, because only an entry's owner may rename
/// or remove it there.
package enum StrictModes {
    /// Why a file or directory with this `fstat` may not be trusted, or nil if it may.
    /// `what` names it in the reason ("file", "directory").
    package static func problem(_ st: stat, what: String, requireRoot: Bool, me: uid_t = geteuid()) -> String? {
        let owner = st.st_uid
        if requireRoot && owner != 0 {
            return "\(what) is owned by uid \(owner), not by root"
        }
        if owner != 0 && owner != me {
            return "\(what) is owned by uid \(owner), neither root nor you (uid \(me))"
        }
        let bits = st.st_mode & 0o7777
        if bits & 0o022 != 0 {
            let who = bits & 0o002 != 0 ? "world" : "group"
            return "\(what) is \(who)-writable (mode \(Files.octal(bits)))"
        }
        return nil
    }

    /// The problem with the ancestors of the directory at `path` (absolute), checked with `stat` from
    /// `/` down, or nil. An ancestor must be owned by root or `me` and not writable by group or others,
    /// unless it is root-owned and sticky (`/tmp`).
    package static func ancestorProblem(of path: String, requireRoot: Bool, me: uid_t = geteuid()) -> String? {
        guard path.hasPrefix("/") else { return "directory path is not absolute" }
        var parts = path.split(separator: "/").map(String.init)
        guard !parts.isEmpty else { return nil }
        parts.removeLast()
        var prefix = ""
        var chain = ["/"]
        for p in parts { prefix += "/" + p; chain.append(prefix) }
        for dir in chain {
            var st = stat()
            guard unsafe stat(dir, &st) == 0 else { return "ancestor directory \(dir) cannot be examined (errno \(errno))" }
            let bits = st.st_mode & 0o7777
            if st.st_uid == 0 && bits & 0o1000 != 0 { continue }
            if let p = problem(st, what: "ancestor directory \(dir)", requireRoot: requireRoot, me: me) { return p }
        }
        return nil
    }
}

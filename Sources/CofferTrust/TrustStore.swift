package import CofferManifest
import CofferSystem
import Glibc

/// A directory of trusted keys (`*.pub`) or manifests (`*.manifest`).
package struct TrustDirectory: Sendable, Equatable, Hashable {
    /// Absolute path.
    package var path: String
    /// True for system directories (`/etc/coffer/…`): the directory, its ancestors and every file
    /// in it must be owned by root. Otherwise root or the user the agent runs as.
    package var requireRootOwner: Bool

    package init(_ path: String, requireRootOwner: Bool = false) {
        self.path = path
        self.requireRootOwner = requireRootOwner
    }
}

/// Where the trust store looks. ``standard(allowUserKeys:extraKeyDirectories:extraManifestDirectories:environment:)``
/// gives the documented places; tests and `coffer manifest list --no-default-dirs` give their own.
package struct TrustConfiguration: Sendable, Equatable {
    /// Trusted signer keys of the administrator (root-owned).
    package static let systemKeyDirectory = "/etc/coffer/trusted-keys.d"
    /// Manifests installed by the administrator or packages (root-owned).
    package static let systemManifestDirectory = "/etc/coffer/manifests.d"
    /// Suffix of a trusted key file.
    package static let keySuffix = ".pub"
    /// Suffix of a manifest file.
    package static let manifestSuffix = ".manifest"

    package var keyDirectories: [TrustDirectory]
    package var manifestDirectories: [TrustDirectory]

    package init(keyDirectories: [TrustDirectory], manifestDirectories: [TrustDirectory]) {
        self.keyDirectories = keyDirectories
        self.manifestDirectories = manifestDirectories
    }

    /// The documented places: keys in `/etc/coffer/trusted-keys.d` (root-owned) and, only if
    /// `allowUserKeys`, `$XDG_CONFIG_HOME/coffer/trusted-keys.d`; manifests in
    /// `/etc/coffer/manifests.d` (root-owned) and `$XDG_DATA_HOME/coffer/manifests.d`; then the
    /// extra directories (root or the user may own them).
    package static func standard(allowUserKeys: Bool = false, extraKeyDirectories: [String] = [],
                                extraManifestDirectories: [String] = [],
                                environment: (String) -> String? = TrustConfiguration.processEnvironment) -> TrustConfiguration {
        let home = environment("HOME") ?? "/"
        func xdg(_ name: String, _ fallback: String) -> String {
            if let v = environment(name), v.hasPrefix("/") { return v }
            return (home.hasSuffix("/") ? String(home.dropLast()) : home) + fallback
        }
        var keys = [TrustDirectory(systemKeyDirectory, requireRootOwner: true)]
        if allowUserKeys { keys.append(TrustDirectory(xdg("XDG_CONFIG_HOME", "/.config") + "/coffer/trusted-keys.d")) }
        keys += extraKeyDirectories.map { TrustDirectory($0) }
        var manifests = [TrustDirectory(systemManifestDirectory, requireRootOwner: true),
                         TrustDirectory(xdg("XDG_DATA_HOME", "/.local/share") + "/coffer/manifests.d")]
        manifests += extraManifestDirectories.map { TrustDirectory($0) }
        return TrustConfiguration(keyDirectories: keys, manifestDirectories: manifests)
    }

    /// `getenv`, for ``standard(allowUserKeys:extraKeyDirectories:extraManifestDirectories:environment:)``.
    package static func processEnvironment(_ name: String) -> String? {
        guard let v = getenv(name) else { return nil }
        return String(cString: v)
    }
}

/// A file or directory the trust store did not believe, and why (a line for the log and for
/// `coffer manifest list`; names a path, an owner, a mode or a manifest line — never key material).
package struct RefusedFile: Sendable, Equatable, CustomStringConvertible {
    package let path: String
    package let reason: String
    package init(path: String, reason: String) {
        self.path = path
        self.reason = reason
    }
    package var description: String { "\(path): \(reason)" }
}

/// A trusted key and the file it came from.
package struct TrustedKey: Sendable, Equatable {
    package let key: SignerKey
    package let path: String
}

/// A manifest that parsed and verified against a trusted key, and the file it came from.
package struct AcceptedManifest: Sendable, Equatable {
    package let manifest: Manifest
    package let path: String
    /// The file the trusting key came from.
    package let keyPath: String
}

/// One load of the trust roots: what is believed and what was refused.
package struct TrustSnapshot: Sendable {
    package let keys: [TrustedKey]
    package let manifests: [AcceptedManifest]
    package let refused: [RefusedFile]
    /// Accepted manifests by `executable` (a path can have several: different versions of the file,
    /// told apart by their pinned SHA-256), in load order.
    package let byExecutable: [String: [Manifest]]

    package var trustedKeys: Set<SignerKey> { Set(keys.map(\.key)) }

    /// Reads every key directory, then every manifest directory, in configuration order, and keeps
    /// what passes: ``StrictModes`` for every directory and file, the format for keys, the canonical
    /// parser and a signature by a trusted key for manifests. A directory that does not exist is
    /// skipped silently; everything else refused is listed with its reason.
    package static func load(_ configuration: TrustConfiguration) -> TrustSnapshot {
        var refused: [RefusedFile] = []
        var keys: [TrustedKey] = []
        for dir in configuration.keyDirectories {
            TrustFiles.forEachFile(in: dir, suffix: TrustConfiguration.keySuffix, maximumBytes: KeyFile.maximumBytes,
                                   refused: &refused) { path, bytes in
                switch KeyFile.parsePublicKeys(bytes) {
                case .success(let ks):
                    for k in ks where !keys.contains(where: { $0.key == k }) { keys.append(TrustedKey(key: k, path: path)) }
                    return nil
                case .failure(let reason):
                    return reason.description
                }
            }
        }
        let trusted = Set(keys.map(\.key))
        var accepted: [AcceptedManifest] = []
        var index: [String: [Manifest]] = [:]
        for dir in configuration.manifestDirectories {
            TrustFiles.forEachFile(in: dir, suffix: TrustConfiguration.manifestSuffix, maximumBytes: Manifest.maximumBytes,
                                   refused: &refused) { path, bytes in
                let m: Manifest
                do throws(ManifestError) {
                    m = try Manifest.parse(bytes)
                    try m.verify(trusting: trusted)
                } catch {
                    return error.description
                }
                if let earlier = accepted.first(where: {
                    $0.manifest.executable.utf8.elementsEqual(m.executable.utf8) && $0.manifest.executableSHA256 == m.executableSHA256
                }) {
                    return "another manifest (\(earlier.path)) already pins this executable and SHA-256; the first one loaded counts"
                }
                let keyPath = keys.first(where: { $0.key == m.signer })?.path ?? ""
                accepted.append(AcceptedManifest(manifest: m, path: path, keyPath: keyPath))
                index[m.executable, default: []].append(m)
                return nil
            }
        }
        return TrustSnapshot(keys: keys, manifests: accepted, refused: refused, byExecutable: index)
    }
}

/// The trust roots the agent believes, reloadable without a restart: call ``reload()`` on SIGHUP
/// (or from a change watcher). Readers always see one complete snapshot, never a half-loaded one.
package final class TrustStore: Sendable {
    package let configuration: TrustConfiguration
    private let current: Protected<TrustSnapshot>
    private let reloads = Protected<UInt64>(0)

    /// How many times the roots were reloaded: identities established under an earlier count are
    /// established again (a reload may add, replace or withdraw a manifest).
    package var generation: UInt64 { reloads.withLock { $0 } }

    /// Loads the trust roots once.
    package init(configuration: TrustConfiguration) {
        self.configuration = configuration
        current = Protected(TrustSnapshot.load(configuration))
    }

    /// Re-reads every key and manifest and swaps the result in; returns it (log its `refused`).
    @discardableResult
    package func reload() -> TrustSnapshot {
        let fresh = TrustSnapshot.load(configuration)
        current.withLock { $0 = fresh }
        reloads.withLock { $0 &+= 1 }
        return fresh
    }

    /// The snapshot in use.
    package var snapshot: TrustSnapshot { current.withLock { $0 } }

    /// The accepted manifests naming `path` as their executable (compared byte for byte), in load
    /// order; the caller matches the executable's SHA-256. Empty if none.
    package func manifests(forExecutable path: String) -> [Manifest] {
        current.withLock { s in
            (s.byExecutable[path] ?? []).filter { $0.executable.utf8.elementsEqual(path.utf8) }
        }
    }
}

/// Reading the files of a trust directory through descriptors.
enum TrustFiles {
    /// Calls `body` with the path and bytes of every acceptable file named `*suffix` in `dir`
    /// (hidden files skipped), appending a ``RefusedFile`` for the directory or any file that fails,
    /// or for which `body` returns a reason.
    static func forEachFile(in dir: TrustDirectory, suffix: String, maximumBytes: Int, refused: inout [RefusedFile],
                            _ body: (String, [UInt8]) -> String?) {
        let directory: FileDescriptor
        do throws(SystemError) {
            directory = try FileDescriptor.open(dir.path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW)
        } catch {
            let e = error.errno
            if e == ENOENT { return }
            let reason = e == ELOOP || e == ENOTDIR ? "directory is a symbolic link or not a directory" : "directory cannot be opened (errno \(e))"
            refused.append(RefusedFile(path: dir.path, reason: reason))
            return
        }
        let st: stat
        do throws(SystemError) { st = try directory.status(path: dir.path) } catch {
            refused.append(RefusedFile(path: dir.path, reason: "directory cannot be examined"))
            return
        }
        if let p = StrictModes.problem(st, what: "directory", requireRoot: dir.requireRootOwner)
            ?? StrictModes.ancestorProblem(of: dir.path, requireRoot: dir.requireRootOwner) {
            refused.append(RefusedFile(path: dir.path, reason: p + "; nothing in it is trusted"))
            return
        }
        for name in directory.directoryEntries() where !name.hasPrefix(".") {
            let path = dir.path + "/" + name
            guard name.hasSuffix(suffix) else {
                refused.append(RefusedFile(path: path, reason: "not a *\(suffix) file; ignored"))
                continue
            }
            switch read(directory.rawValue, name, path: path, requireRoot: dir.requireRootOwner, maximumBytes: maximumBytes) {
            case .success(let bytes):
                if let reason = body(path, bytes) { refused.append(RefusedFile(path: path, reason: reason)) }
            case .failure(let reason): refused.append(RefusedFile(path: path, reason: reason.text))
            }
        }
    }

    struct Reason: Error { let text: String }

    /// The file `name` in the directory open on `dfd`: opened with `O_NOFOLLOW` (a symbolic link is
    /// refused), checked with ``StrictModes`` through its descriptor, read up to `maximumBytes`.
    /// `path` names the file in errors and in ``SyscallFaults``.
    static func read(_ dfd: Int32, _ name: String, path: String, requireRoot: Bool, maximumBytes: Int) -> Result<[UInt8], Reason> {
        let fd: FileDescriptor
        do throws(SystemError) { fd = try FileDescriptor.open(at: dfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY, path: path) } catch {
            return .failure(Reason(text: error.errno == ELOOP ? "file is a symbolic link" : "file cannot be opened (errno \(error.errno))"))
        }
        let st: stat
        do throws(SystemError) { st = try fd.status(path: path) } catch {
            return .failure(Reason(text: "file cannot be examined (errno \(error.errno))"))
        }
        guard st.st_mode & S_IFMT == S_IFREG else { return .failure(Reason(text: "not a regular file")) }
        if let p = StrictModes.problem(st, what: "file", requireRoot: requireRoot) { return .failure(Reason(text: p)) }
        // One byte more than allowed, to see a file that is too large without trusting st_size.
        var buffer = [UInt8](repeating: 0, count: maximumBytes + 1)
        let raw = fd.rawValue
        let read = buffer.withUnsafeMutableBytes { b in Result { () throws(SystemError) in try Files.readAll(fd: raw, into: b, path: path) } }
        let total: Int
        switch read {
        case .success(let n): total = n
        case .failure(let error): return .failure(Reason(text: "file cannot be read (errno \(error.errno))"))
        }
        guard total <= maximumBytes else { return .failure(Reason(text: "file larger than \(maximumBytes) bytes")) }
        return .success(Array(buffer[0..<total]))
    }
}

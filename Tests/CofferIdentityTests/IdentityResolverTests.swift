import CofferCrypto
import CofferIdentity
import CofferManifest
import CofferModel
import CofferSystem
import Foundation
import Glibc
import Testing

/// Real processes: a tiny static C client (Fixtures/client.c, built with `cc` once) connects to a
/// real Unix socket, and the resolver identifies the accepted connection's peer.
enum Fixture {
    static let fixtures = URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("Fixtures")

    /// A fresh private directory, its canonical path (manifests name canonical paths).
    static func temporaryDirectory() -> String {
        var template = Array("/tmp/coffer-identity-XXXXXX".utf8CString)
        let made = template.withUnsafeMutableBufferPointer { mkdtemp($0.baseAddress!) }
        precondition(made != nil, "mkdtemp")
        let resolved = realpath(String(cString: made!), nil)!
        defer { free(resolved) }
        return String(cString: resolved)
    }

    /// The built client, or nil if `cc` could not build it (tests needing it are then disabled).
    static let client: String? = {
        let out = temporaryDirectory() + "/client"
        guard run("/usr/bin/cc", ["-static", "-O1", "-o", out, fixtures.appendingPathComponent("client.c").path]) == 0 else { return nil }
        return out
    }()

    static var hasClient: Bool { client != nil }

    /// A copy of the client at a new path (a different file: its own inode and timestamps).
    static func copyOfClient(in dir: String, name: String = "app") throws -> String {
        let path = dir + "/" + name
        try FileManager.default.copyItem(atPath: try #require(client), toPath: path)
        return path
    }

    @discardableResult
    static func run(_ executable: String, _ arguments: [String]) -> Int32 {
        let p = Process()
        p.executableURL = URL(fileURLWithPath: executable)
        p.arguments = arguments
        p.standardOutput = FileHandle.nullDevice
        p.standardError = FileHandle.nullDevice
        guard (try? p.run()) != nil else { return -1 }
        p.waitUntilExit()
        return p.terminationStatus
    }

    static func output(_ executable: String, _ arguments: [String]) -> String? {
        let p = Process()
        p.executableURL = URL(fileURLWithPath: executable)
        p.arguments = arguments
        let pipe = Pipe()
        p.standardOutput = pipe
        p.standardError = FileHandle.nullDevice
        guard (try? p.run()) != nil else { return nil }
        let data = pipe.fileHandleForReading.readDataToEndOfFile()
        p.waitUntilExit()
        return String(decoding: data, as: UTF8.self)
    }

    static let canRunBwrap: Bool = FileManager.default.isExecutableFile(atPath: "/usr/bin/bwrap")
        && run("/usr/bin/bwrap", ["--ro-bind", "/", "/", "/bin/true"]) == 0
    static let hasStrace = FileManager.default.isExecutableFile(atPath: "/usr/bin/strace")

    /// Runs `executable` without Foundation's Process, which would wait for a daemon the program
    /// leaves behind (bindfs's inherits a descriptor Process watches); Subprocess closes every other
    /// descriptor. The exit status, or -1 if it could not start.
    static func runDetached(_ executable: String, _ arguments: [String]) -> Int32 {
        (try? Subprocess.spawn(executable: executable, arguments: arguments).wait()) ?? -1
    }

    /// True if bindfs (apt: bindfs) can mount a FUSE filesystem here (tried once, then unmounted).
    static let canMountFUSE: Bool = {
        guard FileManager.default.isExecutableFile(atPath: "/usr/bin/bindfs"), access("/dev/fuse", R_OK | W_OK) == 0 else { return false }
        let dir = temporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        mkdir(dir + "/a", 0o755)
        mkdir(dir + "/b", 0o755)
        guard runDetached("/usr/bin/bindfs", [dir + "/a", dir + "/b"]) == 0 else { return false }
        return runDetached("/usr/bin/fusermount", ["-u", dir + "/b"]) == 0
    }()
}

/// A listening Unix socket in a private directory, and the processes connected to it.
final class Server {
    let dir: String
    let path: String
    let listener: Int32

    init() throws {
        dir = Fixture.temporaryDirectory()
        path = dir + "/s"
        listener = try UnixSocket.listen(path: path)
    }

    deinit {
        close(listener)
        try? FileManager.default.removeItem(atPath: dir)
    }

    /// Starts `executable` with `arguments` (default: the client on this socket, holding the connection).
    func start(_ executable: String, _ arguments: [String]? = nil, mode: String = "hold") throws -> Process {
        let p = Process()
        p.executableURL = URL(fileURLWithPath: executable)
        p.arguments = arguments ?? [path, mode]
        try p.run()
        return p
    }

    /// The next connection (waits at most 10 s).
    func accept() throws -> FileDescriptor {
        guard UnixSocket.waitReadable(listener, timeoutMillis: 10_000) else { throw SystemError("accept", "timed out", errno: ETIMEDOUT) }
        return FileDescriptor(adopting: try UnixSocket.accept(listener))
    }
}

func signedManifest(app: String = "com.example.app", executable: String, sha256: [UInt8],
                    groups: [String] = ["a", "shared"], entitlements: [ManifestEntitlement] = []) throws -> Manifest {
    let key = Ed25519.generateKeyPair()
    let manifest = try Manifest.sign(app: app, executable: executable, executableSHA256: sha256, accessGroups: groups,
                                     entitlements: entitlements, secretKey: key.secretKey)
    try manifest.verify(trusting: [try #require(SignerKey(key.publicKey))])
    return manifest
}

@Suite(.serialized) struct IdentityResolverTests {
    /// Both ways of pinning the peer: SO_PEERPIDFD (this kernel) and the pidfd_open fallback.
    static let modes = [true, false]

    @Test(.enabled(if: Fixture.hasClient, "cc could not build the client"), arguments: modes)
    func identifiesARealChildThroughASocket(usePeerPIDFD: Bool) throws {
        let server = try Server()
        let app = try Fixture.copyOfClient(in: server.dir)
        let child = try server.start(app)
        let connection = try server.accept()
        let resolver = IdentityResolver(manifests: StaticManifestSource([]), usePeerPIDFD: usePeerPIDFD)
        let identity = try resolver.identify(socket: connection.rawValue)
        #expect(identity.pid == child.processIdentifier)
        #expect(identity.uid == getuid())
        #expect(identity.establishedBy == .unsigned(executablePath: app, reason: .noMatchingManifest))
        #expect(identity.accessGroups.isEmpty && identity.appID == nil && !identity.isSigned)
        try connection.close()
        child.waitUntilExit()
    }

    @Test(.enabled(if: Fixture.hasClient, "cc could not build the client"))
    func theHashIsOfTheRunningBinary() throws {
        let server = try Server()
        let app = try Fixture.copyOfClient(in: server.dir)
        let child = try server.start(app)
        let connection = try server.accept()
        let process = try ProcessHandle.peer(ofSocket: connection.rawValue)
        let exe = try process.openExecutable()
        let viaProc = try ExecutableHash.sha256(fileDescriptor: exe.rawValue)
        // An independent implementation: coreutils' sha256sum of the file on disk.
        let sum = try #require(Fixture.output("/usr/bin/sha256sum", [app])).prefix(64)
        #expect(viaProc.map { String(format: "%02x", $0) }.joined() == String(sum))
        #expect(String(decoding: try process.executablePath(), as: UTF8.self) == app)
        try connection.close()
        child.waitUntilExit()
    }

    @Test(.enabled(if: Fixture.hasClient, "cc could not build the client"))
    func aMatchingManifestGivesItsAppAndGroups_aWrongHashDoesNot() throws {
        let server = try Server()
        let app = try Fixture.copyOfClient(in: server.dir)
        let digest = try ExecutableHash.sha256(path: app)
        let good = try signedManifest(executable: app, sha256: digest)
        var wrongDigest = digest
        wrongDigest[0] ^= 1
        let wrong = try signedManifest(app: "com.example.other", executable: app, sha256: wrongDigest, groups: ["b"])
        let otherPath = try signedManifest(app: "com.example.elsewhere", executable: app + "2", sha256: digest, groups: ["c"])

        let child = try server.start(app)
        let connection = try server.accept()
        let signed = try IdentityResolver(manifests: StaticManifestSource([wrong, otherPath, good])).identify(socket: connection.rawValue)
        #expect(signed.establishedBy == .signedManifest(appID: "com.example.app"))
        #expect(signed.accessGroups == ["a", "shared"] && signed.defaultAccessGroup == "a" && signed.appID == "com.example.app")

        let unsigned = try IdentityResolver(manifests: StaticManifestSource([wrong, otherPath])).identify(socket: connection.rawValue)
        #expect(unsigned.establishedBy == .unsigned(executablePath: app, reason: .executableChanged))
        #expect(unsigned.accessGroups.isEmpty)
        try connection.close()
        child.waitUntilExit()
    }

    @Test(.enabled(if: Fixture.hasClient, "cc could not build the client"))
    func aSecondIdentificationUsesTheCachedHash() throws {
        let server = try Server()
        let app = try Fixture.copyOfClient(in: server.dir)
        let manifest = try signedManifest(executable: app, sha256: try ExecutableHash.sha256(path: app))
        let cache = ExecutableHashCache(racyWindowSeconds: 0)
        let resolver = IdentityResolver(manifests: StaticManifestSource([manifest]), hashes: cache)
        let child = try server.start(app)
        let connection = try server.accept()

        let cold = ContinuousClock().measure { _ = try? resolver.identify(socket: connection.rawValue) }
        #expect(cache.hashesComputed == 1)
        var warm = Duration.zero
        let rounds = 200
        for _ in 0..<rounds {
            warm += ContinuousClock().measure {
                #expect((try? resolver.identify(socket: connection.rawValue))?.establishedBy == .signedManifest(appID: "com.example.app"))
            }
        }
        #expect(cache.hashesComputed == 1, "every later identification hit the cache")
        print("identity: first identification \(cold), warm (cached) identification \(warm / rounds) on average of \(rounds)")
        try connection.close()
        child.waitUntilExit()
    }

    @Test(.enabled(if: Fixture.hasClient, "cc could not build the client"))
    func aJustWrittenExecutableIsHashedButNotRemembered() throws {
        let server = try Server()
        let app = try Fixture.copyOfClient(in: server.dir) // written just now: inside the racy window
        let cache = ExecutableHashCache(racyWindowSeconds: 3600)
        // A manifest names the path (with another hash), so that the file is hashed at all.
        let named = try signedManifest(executable: app, sha256: [UInt8](repeating: 7, count: 32))
        let resolver = IdentityResolver(manifests: StaticManifestSource([named]), hashes: cache)
        let child = try server.start(app)
        let connection = try server.accept()
        _ = try resolver.identify(socket: connection.rawValue)
        _ = try resolver.identify(socket: connection.rawValue)
        #expect(cache.hashesComputed == 2 && cache.count == 0)
        try connection.close()
        child.waitUntilExit()
    }

    @Test(.enabled(if: Fixture.hasClient, "cc could not build the client"))
    func anExecutableNoManifestNamesIsNotHashed() throws {
        let server = try Server()
        let app = try Fixture.copyOfClient(in: server.dir)
        let digest = try ExecutableHash.sha256(path: app)
        // Manifests for other paths only (one of them with this very file's hash): nothing to compare
        // this executable's hash with, so it is never read.
        let elsewhere = try signedManifest(app: "com.example.elsewhere", executable: app + "2", sha256: digest, groups: ["c"])
        let cache = ExecutableHashCache(racyWindowSeconds: 0)
        let child = try server.start(app)
        let connection = try server.accept()
        let identity = try IdentityResolver(manifests: StaticManifestSource([elsewhere]), hashes: cache).identify(socket: connection.rawValue)
        #expect(identity.establishedBy == .unsigned(executablePath: app, reason: .noMatchingManifest))
        #expect(identity.accessGroups.isEmpty)
        #expect(cache.hashesComputed == 0 && cache.count == 0)
        // Once a manifest names the path, the same process is hashed and matched.
        let named = try signedManifest(executable: app, sha256: digest)
        let signed = try IdentityResolver(manifests: StaticManifestSource([elsewhere, named]), hashes: cache).identify(socket: connection.rawValue)
        #expect(signed.establishedBy == .signedManifest(appID: "com.example.app"))
        #expect(cache.hashesComputed == 1)
        try connection.close()
        child.waitUntilExit()
    }

    @Test(.enabled(if: Fixture.hasClient, "cc could not build the client"))
    func aDeletedAndReplacedExecutableIsRefused() throws {
        let server = try Server()
        let app = try Fixture.copyOfClient(in: server.dir)
        // A manifest for the original binary, path and hash: deletion must still win.
        let manifest = try signedManifest(executable: app, sha256: try ExecutableHash.sha256(path: app))
        let resolver = IdentityResolver(manifests: StaticManifestSource([manifest]), hashes: ExecutableHashCache(racyWindowSeconds: 0))
        let child = try server.start(app)
        let connection = try server.accept()
        #expect(try resolver.identify(socket: connection.rawValue).isSigned)

        try FileManager.default.removeItem(atPath: app)
        try FileManager.default.copyItem(atPath: "/bin/true", toPath: app)
        let identity = try resolver.identify(socket: connection.rawValue)
        #expect(identity.establishedBy == .unsigned(executablePath: app + " (deleted)", reason: .executableDeleted))
        #expect(!identity.isSigned)
        try connection.close()
        child.waitUntilExit()
    }

    @Test(.enabled(if: Fixture.hasClient && Fixture.hasStrace, "needs cc and strace"))
    func aTracedProcessGetsNoSignedIdentity() throws {
        let server = try Server()
        let app = try Fixture.copyOfClient(in: server.dir)
        let manifest = try signedManifest(executable: app, sha256: try ExecutableHash.sha256(path: app))
        let resolver = IdentityResolver(manifests: StaticManifestSource([manifest]))
        let child = try server.start(app)
        let connection = try server.accept()
        #expect(try resolver.identify(socket: connection.rawValue).isSigned)

        let strace = try server.start("/usr/bin/strace", ["-o", "/dev/null", "-p", "\(child.processIdentifier)"])
        defer { strace.terminate(); strace.waitUntilExit() }
        let deadline = Date().addingTimeInterval(10)
        var tracer = "0"
        while tracer == "0" && Date() < deadline {
            let status = (try? String(contentsOfFile: "/proc/\(child.processIdentifier)/status", encoding: .utf8)) ?? ""
            tracer = status.split(separator: "\n").first { $0.hasPrefix("TracerPid:") }?
                .dropFirst("TracerPid:".count).trimmingCharacters(in: .whitespaces) ?? "0"
            if tracer == "0" { usleep(10_000) }
        }
        try #require(tracer != "0", "strace did not attach")
        let identity = try resolver.identify(socket: connection.rawValue)
        #expect(identity.establishedBy == .unsigned(executablePath: app, reason: .traced(tracerPID: strace.processIdentifier)))
        #expect(identity.accessGroups.isEmpty)
        try connection.close()
        child.waitUntilExit()
    }

    @Test(.enabled(if: Fixture.hasClient, "cc could not build the client"), arguments: modes)
    func aPeerThatExitedAndWasReapedGetsNoIdentity(usePeerPIDFD: Bool) throws {
        let server = try Server()
        let child = try server.start(try #require(Fixture.client), mode: "exit")
        let connection = try server.accept()
        child.waitUntilExit() // exited and reaped: its pid is free for reuse
        let resolver = IdentityResolver(manifests: StaticManifestSource([]), usePeerPIDFD: usePeerPIDFD)
        #expect(throws: IdentityError.self) { try resolver.identify(socket: connection.rawValue) }
        #expect(throws: SystemError.self) { _ = try ProcessHandle.peer(ofSocket: connection.rawValue, usePeerPIDFD: usePeerPIDFD) }
    }

    /// The process that connected exited, and its parent holds the socket without reaping it: the
    /// zombie has no executable or root left to read, and whoever holds the connection cannot be
    /// told (a sandboxed app could use this to pass for an unsigned caller). Refused.
    @Test(.enabled(if: Fixture.hasClient, "cc could not build the client"), arguments: modes)
    func aZombiePeerGetsNoIdentity(usePeerPIDFD: Bool) throws {
        let server = try Server()
        let parent = try server.start(try #require(Fixture.client), mode: "zombie")
        let connection = try server.accept()
        let peer = try ProcessHandle.peer(ofSocket: connection.rawValue, usePeerPIDFD: usePeerPIDFD)
        var state = ""
        for _ in 0..<500 {
            state = (try? peer.statusFields(["State"]))?["State"] ?? ""
            if state.hasPrefix("Z") { break }
            usleep(10_000)
        }
        try #require(state.hasPrefix("Z"), "the connecting child did not become a zombie: \(state)")
        let resolver = IdentityResolver(manifests: StaticManifestSource([]), usePeerPIDFD: usePeerPIDFD)
        #expect(throws: IdentityError.self) { try resolver.identify(socket: connection.rawValue) }
        try connection.close()
        parent.waitUntilExit()
    }

    /// The real race: the peer exits, is reaped, and a new process takes its very pid (set through
    /// ns_last_pid, root only) before identification. SO_PEERPIDFD pins the original process, so the
    /// answer is an error, never the new process's identity (which here would even be signed).
    @Test(.enabled(if: Fixture.hasClient && getuid() == 0 && access("/proc/sys/kernel/ns_last_pid", W_OK) == 0,
                   "needs root (ns_last_pid) and cc"))
    func aReusedPidNeverGivesAnotherProcesssIdentity() throws {
        let server = try Server()
        let app = try Fixture.copyOfClient(in: server.dir)
        let manifest = try signedManifest(executable: app, sha256: try ExecutableHash.sha256(path: app))
        let resolver = IdentityResolver(manifests: StaticManifestSource([manifest]))
        var reused = false
        for _ in 0..<20 where !reused {
            let peer = try server.start(app, mode: "exit")
            let connection = try server.accept()
            peer.waitUntilExit()
            let pid = peer.processIdentifier
            // The impostor runs the same signed binary and holds a connection of its own.
            try "\(pid - 1)".write(toFile: "/proc/sys/kernel/ns_last_pid", atomically: false, encoding: .utf8)
            let impostor = try server.start(app)
            let impostorConnection = try server.accept()
            if impostor.processIdentifier == pid {
                reused = true
                #expect(try resolver.identify(socket: impostorConnection.rawValue).isSigned)
                #expect(throws: IdentityError.self) { try resolver.identify(socket: connection.rawValue) }
            }
            try impostorConnection.close()
            impostor.waitUntilExit()
        }
        try #require(reused, "no pid was reused in 20 attempts (a busy machine): the race was not exercised")
    }

    /// Issue #24 (2), the attack itself: a session's leader exits, and another process gets its pid
    /// (forced here through ns_last_pid, root only; an attacker forks until it comes) and calls
    /// setsid(): the same session id, but not the same session — the leader's start time differs —
    /// and the old session reads as ended.
    @Test(.enabled(if: Fixture.hasClient && getuid() == 0 && access("/proc/sys/kernel/ns_last_pid", W_OK) == 0,
                   "needs root (ns_last_pid) and cc"))
    func aSessionIDMadeAgainIsAnotherSession() throws {
        let server = try Server()
        let app = try Fixture.copyOfClient(in: server.dir)
        let resolver = IdentityResolver(manifests: StaticManifestSource([]))
        var reused = false
        for _ in 0..<20 where !reused {
            // The client forks the session's leader, which connects: the peer is the leader.
            let leader = try server.start(app, mode: "session")
            let connection = try server.accept()
            let first = try resolver.identify(socket: connection.rawValue)
            let session = try #require(first.session, "a session leader's session is known")
            #expect(session.id == first.pid && first.sessionID == session.id)
            #expect(LoginSessions.isLive(session))
            // A start time counts clock ticks (10 ms at USER_HZ 100): a leader that a person used lived
            // longer than one, so a process that takes its pid afterwards started in a later tick.
            // This one lives three ticks (a lower bound: a slow machine only makes it longer).
            usleep(30_000)
            try connection.close()
            leader.waitUntilExit()
            #expect(leader.terminationStatus == 0)
            #expect(!LoginSessions.isLive(session), "its leader exited: the session ended")
            // The impostor's client takes the pid before the old leader's, its child the leader's pid.
            try "\(first.pid - 2)".write(toFile: "/proc/sys/kernel/ns_last_pid", atomically: false, encoding: .utf8)
            let impostor = try server.start(app, mode: "session")
            let impostorConnection = try server.accept()
            let second = try resolver.identify(socket: impostorConnection.rawValue)
            if second.pid == first.pid {
                reused = true
                #expect(second.sessionID == first.sessionID, "the same session id again")
                let again = try #require(second.session)
                #expect(again != session && again.leaderStartTime != session.leaderStartTime, "\(again) vs \(session)")
                #expect(LoginSessions.isLive(again) && !LoginSessions.isLive(session))
            }
            try impostorConnection.close()
            impostor.waitUntilExit()
        }
        try #require(reused, "no pid was reused in 20 attempts (a busy machine): the race was not exercised")
    }

    /// Issue #24 (FUSE): an executable served by a FUSE filesystem gets no signed identity, even with
    /// a manifest naming its path and hash: the server could hand the agent's read other bytes than
    /// the kernel's exec. The same file on the local filesystem, signed, stays signed.
    @Test(.enabled(if: Fixture.hasClient && Fixture.canMountFUSE, "needs cc, and bindfs (apt: bindfs) able to mount FUSE here"))
    func anExecutableOnFUSEIsUnsignedWhateverItsHash() throws {
        let server = try Server()
        let local = server.dir + "/local", served = server.dir + "/served"
        mkdir(local, 0o755)
        mkdir(served, 0o755)
        let app = try Fixture.copyOfClient(in: local)
        try #require(Fixture.runDetached("/usr/bin/bindfs", [local, served]) == 0, "bindfs could not mount")
        defer {
            // Unmounted before the server's directory is removed (the server is kept alive till here).
            if Fixture.runDetached("/usr/bin/fusermount", ["-u", served]) != 0 { _ = Fixture.runDetached("/bin/umount", [served]) }
            withExtendedLifetime(server) {}
        }
        let servedApp = served + "/app"
        let sha = try ExecutableHash.sha256(path: app)
        let manifests = StaticManifestSource([try signedManifest(app: "com.example.local", executable: app, sha256: sha),
                                              try signedManifest(app: "com.example.served", executable: servedApp, sha256: sha)])
        let resolver = IdentityResolver(manifests: manifests)

        let onFUSE = try server.start(servedApp)
        let c1 = try server.accept()
        let identity = try resolver.identify(socket: c1.rawValue)
        #expect(identity.establishedBy == .unsigned(executablePath: servedApp, reason: .untrustedFilesystem("FUSE")), "\(identity)")
        try c1.close()
        onFUSE.waitUntilExit()

        let onDisk = try server.start(app)
        let c2 = try server.accept()
        #expect(try resolver.identify(socket: c2.rawValue).establishedBy == .signedManifest(appID: "com.example.local"))
        try c2.close()
        onDisk.waitUntilExit()
    }

    /// A caller that is not its session's leader has the session of its leader while that lives.
    @Test(.enabled(if: Fixture.hasClient, "cc could not build the client"))
    func aCallersSessionIsItsLeadersWhileTheLeaderLives() throws {
        let server = try Server()
        let app = try Fixture.copyOfClient(in: server.dir)
        let child = try server.start(app)
        let connection = try server.accept()
        let identity = try IdentityResolver(manifests: StaticManifestSource([])).identify(socket: connection.rawValue)
        let sid = getsid(0)
        #expect(identity.sessionID == sid)
        if let start = LoginSessions.leaderStartTime(of: sid) {
            #expect(identity.session == CallerIdentity.LoginSession(id: sid, leaderStartTime: start, auditSessionID: identity.session?.auditSessionID))
            let audit = try? String(contentsOfFile: "/proc/self/sessionid", encoding: .utf8)
            #expect(identity.session?.auditSessionID == audit.flatMap { UInt32($0) }.flatMap { $0 == LoginSessions.auditSessionUnset ? nil : $0 })
        } else {
            // This runner's session leader is outside its pid namespace or gone: no session to key by.
            #expect(identity.session == nil)
        }
        try connection.close()
        child.waitUntilExit()
    }

    @Test(.enabled(if: Fixture.hasClient && Fixture.canRunBwrap, "needs cc and a bwrap that can create namespaces here (apt: bubblewrap)"))
    func aFlatpakSandboxedClientGetsItsFlatpakGroup() throws {
        let server = try Server()
        let app = try Fixture.copyOfClient(in: server.dir)
        let info = server.dir + "/flatpak-info"
        try "[Application]\nname=org.example.App\nruntime=runtime/org.example.Platform/x86_64/1\n\n[Instance]\ninstance-id=1\n"
            .write(toFile: info, atomically: true, encoding: .utf8)
        // A manifest for the binary too: inside a sandbox the Flatpak identity wins.
        let manifest = try signedManifest(executable: app, sha256: try ExecutableHash.sha256(path: app))
        let child = try server.start("/usr/bin/bwrap", ["--bind", server.dir, server.dir, "--ro-bind", info, "/.flatpak-info",
                                                        "--proc", "/proc", "--dev", "/dev", "--unshare-ipc", app, server.path, "hold"])
        let connection = try server.accept()
        let identity = try IdentityResolver(manifests: StaticManifestSource([manifest])).identify(socket: connection.rawValue)
        #expect(identity.establishedBy == .flatpak(appID: "org.example.App"))
        #expect(identity.accessGroups == ["flatpak:org.example.App"] && identity.appID == "org.example.App")

        // The same client outside the sandbox has no .flatpak-info in its root: signed by its manifest.
        let host = try server.start(app)
        let hostConnection = try server.accept()
        #expect(try IdentityResolver(manifests: StaticManifestSource([manifest])).identify(socket: hostConnection.rawValue)
            .establishedBy == .signedManifest(appID: "com.example.app"))
        try hostConnection.close()
        host.waitUntilExit()
        try connection.close()
        child.waitUntilExit()
    }

    /// `.flatpak-info` must be a regular file opened without following a link, of bounded size, and
    /// name a valid app: a symbolic link (to a real info file), a directory, an oversized or an invalid
    /// file gives no Flatpak identity.
    @Test(.enabled(if: Fixture.hasClient && Fixture.canRunBwrap, "needs cc and a bwrap that can create namespaces here (apt: bubblewrap)"),
          arguments: ["symlink", "directory", "too large", "no app"])
    func aBadFlatpakInfoIsRefused(kind: String) throws {
        let server = try Server()
        let app = try Fixture.copyOfClient(in: server.dir)
        let good = server.dir + "/good-info"
        try "[Application]\nname=org.example.App\n".write(toFile: good, atomically: true, encoding: .utf8)
        let bad = server.dir + "/bad-info"
        var setup: [String]
        switch kind {
        case "symlink": setup = ["--symlink", good, "/.flatpak-info"]
        case "directory": setup = ["--dir", "/.flatpak-info"]
        case "too large":
            try Data(("[Application]\nname=org.example.App\n" + String(repeating: "#", count: FlatpakInfo.maximumBytes)).utf8)
                .write(to: URL(fileURLWithPath: bad))
            setup = ["--ro-bind", bad, "/.flatpak-info"]
        default:
            try "[Runtime]\nname=org.example.Platform\n".write(toFile: bad, atomically: true, encoding: .utf8)
            setup = ["--ro-bind", bad, "/.flatpak-info"]
        }
        let child = try server.start("/usr/bin/bwrap", ["--bind", server.dir, server.dir] + setup
                                     + ["--proc", "/proc", "--dev", "/dev", app, server.path, "hold"])
        let connection = try server.accept()
        // A sandbox it is, and which one cannot be told: no identity at all (an unsigned one would
        // give a confined app the unsigned callers' group and whole-keychain operations).
        #expect(throws: IdentityError.self) { try IdentityResolver(manifests: StaticManifestSource([])).identify(socket: connection.rawValue) }
        try connection.close()
        child.waitUntilExit()
    }

    @Test func benchmarkColdHashOf50MB() throws {
        let dir = Fixture.temporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let path = dir + "/big"
        var bytes = [UInt8](repeating: 0, count: 50 << 20)
        for i in stride(from: 0, to: bytes.count, by: 4096) { bytes[i] = UInt8(truncatingIfNeeded: i >> 12) }
        try Data(bytes).write(to: URL(fileURLWithPath: path))
        let cache = ExecutableHashCache(racyWindowSeconds: 0)
        let fd = try FileDescriptor.open(path, O_RDONLY)
        let st = try fd.status()
        var digest: [UInt8] = []
        let cold = try ContinuousClock().measure { digest = try cache.sha256(fileDescriptor: fd.rawValue, status: st) }
        var again: [UInt8] = []
        let warm = try ContinuousClock().measure { again = try cache.sha256(fileDescriptor: fd.rawValue, status: st) }
        #expect(again == digest)
        #expect(digest == SHA256.hash(bytes))
        #expect(cache.hashesComputed == 1)
        print("identity: cold SHA-256 of a 50 MiB executable \(cold), cached \(warm)")
    }
}

@Suite struct FlatpakInfoTests {
    @Test func readsTheApplicationName() {
        let text = "# comment\n[Application]\n name = org.example.App \nruntime=x\n[Instance]\nname=not.this.one\n"
        #expect(FlatpakInfo.appID(from: Array(text.utf8)) == "org.example.App")
    }

    @Test func refusesWhatIsNotAnApplication() {
        for text in ["[Runtime]\nname=org.example.Platform\n", "name=org.example.App\n", "[Instance]\nname=org.example.App\n",
                     "[Application]\nname=org/../x.y.z\n", "[Application]\nname=two.parts\n", "[Application]\nname=org.1x.App\n",
                     "[Application]\nname=org..App\n", "[Application\nname=org.example.App\n", ""] {
            #expect(FlatpakInfo.appID(from: Array(text.utf8)) == nil, "\(text)")
        }
        #expect(FlatpakInfo.appID(from: [0xff, 0xfe] + Array("[Application]\nname=a.b.c\n".utf8)) == nil)
        #expect(FlatpakInfo.appID(from: Array("[Application]\nname=a.b.c\n".utf8) + [UInt8](repeating: 0x20, count: FlatpakInfo.maximumBytes)) == nil)
    }
}

@Suite struct LoginSessionTests {
    @Test func parsesTheStatLineWhateverTheCommandName() {
        func fields(_ comm: String, state: String = "S") -> (pid: Int32, state: UInt8, session: Int32, startTime: UInt64)? {
            let tail = (7...21).map(String.init).joined(separator: " ")
            // Fields 3-6 (state, ppid, pgrp, session) then 7-21, then 22 (starttime) and more.
            let line = "1234 (\(comm)) \(state) 1 1234 999 " + tail + " 555666 8192 12\n"
            return LoginSessions.parseStat(ArraySlice(Array(line.utf8)))
        }
        let plain = fields("bash")
        #expect(plain?.pid == 1234 && plain?.session == 999 && plain?.state == UInt8(ascii: "S"))
        // fields 7..21 are 15 numbers: starttime is the one after them.
        #expect(plain?.startTime == 555666)
        // A command name with spaces and parentheses (a process can name itself so) changes nothing.
        let hostile = fields("a) 1 2 3 (b")
        #expect(hostile?.pid == 1234 && hostile?.session == 999 && hostile?.startTime == 555666)
        #expect(LoginSessions.parseStat(ArraySlice(Array("1234 (x) S 1 2".utf8))) == nil)
        #expect(LoginSessions.parseStat(ArraySlice(Array("garbage".utf8))) == nil)
    }

    @Test func readsTheAuditSessionID() {
        #expect(LoginSessions.auditSessionID(from: Array("3".utf8)) == 3)
        #expect(LoginSessions.auditSessionID(from: Array("4294967295".utf8)) == nil, "unset")
        #expect(LoginSessions.auditSessionID(from: Array("".utf8)) == nil)
        #expect(LoginSessions.auditSessionID(from: Array("x".utf8)) == nil)
    }

    @Test func aProcessThatIsNotItsSessionsLeaderLeadsNone() {
        // This process is not a session leader (the test runner's parent is), so its pid names no session.
        if getsid(0) != getpid() { #expect(LoginSessions.leaderStartTime(of: getpid()) == nil) }
        #expect(LoginSessions.leaderStartTime(of: 0) == nil && LoginSessions.leaderStartTime(of: -1) == nil)
    }
}

@Suite struct UntrustedFilesystemTests {
    @Test func fuseIsUntrustedLocalFilesystemsAreNot() throws {
        #expect(UntrustedFilesystem.kind(ofType: 0x6573_5546) == "FUSE")
        #expect(UntrustedFilesystem.kind(ofType: 0xEF53) == nil, "ext4")
        #expect(UntrustedFilesystem.kind(ofType: 0x0102_1994) == nil, "tmpfs")
        // This test's own executable is on a local filesystem.
        let exe = try FileDescriptor.open("/proc/self/exe", O_RDONLY)
        #expect(UntrustedFilesystem.kind(ofOpenFile: exe) == nil)
    }
}

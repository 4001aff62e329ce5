import CofferIdentity
import CofferManifest
import CofferModel
import CofferSystem
import Foundation
import Glibc
import Testing

/// A manifest source whose manifests an administrator's reload can change (``ManifestSource/generation``).
final class ReloadableManifests: ManifestSource, @unchecked Sendable {
    private let lock = NSLock()
    private var current: [Manifest] = []
    private var reloads: UInt64 = 0

    func manifests(forExecutable path: String) -> [Manifest] {
        lock.withLock { current.filter { $0.executable.utf8.elementsEqual(path.utf8) } }
    }

    var generation: UInt64 { lock.withLock { reloads } }

    func reload(_ manifests: [Manifest]) {
        lock.withLock {
            current = manifests
            reloads += 1
        }
    }
}

/// A copy of the test client at a path of its own, a fresh server for it to connect to, and a manifest
/// signing the copy: what each of these tests starts from.
final class SignedClient {
    let server: Server
    let app: String
    let manifest: Manifest

    init() throws {
        server = try Server()
        app = try Fixture.copyOfClient(in: server.dir)
        manifest = try signedManifest(executable: app, sha256: try ExecutableHash.sha256(path: app))
    }
}

/// Issue #42: one identity resolution per process. The resolver remembers what it established for a
/// process (``KnownProcesses``) and gives it to that process's next connection only while everything
/// it rested on still reads the same: real processes, real /proc, the real resolver.
@Suite(.serialized) struct KnownProcessesTests {
    /// The hash cache's racy window off: the copied test executables were written a moment ago, and
    /// a file changed within the window is not remembered (as the first test shows).
    static func resolver(_ manifests: any ManifestSource, racy: Double = 0) -> IdentityResolver {
        IdentityResolver(manifests: manifests, hashes: ExecutableHashCache(racyWindowSeconds: racy))
    }

    @Test(.enabled(if: Fixture.hasClient, "cc could not build the client"))
    func aProcessIsResolvedOnceForAllItsConnections() throws {
        let client = try SignedClient()
        let (server, app, manifest) = (client.server, client.app, client.manifest)
        let resolver = Self.resolver(StaticManifestSource([manifest]))
        let child = try server.start(app)
        let connection = try server.accept()
        let first = try resolver.identify(socket: connection.rawValue)
        let again = try resolver.identify(socket: connection.rawValue)
        // A DELEGATE naming the same process (its pid and start time) is the same process too.
        let delegated = try resolver.identify(pid: child.processIdentifier, uid: getuid(), startTime: first.processStartTime)
        #expect(first.isSigned && first.appID == "com.example.app")
        #expect(again == first && delegated == first)
        #expect(resolver.identifications == 1 && resolver.known.reused == 2)
        try connection.close()
        child.waitUntilExit()

        // A file written within the racy window is resolved each time (its timestamps could hide a
        // rewrite made in the same tick).
        let racy = Self.resolver(StaticManifestSource([manifest]), racy: 3600)
        let child2 = try server.start(app)
        let connection2 = try server.accept()
        _ = try racy.identify(socket: connection2.rawValue)
        _ = try racy.identify(socket: connection2.rawValue)
        #expect(racy.identifications == 2 && racy.known.reused == 0)
        try connection2.close()
        child2.waitUntilExit()
    }

    /// A process that execs another file keeps its pid and start time: it is resolved again and
    /// gets the new file's identity, never the one it had.
    @Test(.enabled(if: Fixture.hasClient, "cc could not build the client"))
    func anExecOfAnotherFileIsResolvedAgain() throws {
        let client = try SignedClient()
        let (server, app, manifest) = (client.server, client.app, client.manifest)
        let resolver = Self.resolver(StaticManifestSource([manifest]))
        let child = try server.start(app, mode: "exec")
        let connection = try server.accept()
        let signed = try resolver.identify(socket: connection.rawValue)
        #expect(signed.isSigned)
        #expect(try resolver.identify(socket: connection.rawValue) == signed)
        #expect(resolver.identifications == 1)
        // The client execs /bin/sh, which keeps the connection.
        var go: UInt8 = 1
        #expect(write(connection.rawValue, &go, 1) == 1)
        let shell = realpath("/bin/sh", nil).map { p in defer { free(p) }; return String(cString: p) } ?? "/bin/sh"
        let deadline = Date().addingTimeInterval(10)
        let pid = child.processIdentifier
        while (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/\(pid)/exe")) != shell, Date() < deadline { usleep(10_000) }
        try #require((try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/\(pid)/exe")) == shell, "the client did not exec")
        let after = try resolver.identify(socket: connection.rawValue)
        #expect(after.establishedBy == .unsigned(executablePath: shell, reason: .noMatchingManifest), "\(after)")
        #expect(after.processStartTime == signed.processStartTime && after.accessGroups.isEmpty)
        #expect(resolver.identifications == 2)
        try connection.close()
        child.waitUntilExit()
    }

    /// A reload of the manifests (one added, one withdrawn) ends every remembered identity.
    @Test(.enabled(if: Fixture.hasClient, "cc could not build the client"))
    func aReloadOfTheManifestsResolvesAgain() throws {
        let client = try SignedClient()
        let (server, app, manifest) = (client.server, client.app, client.manifest)
        let source = ReloadableManifests()
        let resolver = Self.resolver(source)
        let child = try server.start(app)
        let connection = try server.accept()
        #expect(!(try resolver.identify(socket: connection.rawValue)).isSigned)
        source.reload([manifest])
        #expect(try resolver.identify(socket: connection.rawValue).appID == "com.example.app")
        #expect(try resolver.identify(socket: connection.rawValue).appID == "com.example.app")
        source.reload([])
        #expect(!(try resolver.identify(socket: connection.rawValue)).isSigned)
        #expect(resolver.identifications == 3 && resolver.known.reused == 1)
        try connection.close()
        child.waitUntilExit()
    }

    /// A process that was signed and is then traced is resolved again (unsigned, traced); once the
    /// tracer has gone it is resolved afresh, not given what it had while traced.
    @Test(.enabled(if: Fixture.hasClient && Fixture.hasStrace, "needs cc and strace"))
    func aTraceIsSeenOnTheNextConnection() throws {
        let client = try SignedClient()
        let (server, app, manifest) = (client.server, client.app, client.manifest)
        let resolver = Self.resolver(StaticManifestSource([manifest]))
        let child = try server.start(app)
        let connection = try server.accept()
        #expect(try resolver.identify(socket: connection.rawValue).isSigned)
        func tracer() -> String {
            let status = (try? String(contentsOfFile: "/proc/\(child.processIdentifier)/status", encoding: .utf8)) ?? ""
            return status.split(separator: "\n").first { $0.hasPrefix("TracerPid:") }?
                .dropFirst("TracerPid:".count).trimmingCharacters(in: .whitespaces) ?? "0"
        }
        let strace = try server.start("/usr/bin/strace", ["-o", "/dev/null", "-p", "\(child.processIdentifier)"])
        let deadline = Date().addingTimeInterval(10)
        while tracer() == "0" && Date() < deadline { usleep(10_000) }
        try #require(tracer() != "0", "strace did not attach")
        let traced = try resolver.identify(socket: connection.rawValue)
        #expect(traced.establishedBy == .unsigned(executablePath: app, reason: .traced(tracerPID: strace.processIdentifier)))
        // SIGKILL: strace attached with -p keeps SIGTERM blocked while its tracee sleeps; the kernel
        // detaches a dead tracer's tracees.
        kill(strace.processIdentifier, SIGKILL)
        strace.waitUntilExit()
        let detached = Date().addingTimeInterval(10)
        while tracer() != "0" && Date() < detached { usleep(10_000) }
        try #require(tracer() == "0", "strace did not detach")
        #expect(try resolver.identify(socket: connection.rawValue).isSigned)
        #expect(resolver.identifications == 3)
        try connection.close()
        child.waitUntilExit()
    }

    /// The executable replaced under a running process (deleted, another file at its path): the
    /// path /proc names changes, and the process is resolved again (unsigned: deleted).
    @Test(.enabled(if: Fixture.hasClient, "cc could not build the client"))
    func aReplacedExecutableIsResolvedAgain() throws {
        let client = try SignedClient()
        let (server, app, manifest) = (client.server, client.app, client.manifest)
        let resolver = Self.resolver(StaticManifestSource([manifest]))
        let child = try server.start(app)
        let connection = try server.accept()
        #expect(try resolver.identify(socket: connection.rawValue).isSigned)
        try FileManager.default.removeItem(atPath: app)
        try FileManager.default.copyItem(atPath: "/bin/true", toPath: app)
        let identity = try resolver.identify(socket: connection.rawValue)
        #expect(identity.establishedBy == .unsigned(executablePath: app + " (deleted)", reason: .executableDeleted))
        #expect(resolver.identifications == 2)
        try connection.close()
        child.waitUntilExit()
    }
}

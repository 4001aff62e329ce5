import CofferIdentity
import CofferManifest
import CofferModel
import CofferSystem
import Foundation
import Glibc
import Testing

/// Issue #25 (3): a caller identified from a pidfd or a pid (what a bus front end has: many senders
/// on one connection), and a connection's peer credentials read once, at accept.
@Suite(.serialized) struct IdentityWithoutSocketTests {
    /// A live child (holding a connection to `server`, so it stays until the test lets it go), its
    /// executable signed by a manifest.
    final class Child {
        let server: Server
        let app: String
        let process: Process
        /// The accepted connection (nil once ended) and its descriptor number.
        var connection: FileDescriptor?
        let fd: Int32
        let resolver: IdentityResolver

        init() throws {
            server = try Server()
            app = try Fixture.copyOfClient(in: server.dir)
            let manifest = try signedManifest(executable: app, sha256: try ExecutableHash.sha256(path: app))
            resolver = IdentityResolver(manifests: StaticManifestSource([manifest]))
            process = try server.start(app)
            let accepted = try server.accept()
            fd = accepted.rawValue
            connection = Optional(consume accepted)
        }

        var pid: Int32 { process.processIdentifier }

        /// Lets the child go and reaps it: its pid is free for reuse afterwards.
        func end() throws {
            if let connection = connection.take() { try connection.close() }
            process.waitUntilExit()
        }
    }

    @Test(.enabled(if: Fixture.hasClient, "cc could not build the client"))
    func identifiesALiveChildByPidfd() throws {
        let child = try Child()
        let identity = try child.resolver.identify(pidfd: try ProcessHandle.pidfd(of: child.pid))
        #expect(identity.pid == child.pid && identity.uid == getuid())
        #expect(identity.establishedBy == .signedManifest(appID: "com.example.app") && identity.accessGroups == ["a", "shared"])
        try child.end()
    }

    @Test(.enabled(if: Fixture.hasClient, "cc could not build the client"))
    func identifiesALiveChildByPid() throws {
        let child = try Child()
        let start = try #require(IdentityResolver.startTime(ofPID: child.pid))
        for startTime in [start, nil] {
            let identity = try child.resolver.identify(pid: child.pid, uid: getuid(), startTime: startTime)
            #expect(identity.pid == child.pid && identity.uid == getuid())
            #expect(identity.establishedBy == .signedManifest(appID: "com.example.app"))
        }
        try child.end()
    }

    @Test(.enabled(if: Fixture.hasClient, "cc could not build the client"))
    func aProcessThatExitedGetsNoIdentityByPidOrPidfd() throws {
        let child = try Child()
        let pid = child.pid
        let start = try #require(IdentityResolver.startTime(ofPID: pid))
        let pidfd = try ProcessHandle.pidfd(of: pid) // taken while it lived, used after it is gone
        try child.end()
        var refused = false
        do { _ = try child.resolver.identify(pidfd: pidfd) } catch { refused = true }
        #expect(refused, "a pidfd whose process is gone identifies nobody")
        #expect(throws: IdentityError.self) { try child.resolver.identify(pid: pid, uid: getuid(), startTime: start) }
        #expect(throws: IdentityError.self) { try child.resolver.identify(pid: pid, uid: getuid(), startTime: nil) }
    }

    /// What was known of the process (its uid, its start time) is read again through the pidfd: a
    /// process that does not match is refused.
    @Test(.enabled(if: Fixture.hasClient, "cc could not build the client"))
    func aPidWhoseProcessDoesNotMatchWhatWasKnownIsRefused() throws {
        let child = try Child()
        let start = try #require(IdentityResolver.startTime(ofPID: child.pid))
        #expect(throws: IdentityError.self) { try child.resolver.identify(pid: child.pid, uid: getuid(), startTime: start + 1) }
        #expect(throws: IdentityError.self) { try child.resolver.identify(pid: child.pid, uid: getuid() &+ 1, startTime: start) }
        try child.end()
    }

    /// A pidfd a front end hands over (DELEGATE) with the pid and start time it read: identified when
    /// all agree, and each refusal tells its kind by errno (EBADF not a pidfd, EACCES another uid,
    /// ESRCH gone or not the process described).
    @Test(.enabled(if: Fixture.hasClient, "cc could not build the client"))
    func aDelegatedPidfdIsCheckedAgainstWhatTheFrontEndSays() throws {
        let child = try Child()
        let pid = child.pid
        let start = try #require(IdentityResolver.startTime(ofPID: pid))
        func errno(_ body: () throws(IdentityError) -> CallerIdentity) -> Int32? {
            do { _ = try body(); return nil } catch { return error.underlying.errno }
        }
        let identity = try child.resolver.identify(pidfd: try ProcessHandle.pidfd(of: pid), pid: pid, uid: getuid(), startTime: start)
        #expect(identity.pid == pid && identity.establishedBy == .signedManifest(appID: "com.example.app") && !identity.mayDelegate)
        #expect(errno { () throws(IdentityError) in try child.resolver.identify(pidfd: try! FileDescriptor.open("/dev/null", O_RDONLY),
                                                                                 pid: pid, uid: getuid(), startTime: start) } == EBADF)
        #expect(errno { () throws(IdentityError) in try child.resolver.identify(pidfd: try! ProcessHandle.pidfd(of: pid), pid: pid,
                                                                                 uid: getuid() &+ 1, startTime: start) } == EACCES)
        #expect(errno { () throws(IdentityError) in try child.resolver.identify(pidfd: try! ProcessHandle.pidfd(of: pid), pid: pid,
                                                                                 uid: getuid(), startTime: start + 1) } == ESRCH)
        #expect(errno { () throws(IdentityError) in try child.resolver.identify(pidfd: try! ProcessHandle.pidfd(of: pid), pid: getpid(),
                                                                                 uid: getuid(), startTime: start) } == ESRCH)
        let pidfd = try ProcessHandle.pidfd(of: pid)
        try child.end()
        var gone: Int32? = nil
        do { _ = try child.resolver.identify(pidfd: pidfd, pid: pid, uid: getuid(), startTime: start) } catch { gone = error.underlying.errno }
        #expect(gone == ESRCH, "a pidfd whose process was reaped")
    }

    /// Only a manifest that grants `delegate-identity` makes a caller that may delegate.
    @Test(.enabled(if: Fixture.hasClient, "cc could not build the client"))
    func theDelegationEntitlementComesFromTheManifest() throws {
        let child = try Child()
        let entitled = IdentityResolver(manifests: StaticManifestSource([
            try signedManifest(executable: child.app, sha256: try ExecutableHash.sha256(path: child.app), entitlements: [.delegateIdentity]),
        ]))
        #expect(try entitled.identify(pidfd: try ProcessHandle.pidfd(of: child.pid)).mayDelegate)
        #expect(try !child.resolver.identify(pidfd: try ProcessHandle.pidfd(of: child.pid)).mayDelegate)
        try child.end()
    }

    /// Only a manifest that grants `portal-secret` makes a caller that may ask for portal secrets, and
    /// that entitlement grants nothing else (no delegation); `delegate-identity` does not grant it.
    @Test(.enabled(if: Fixture.hasClient, "cc could not build the client"))
    func thePortalSecretEntitlementComesFromTheManifest() throws {
        let child = try Child()
        let sha = try ExecutableHash.sha256(path: child.app)
        let portal = try IdentityResolver(manifests: StaticManifestSource([
            try signedManifest(executable: child.app, sha256: sha, entitlements: [.portalSecret]),
        ])).identify(pidfd: try ProcessHandle.pidfd(of: child.pid))
        #expect(portal.mayServePortalSecrets && !portal.mayDelegate)
        let frontEnd = try IdentityResolver(manifests: StaticManifestSource([
            try signedManifest(executable: child.app, sha256: sha, entitlements: [.delegateIdentity]),
        ])).identify(pidfd: try ProcessHandle.pidfd(of: child.pid))
        #expect(!frontEnd.mayServePortalSecrets && frontEnd.mayDelegate)
        #expect(try !child.resolver.identify(pidfd: try ProcessHandle.pidfd(of: child.pid)).mayServePortalSecrets)
        try child.end()
    }

    /// The real race: the process exits, is reaped, and a new one takes its very pid (set through
    /// ns_last_pid, root only) — the same signed binary, the same uid. The pid names another process
    /// now, and its start time tells: refused, never identified as the one the caller knew.
    @Test(.enabled(if: Fixture.hasClient && getuid() == 0 && access("/proc/sys/kernel/ns_last_pid", W_OK) == 0,
                   "needs root (ns_last_pid) and cc"))
    func aProcessChangedUnderItsPidIsRefused() throws {
        var reused = false
        for _ in 0..<20 where !reused {
            let child = try Child()
            let pid = child.pid
            let start = try #require(IdentityResolver.startTime(ofPID: pid))
            // A start time counts clock ticks (10 ms at USER_HZ 100): live past one, so the impostor
            // starts in a later tick (a slow machine only makes it longer).
            usleep(30_000)
            try child.end()
            try "\(pid - 1)".write(toFile: "/proc/sys/kernel/ns_last_pid", atomically: false, encoding: .utf8)
            let impostor = try child.server.start(child.app)
            let impostorConnection = try child.server.accept()
            if impostor.processIdentifier == pid {
                reused = true
                #expect(throws: IdentityError.self) { try child.resolver.identify(pid: pid, uid: getuid(), startTime: start) }
                let now = try #require(IdentityResolver.startTime(ofPID: pid))
                #expect(try child.resolver.identify(pid: pid, uid: getuid(), startTime: now).isSigned, "the impostor is itself")
            }
            try impostorConnection.close()
            impostor.waitUntilExit()
        }
        try #require(reused, "no pid was reused in 20 attempts (a busy machine): the race was not exercised")
    }

    /// What the agent does with a connection: read the peer's credentials once at accept (the uid
    /// check), then identify it with them. `SO_PEERCRED` is read once in all.
    @Test(.enabled(if: Fixture.hasClient && SyscallCounting.available, "needs cc, and a debug build (SyscallFaults)"),
          arguments: IdentityResolverTests.modes)
    func aConnectionsPeerCredentialsAreReadOnce(usePeerPIDFD: Bool) throws {
        #if DEBUG
        let child = try Child()
        let fd = child.fd
        let key = PeerIdentity.credentialsKey(socket: fd)
        SyscallFaults.startCounting("getsockopt", path: key)
        let peer = try PeerIdentity.of(socket: fd)
        #expect(peer.uid == getuid() && peer.pid == child.pid)
        let resolver = IdentityResolver(manifests: child.resolver.manifests, usePeerPIDFD: usePeerPIDFD)
        let identity = try resolver.identify(socket: fd, peer: peer)
        #expect(identity.isSigned && identity.pid == child.pid)
        #expect(SyscallFaults.stopCounting("getsockopt", path: key) == 1, "one SO_PEERCRED read per connection")
        try child.end()
        #endif
    }
}

enum SyscallCounting {
    #if DEBUG
    static let available = true
    #else
    static let available = false
    #endif
}

@testable import CofferNativeFrontEnd
import CofferAgentPrompt
import CofferKeychain
import CofferModel
import CofferProtocol
import CofferService
import CofferServiceTestSupport
import CofferSystem
import Testing

/// Who may send the SYNC requests (WireProtocol.md, Sync), through `Pipeline.handle` without a socket:
/// the owner's own tools only, never a sandboxed app or a delegated connection.
@Suite struct SyncRequestTests {
    @Test func onlyTheOwnersUndelegatedToolsReachTheSync() throws {
        let rig = try AgentRig(passcodeSet: false)
        let pipeline = Pipeline(service: rig.base.service, sync: SyncService(service: rig.base.service, settings: SyncService.Settings()))
        // The CLI (unsigned; unsigned callers share a group by default): the status, without waiting for any sync.
        var own = rig.greetedSession()
        guard case .syncStatus(let s) = pipeline.handle(.syncStatus(now: false), session: &own) else {
            Issue.record("no status")
            return
        }
        #expect(s.state == .unknown && !s.running)
        // The same caller on a delegated connection (a front end serving it): refused, nothing run.
        var delegated = rig.greetedSession()
        delegated.delegate(to: rig.unsignedCaller, startTime: 0)
        for request: AgentRequest in [.syncStatus(now: false), .syncSetup(.initialize, remote: "/nonexistent", name: "x"),
                                      .syncCircle(.approve, argument: "ABCD-EFGH"), .syncConflicts(restore: nil)] {
            #expect(errorStatus(pipeline.handle(request, session: &delegated)) == .missingEntitlement, "\(request)")
        }
        // A Flatpak app: refused.
        let app = CallerIdentity(pid: rig.peer.pid, uid: rig.peer.uid, establishedBy: .flatpak(appID: "org.example.App"),
                                 accessGroups: ["flatpak:org.example.App"])
        var sandboxed = rig.greetedSession(as: app)
        #expect(errorStatus(pipeline.handle(.syncSetup(.join, remote: "/nonexistent", name: "x"), session: &sandboxed)) == .missingEntitlement)
        #expect(errorStatus(pipeline.handle(.syncCircle(.devices, argument: ""), session: &sandboxed)) == .missingEntitlement)
        // Sync not set up here: the circle requests say so.
        #expect(errorStatus(pipeline.handle(.syncCircle(.devices, argument: ""), session: &own)) == .notAvailable)
        // An agent built without sync answers that it does not sync.
        var plain = rig.greetedSession()
        #expect(errorStatus(rig.pipeline.handle(.syncStatus(now: false), session: &plain)) == .unimplemented)
    }

    @Test func aTokenInTheRemoteNeverReachesTheStatusOrTheLog() {
        let message = "git fetch failed (128): fatal: unable to access 'https://me:ghp_SECRET@git.example/keys.git/': 403"
        let shown = SyncService.redacted(message)
        #expect(!shown.contains("ghp_SECRET") && !shown.contains("me:"))
        #expect(shown == "git fetch failed (128): fatal: unable to access 'https://***@git.example/keys.git/': 403")
        #expect(SyncService.redacted("ssh://host/keys.git and /srv/keys.git") == "ssh://host/keys.git and /srv/keys.git")
    }
}

/// PROMPT_UNLOCK for a Flatpak app (a front end serving it): refused before the agent's prompter is
/// even made, so nobody types a password that would then be refused.
@Suite struct PromptUnlockOrderTests {
    @Test func aSandboxedAppsPromptUnlockAsksNobody() throws {
        let rig = try AgentRig(passcodeSet: true)
        rig.keychain.lock()
        let asked = Protected(0)
        let pipeline = Pipeline(service: rig.base.service, promptChannel: {
            asked.withLock { $0 += 1 }
            return .failure(.noPinentry("test"))
        })
        let app = CallerIdentity(pid: rig.peer.pid, uid: rig.peer.uid, establishedBy: .flatpak(appID: "org.example.App"),
                                 accessGroups: ["flatpak:org.example.App"])
        var delegated = rig.greetedSession()
        delegated.delegate(to: app, startTime: 0)
        #expect(errorStatus(pipeline.handle(.promptUnlock, session: &delegated)) == .missingEntitlement)
        #expect(asked.withLock { $0 } == 0, "the prompter was made for a caller that may not try the passcode")
        // The same for an unsigned caller reaches the prompter (which answers that nobody can be asked).
        var unsigned = rig.greetedSession()
        unsigned.delegate(to: rig.unsignedCaller, startTime: 0)
        #expect(errorStatus(pipeline.handle(.promptUnlock, session: &unsigned)) == .interactionNotAllowed)
        #expect(asked.withLock { $0 } == 1)
    }
}

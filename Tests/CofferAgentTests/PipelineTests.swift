@testable import CofferAgent
@testable import CofferNativeFrontEnd
import CofferCrypto
import CofferKeychain
import CofferServiceTestSupport
import CofferTestSupport
import CofferModel
import CofferProtocol
import CofferSSHAgentProtocol
import Testing

/// The HELLO rules and the idle-lock activity rule, through `Pipeline.handle` without a socket.
@Suite struct HelloTests {
    let hello = AgentRequest.hello(minVersion: WireFormat.version, maxVersion: WireFormat.version, clientName: "test")
    let add = AgentRequest.add(NewItem(itemClass: .genericPassword, attributes: ["svce": .string("s"), "acct": .string("a")],
                                  secret: secret("x")), [])

    @Test func helloIsAcceptedAndRecordedInTheSession() throws {
        let rig = try AgentRig()
        var s = rig.newSession()
        guard case .helloReply(let v, let agent) = rig.pipeline.handle(hello, session: &s) else { Issue.record("no HELLO_REPLY"); return }
        #expect(v == WireFormat.version && agent == Agent.version)
        #expect(s.isGreeted && s.protocolVersion == WireFormat.version && s.clientName == "test" && !s.mustClose)
    }

    @Test func theFirstMessageMustBeHello() throws {
        let rig = try AgentRig(passcodeSet: false)
        var s = rig.newSession()
        #expect(errorStatus(rig.pipeline.handle(add, session: &s)) == .param)
        #expect(s.mustClose && !s.isGreeted)
        #expect(try rig.keychain.count() == 0, "a request before HELLO ran")
    }

    @Test(arguments: [(UInt16(0), UInt16(0)), (WireFormat.version + 1, WireFormat.version + 3)])
    func aVersionRangeWithoutOursIsRefused(range: (UInt16, UInt16)) throws {
        let rig = try AgentRig()
        var s = rig.newSession()
        let r = rig.pipeline.handle(.hello(minVersion: range.0, maxVersion: range.1, clientName: "old"), session: &s)
        #expect(errorStatus(r) == .param)
        #expect(s.mustClose && !s.isGreeted)
    }

    @Test func aRangeHoldingOursIsAccepted() throws {
        let rig = try AgentRig()
        var s = rig.newSession()
        _ = rig.pipeline.handle(.hello(minVersion: 0, maxVersion: .max, clientName: "new"), session: &s)
        #expect(s.isGreeted && s.protocolVersion == WireFormat.version)
    }

    /// The connection speaks the highest version in both ranges: a client of version 1 alone gets 1
    /// (and AUTH_FEEDBACK without a kind), one that announces 2 gets 2, one that announces 3 gets 3
    /// (PROMPT_READ's grant, the access-state flag).
    @Test(arguments: [(UInt16(1), UInt16(1), UInt16(1)), (1, 2, 2), (2, 2, 2), (1, 3, 3), (3, 3, 3), (1, 3, 3), (1, 9, 4), (4, 4, 4), (0, 1, 1)])
    func theHighestCommonVersionIsChosen(range: (UInt16, UInt16, UInt16)) throws {
        let rig = try AgentRig()
        var s = rig.newSession()
        guard case .helloReply(let v, _) = rig.pipeline.handle(.hello(minVersion: range.0, maxVersion: range.1, clientName: "v"), session: &s) else {
            Issue.record("refused \(range)"); return
        }
        #expect(v == range.2 && s.protocolVersion == range.2)
    }

    /// COUNTERS: the agent's own counts, each request one (this one included), and only for the
    /// owner's tools: a signed app or a Flatpak app is refused -34018 (the counts move with other apps' reads).
    @Test func countersCountAndAreTheOwnersToolsAlone() throws {
        let rig = try AgentRig()
        var s = rig.greetedSession()
        guard case .counters(let a) = rig.pipeline.handle(.counters, session: &s),
              case .counters(let b) = rig.pipeline.handle(.counters, session: &s) else { Issue.record("COUNTERS was not answered"); return }
        #expect(a.connections >= 1 && b.requests == a.requests + 1 && b.connections == a.connections && b.searches == a.searches)
        _ = rig.pipeline.handle(.copyMatching(ItemQuery(itemClass: .genericPassword, attributes: ["svce": .string("none")])), session: &s)
        guard case .counters(let c) = rig.pipeline.handle(.counters, session: &s) else { Issue.record("COUNTERS was not answered"); return }
        #expect(c.requests == b.requests + 2 && c.searches > b.searches, "\(b) then \(c)")
        var app = rig.greetedSession(as: rig.signedCaller("org.example.App", ["org.example.App"]))
        guard case .error(let e) = rig.pipeline.handle(.counters, session: &app) else { Issue.record("a signed app read the counters"); return }
        #expect(e.status == .missingEntitlement)
    }

    @Test func aSecondHelloIsAnErrorButKeepsTheSession() throws {
        let rig = try AgentRig()
        var s = rig.greetedSession()
        #expect(errorStatus(rig.pipeline.handle(hello, session: &s)) == .param)
        #expect(s.isGreeted && !s.mustClose)
    }

    @Test func aRequestPipelinedBehindARefusedHelloNeverRuns() throws {
        let rig = try AgentRig(passcodeSet: false)
        var s = rig.newSession()
        _ = rig.pipeline.handle(.hello(minVersion: 99, maxVersion: 99, clientName: "x"), session: &s)
        #expect(s.mustClose)
        // The client already sent these behind its HELLO; the server stops reading, and even if it were
        // handed them, the pipeline runs nothing on a closing session.
        #expect(errorStatus(rig.pipeline.handle(hello, session: &s)) == .param)
        #expect(errorStatus(rig.pipeline.handle(add, session: &s)) == .param)
        #expect(!s.isGreeted)
        #expect(try rig.keychain.count() == 0)
    }

    @Test func statusReportsTheTypedLockState() throws {
        let rig = try AgentRig()
        var s = rig.greetedSession()
        guard case .status(let st) = rig.pipeline.handle(.status, session: &s) else { Issue.record("no STATUS_REPLY"); return }
        #expect(st.lockState == .unlocked && st.passcodeSet && st.itemCount == 0)
        _ = rig.pipeline.handle(.lock, session: &s)
        guard case .status(let after) = rig.pipeline.handle(.status, session: &s) else { Issue.record("no STATUS_REPLY"); return }
        #expect(after.lockState == .locked)
    }

    @Test func subscribeMarksTheSession() throws {
        let rig = try AgentRig()
        var s = rig.greetedSession()
        #expect(s.eventTopics.isEmpty)
        guard case .ok = rig.pipeline.handle(.subscribe, session: &s) else { Issue.record("SUBSCRIBE not OK"); return }
        #expect(s.eventTopics == .lock)
    }

    /// Item changes are told only to a caller entitled to delegate: anyone else gets -34018 and keeps
    /// what it had.
    @Test func itemChangesAreRefusedToACallerThatMayNotDelegate() throws {
        let rig = try AgentRig()
        var s = rig.greetedSession()
        #expect(!s.caller.mayDelegate)
        guard case .error(let e) = rig.pipeline.handle(.subscribeTo([.lock, .items]), session: &s) else {
            Issue.record("SUBSCRIBE to items was not refused"); return
        }
        #expect(e.status == .missingEntitlement)
        #expect(s.eventTopics.isEmpty)
        guard case .ok = rig.pipeline.handle(.subscribeTo(.lock), session: &s) else { Issue.record("SUBSCRIBE to lock not OK"); return }
        #expect(s.eventTopics == .lock)
    }
}

/// KEY_SIGN (issue #46): a key made with KEY_CREATE signs through the pipeline; a key item the caller stored
/// itself, or no match, is refused before anyone would be asked.
@Suite struct KeySignTests {
    @Test func aKeyMadeInTheAgentSignsAndOthersAreRefused() throws {
        let rig = try AgentRig()
        var s = rig.greetedSession()
        let made = rig.pipeline.handle(.keyCreate(.generate, attributes: ["type": .integer(2100), "atag": .data([1])], [.attributes, .persistentRef]),
                                       session: &s)
        guard case .items(let items) = made, let ref = items.first?.persistentRef,
              case .data(let blob)? = items.first?.attributes?[KeyItem.publicKeyAttribute] else { Issue.record("\(made)"); return }
        let data: [UInt8] = Array("to be signed".utf8)
        let r = rig.pipeline.handle(.keySign(ItemQuery(itemClass: .key, persistentRef: ref), data: data, flags: 0), session: &s)
        guard case .signature(let signatureBlob) = r else { Issue.record("\(r)"); return }
        guard case .ed25519(let publicKey) = try SSHWirePublicKey(blob: blob),
              case .ed25519(let signature) = try SSHWireSignature(blob: signatureBlob) else { Issue.record("not Ed25519"); return }
        #expect(Ed25519.verify(signature: signature, message: data, publicKey: publicKey))
        #expect(!Ed25519.verify(signature: signature, message: data + [0], publicKey: publicKey))

        // A key item whose private half the caller gave (ADD): not the agent's to sign with.
        _ = rig.pipeline.handle(.add(NewItem(itemClass: .key, attributes: ["kcls": .integer(1), "type": .integer(2100), "atag": .data([2])],
                                             secret: secret(String(repeating: "k", count: 32))), []), session: &s)
        #expect(errorStatus(rig.pipeline.handle(.keySign(ItemQuery(itemClass: .key, attributes: ["atag": .data([2])]), data: data, flags: 0),
                                                session: &s)) == .param)
        #expect(errorStatus(rig.pipeline.handle(.keySign(ItemQuery(itemClass: .key, attributes: ["atag": .data([3])]), data: data, flags: 0),
                                                session: &s)) == .itemNotFound)
    }
}

@testable import CofferNativeFrontEnd
import CofferKeychain
import CofferServiceTestSupport
import CofferTestSupport
import CofferModel
import CofferPolicy
@testable import CofferProtocol
import Testing

/// WireProtocol.md rules that need no socket, through `Pipeline` (issue #12).
@Suite struct ProtocolRulesTests {
    let add = AgentRequest.add(NewItem(itemClass: .genericPassword, attributes: ["svce": .string("s"), "acct": .string("a")],
                                  secret: secret("x")), [])

    /// Any first frame that is not an acceptable, well-formed HELLO closes: a malformed HELLO used to
    /// leave the session open, so a HELLO and an ADD pipelined behind it ran.
    @Test func aMalformedFirstFrameClosesTheSession() throws {
        let rig = try AgentRig(passcodeSet: false)
        var s = rig.newSession()
        let r = rig.pipeline.refuse(ProtocolError("truncated client name"), session: &s)
        #expect(errorStatus(r) == .param)
        #expect(s.mustClose && !s.isGreeted)
        _ = rig.pipeline.handle(.hello(minVersion: 1, maxVersion: 1, clientName: "t"), session: &s)
        #expect(errorStatus(rig.pipeline.handle(add, session: &s)) == .param)
        #expect(try rig.keychain.count() == 0, "a request behind a malformed HELLO ran")
    }

    /// After HELLO a malformed frame is an error and the connection stays usable.
    @Test func aMalformedFrameAfterHelloKeepsTheSession() throws {
        let rig = try AgentRig(passcodeSet: false)
        var s = rig.greetedSession()
        #expect(errorStatus(rig.pipeline.refuse(ProtocolError("unknown message type"), session: &s)) == .param)
        #expect(!s.mustClose && s.isGreeted)
        guard case .items = rig.pipeline.handle(add, session: &s) else { Issue.record("ADD after an error"); return }
        #expect(try rig.keychain.count() == 1)
    }

    /// HELLO with min > max holds no version: refused and closed; the message quotes no number.
    @Test func aHelloWithMinAboveMaxIsRefused() throws {
        let rig = try AgentRig()
        var s = rig.newSession()
        let r = rig.pipeline.handle(.hello(minVersion: 7_777, maxVersion: 1, clientName: "x"), session: &s)
        guard case .error(let e) = r else { Issue.record("accepted"); return }
        #expect(e.status == .param && !e.message.contains("7777"))
        #expect(s.mustClose && !s.isGreeted)
    }

    /// Keychain messages name attributes, never what the caller sent: an unknown name is not quoted.
    @Test func validationErrorsQuoteNoCallerBytes() throws {
        let rig = try AgentRig(passcodeSet: false)
        var s = rig.greetedSession()
        let marker = "zq-SECRET-NAME"
        let requests: [AgentRequest] = [
            .add(NewItem(itemClass: .genericPassword, attributes: [marker: .string("v")], secret: secret("x")), []),
            .add(NewItem(itemClass: .genericPassword, attributes: ["svce": .string(marker), "labl": .integer(0x7A7A_7A7A)],
                         secret: secret("x")), []),
            .add(NewItem(itemClass: .genericPassword, attributes: ["pdmn": .string(marker)], secret: secret("x")), []),
            .add(NewItem(itemClass: .genericPassword, attributes: ["labl": .string(marker + String(repeating: "x", count: 5000))],
                         secret: secret("x")), []),
            .copyMatching(ItemQuery(attributes: [marker: .data(Array(marker.utf8))])),
            .update(ItemQuery(limit: .all), ItemChanges(attributes: [marker: .bool(true)])),
            .update(ItemQuery(limit: .all), ItemChanges(attributes: ["cdat": .date(2054847098)])),
            .delete(ItemQuery(itemClass: .certificate, attributes: ["svce": .string(marker)], limit: .all)),
        ]
        for r in requests {
            guard case .error(let e) = rig.pipeline.handle(r, session: &s) else { Issue.record("accepted \(r)"); continue }
            #expect(e.status == .param)
            #expect(!e.message.contains(marker) && !e.message.contains("2054847098") && !e.message.contains("14"), "\(e.message)")
        }
    }

    /// The duplicate rules of the attribute table: an item differing only in `pdmn` is a duplicate
    /// (protection is not part of any primary key); one differing only in `agrp` is not.
    @Test func duplicateRules() throws {
        let rig = try AgentRig()
        var s = rig.greetedSession(as: rig.signedCaller("app.a", ["app.a", "other.group"]))
        func adding(_ extra: Attributes) -> AgentRequest {
            .add(NewItem(itemClass: .genericPassword, attributes: ["svce": .string("s"), "acct": .string("a")].merging(extra) { $1 },
                         secret: secret("x")), [])
        }
        guard case .items = rig.pipeline.handle(adding(["pdmn": .string("ak")]), session: &s) else { Issue.record("first add"); return }
        #expect(errorStatus(rig.pipeline.handle(adding(["pdmn": .string("dku")]), session: &s)) == .duplicateItem)
        #expect(errorStatus(rig.pipeline.handle(adding([:]), session: &s)) == .duplicateItem)
        guard case .items = rig.pipeline.handle(adding(["agrp": .string("other.group")]), session: &s) else {
            Issue.record("an item differing only in agrp was refused"); return
        }
        #expect(try rig.keychain.count() == 2)
        // Other classes: two certificates or keys with the same primary key but different pdmn too.
        let cert = AgentRequest.add(NewItem(itemClass: .certificate, attributes: ["ctyp": .integer(1), "issr": .data([1]), "slnr": .data([2])],
                                       secret: secret("c")), [])
        guard case .items = rig.pipeline.handle(cert, session: &s) else { Issue.record("cert"); return }
        let certDK = AgentRequest.add(NewItem(itemClass: .certificate, attributes: ["ctyp": .integer(1), "issr": .data([1]), "slnr": .data([2]),
                                                                              "pdmn": .string("dk")], secret: secret("c")), [])
        #expect(errorStatus(rig.pipeline.handle(certDK, session: &s)) == .duplicateItem)
    }

    /// Agent-set attributes: `cdat`/`mdat` are refused in ADD and UPDATE, allowed in queries; ADD
    /// fills in `pdmn`, `agrp`, `sync`, `cdat`, `mdat`; `sync` true is accepted.
    @Test func agentSetAndDefaultedAttributes() throws {
        let rig = try AgentRig()
        var s = rig.greetedSession()
        let withDate = AgentRequest.add(NewItem(itemClass: .genericPassword, attributes: ["svce": .string("s"), "cdat": .date(1)],
                                           secret: secret("x")), [])
        #expect(errorStatus(rig.pipeline.handle(withDate, session: &s)) == .param)
        let synced = AgentRequest.add(NewItem(itemClass: .genericPassword, attributes: ["svce": .string("s"), "sync": .bool(true)],
                                         secret: secret("x")), [])
        #expect(errorStatus(rig.pipeline.handle(synced, session: &s)) == nil)   // accepted since sync (issue #29)
        let plain = AgentRequest.add(NewItem(itemClass: .genericPassword, attributes: ["svce": .string("s")], secret: secret("x")),
                                [.attributes, .persistentRef])
        guard case .items(let items) = rig.pipeline.handle(plain, session: &s), let item = items.first,
              let attrs = item.attributes else { Issue.record("add"); return }
        #expect(attrs["pdmn"] == .string("ak") && attrs["agrp"] == .string(AccessPolicy.unsignedGroup) && attrs["sync"] == .bool(false))
        #expect(attrs["cdat"] != nil && attrs["cdat"] == attrs["mdat"] && attrs["class"] == nil)
        #expect(item.persistentRef?.count == 16)
        #expect(errorStatus(rig.pipeline.handle(.update(ItemQuery(limit: .all), ItemChanges(attributes: ["mdat": .date(5)])),
                                                session: &s)) == .param)
        guard case .items(let found) = rig.pipeline.handle(.copyMatching(ItemQuery(attributes: ["cdat": attrs["cdat"]!],
                                                                                   returnPersistentRef: true)), session: &s)
        else { Issue.record("a query on cdat"); return }
        #expect(found.first?.persistentRef == item.persistentRef)
    }
}

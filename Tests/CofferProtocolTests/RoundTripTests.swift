import CofferCrypto
import CofferModel
@testable import CofferProtocol
import CofferTestSupport
import Testing

func roundTrip(_ r: AgentRequest, id: UInt32 = 42) throws -> AgentRequest {
    let frame = r.encodeFrame(requestID: id)
    let (gotID, got) = try Array(frame[4...]).withUnsafeBytes { try AgentRequest.decodeBody($0) }
    #expect(gotID == id)
    #expect(Array(frame[4...]).count == Int(frame[3]) | Int(frame[2]) << 8 | Int(frame[1]) << 16)
    return got
}

func roundTrip(_ r: AgentResponse, id: UInt32 = 42) throws -> AgentResponse {
    let frame = r.encodeFrame(requestID: id)
    return try Array(frame[4...]).withUnsafeBytes { try AgentResponse.decodeBody($0) }.1
}

@Suite struct RoundTripTests {
    /// AUTH_FEEDBACK (no kind, version 1) and AUTH_FEEDBACK_KIND (version 2) are two message types,
    /// so a decoder needs no version to tell them apart; an unknown kind is malformed.
    @Test func feedbackWithAndWithoutAKind() throws {
        for kind in [nil, AuthFeedbackKind.notice, .wrongPasscode, .noMatch, .passcodeOnly] {
            let frame = AgentResponse.authFeedback("t", kind: kind).encodeFrame(requestID: 7)
            #expect(frame[4] == (kind == nil ? MessageType.authFeedback : .authFeedbackKind).rawValue)
            guard case .authFeedback("t", let back) = try roundTrip(.authFeedback("t", kind: kind), id: 7) else { Issue.record("\(String(describing: kind))"); return }
            #expect(back == kind)
        }
        var unknown = AgentResponse.authFeedback("t", kind: .noMatch).encodeFrame(requestID: 7)
        unknown[9] = 4
        #expect(throws: ProtocolError.self) { try Array(unknown[4...]).withUnsafeBytes { try AgentResponse.decodeBody($0) } }
    }

    let attrs: Attributes = ["svce": .string("s"), "port": .integer(-7), "gena": .data([0, 1, 255]),
                             "invi": .bool(true), "cdat": .date(1.5e9), "labl": .string("ünïcødé")]

    @Test func everyRequestKind() throws {
        guard case .hello(1, 3, "x") = try roundTrip(.hello(minVersion: 1, maxVersion: 3, clientName: "x")) else { Issue.record("hello"); return }
        guard case .unlock(let p) = try roundTrip(.unlock(passcode: secret("pw"))), text(p) == "pw" else { Issue.record("unlock"); return }
        guard case .setPasscode(let c, let n) = try roundTrip(.setPasscode(current: secret("a"), new: secret("b"))),
              text(c) == "a", text(n) == "b" else { Issue.record("setPasscode"); return }
        guard case .add(let item, let flags) = try roundTrip(.add(NewItem(itemClass: .key, attributes: attrs.filter { $0.key != "svce" && $0.key != "port" && $0.key != "invi" }, secret: secret("k")), [.data, .persistentRef])),
              item.itemClass == .key, text(item.secret) == "k", flags == [.data, .persistentRef] else { Issue.record("add"); return }
        let q = ItemQuery(itemClass: nil, attributes: attrs, limit: .count(7), returnData: true, returnAttributes: true,
                          returnPersistentRef: false, persistentRef: [UInt8](repeating: 9, count: 16))
        guard case .copyMatching(let q2) = try roundTrip(.copyMatching(q)) else { Issue.record("copy"); return }
        #expect(q2.attributes == attrs && q2.limit == .count(7) && q2.returnData && q2.returnAttributes && !q2.returnPersistentRef)
        #expect(q2.persistentRef == [UInt8](repeating: 9, count: 16) && q2.itemClass == nil)
        // UPDATE and DELETE take a query that acts on every match (issue #12): limit all, no return flags.
        let every = ItemQuery(itemClass: nil, attributes: attrs, limit: .all, persistentRef: [UInt8](repeating: 9, count: 16))
        guard case .update(_, let ch) = try roundTrip(.update(every, ItemChanges(attributes: ["labl": .string("n")], secret: secret("z")))),
              text(ch.secret) == "z", ch.attributes == ["labl": .string("n")] else { Issue.record("update"); return }
        guard case .update(_, let ch2) = try roundTrip(.update(every, ItemChanges(attributes: ["labl": .string("n")]))), ch2.secret == nil
        else { Issue.record("update without secret"); return }
        guard case .delete(let dq) = try roundTrip(.delete(ItemQuery(limit: .all))), dq.limit == .all else { Issue.record("delete"); return }
        for r in [AgentRequest.status, .lock, .subscribe] { _ = try roundTrip(r) }
    }

    /// KEY_SIGN: a query for one key (whatever limit or return flags the caller's query had: the encoder
    /// sends limit one and no flags), the data and ssh-agent's signature flags; KEY_SIGNATURE: the blob.
    /// The decoder refuses another limit, return flags, a class other than keys, undefined flags.
    @Test func keySignAndItsSignature() throws {
        let ref = [UInt8](repeating: 7, count: 16)
        let asked = ItemQuery(itemClass: .key, attributes: ["atag": .data([1, 2])], limit: .all, returnData: true, persistentRef: ref)
        guard case .keySign(let q, let data, let flags) = try roundTrip(.keySign(asked, data: [9, 8, 7], flags: 4)) else {
            Issue.record("keySign"); return
        }
        #expect(q.itemClass == .key && q.persistentRef == ref && q.attributes == ["atag": .data([1, 2])])
        #expect(q.limit == .one && !q.returnData && !q.returnAttributes && !q.returnPersistentRef)
        #expect(data == [9, 8, 7] && flags == 4)
        guard case .signature(let blob) = try roundTrip(AgentResponse.signature([1, 2, 3])), blob == [1, 2, 3] else { Issue.record("signature"); return }

        func refused(_ edit: (inout [UInt8]) -> Void) -> Bool {
            var frame = AgentRequest.keySign(ItemQuery(itemClass: .key, persistentRef: ref), data: [1], flags: 0).encodeFrame(requestID: 1)
            edit(&frame)
            return (try? Array(frame[4...]).withUnsafeBytes { try AgentRequest.decodeBody($0) }) == nil
        }
        // Body offsets: type 4, id 5-8, class 9, attribute count 10-11, limit kind 12, count 13-16, flags 17.
        #expect(!refused { _ in })
        #expect(refused { $0[12] = 1 }, "limit all")
        #expect(refused { $0[17] = 1 }, "return data")
        #expect(refused { $0[9] = 4 }, "class cert")
        #expect(refused { $0[$0.count - 1] = 1 }, "undefined signature flag bit 0")
        var empty = AgentResponse.signature([1]).encodeFrame(requestID: 1)
        empty[12] = 0
        empty.removeLast()
        empty[3] -= 1
        #expect(throws: ProtocolError.self) { try Array(empty[4...]).withUnsafeBytes { try AgentResponse.decodeBody($0) } }
    }

    @Test func everyResponseKind() throws {
        let s = StatusReply(lockState: .unlocked, passcodeSet: true, itemCount: 1 << 40, agentVersion: "v", lockedMemoryBytes: 8192, idleLockSeconds: 60)
        guard case .status(let s2) = try roundTrip(.status(s)), s2 == s else { Issue.record("status"); return }
        let items = [ItemResult(itemClass: .internetPassword, attributes: attrs, data: secret("d"), persistentRef: [UInt8](repeating: 1, count: 16)),
                     ItemResult(itemClass: .certificate)]
        guard case .items(let i2) = try roundTrip(.items(items)), i2.count == 2, i2[0].attributes == attrs, text(i2[0].data) == "d",
              i2[0].persistentRef?.count == 16, i2[1].attributes == nil, i2[1].data == nil else { Issue.record("items"); return }
        for e in [LockEvent.willLock(graceMillis: 5), .locked, .unlocked] {
            guard case .event(let e2) = try roundTrip(.event(e)), e2 == e else { Issue.record("event"); return }
        }
        for status in SecStatus.allCases where status != .success {
            guard case .error(let e) = try roundTrip(.error(SecError(status, "m"))), e.status == status, e.message == "m" else {
                Issue.record("error \(status)"); return
            }
        }
        #expect(AgentResponse.items(items).carriesSecret && !AgentResponse.items([items[1]]).carriesSecret)
        #expect(AgentRequest.unlock(passcode: secret("x")).carriesSecret && !AgentRequest.status.carriesSecret)
    }

    /// The size a reply is planned with is the size it is written with, for every kind of value and
    /// name: ASCII and not, empty values, a name longer than a short string holds (cut at a whole
    /// character), and an item's own size.
    @Test func attributeSizesAreTheEncodedSizes() {
        let long = String(repeating: "é", count: 40_000) // 80,000 bytes: cut to 65,534, a whole character
        let cases: [Attributes] = [
            [:],
            ["acct": .string("alice"), "svce": .string(""), "labl": .string("Äpfel ☃ 𝄞")],
            ["type": .integer(-1), "cdat": .date(1_700_000_000.5), "sync": .bool(true), "gena": .data([]), "alis": .data([1, 2, 3])],
            ["@xdg:schema": .string("org.example.Password"), "@ü": .string(String(repeating: "x", count: 70_000))],
            [long: .string("v"), "a": .bool(false)],
        ]
        for attrs in cases {
            #expect(AttributeCodec.encodedSize(attrs) == AttributeCodec.encode(attrs).count, "\(attrs.keys.map { $0.utf8.count })")
            for (_, v) in attrs {
                var w = ByteWriter()
                AttributeCodec.encode(v, into: &w)
                #expect(AttributeCodec.encodedSize(v) == w.bytes.count)
            }
            let item = ItemResult(itemClass: .genericPassword, attributes: attrs, data: secret("pw"), persistentRef: [UInt8](repeating: 7, count: 16))
            #expect(WireFormat.encodedSize(of: item) + WireFormat.itemsHeaderBytes == AgentResponse.items([item]).encodeFrame(requestID: 1).count - 4)
        }
    }

    /// The encoder orders names by their bytes, comparing the first eight as one number: names that
    /// differ only after eight bytes, that are prefixes of one another, that hold NUL (which the
    /// zero padding must not confuse with "shorter"), or whose normalised order differs from their byte
    /// order are written in byte order all the same, and decode back to the same dictionary.
    @Test func namesAreWrittenInByteOrder() throws {
        let pieces = ["", "a", "b", "\u{0}", "é", "e\u{301}", "@coffer:", "zzzzzzzz", "Ω", "\u{7F}"]
        var rng = SystemRandomNumberGenerator()
        for _ in 0..<300 {
            var attrs: Attributes = [:]
            for _ in 0..<Int.random(in: 1...24, using: &rng) {
                let name = (0..<Int.random(in: 1...5, using: &rng)).map { _ in pieces.randomElement(using: &rng)! }.joined()
                if !name.isEmpty { attrs[name] = .integer(Int64(attrs.count)) }
            }
            let bytes = AttributeCodec.encode(attrs)
            var r = ByteReader(bytes)
            var written: [[UInt8]] = []
            for _ in 0..<Int(try r.u16()) {
                written.append(Array(try r.raw(Int(try r.u16()))))
                _ = try AttributeCodec.decodeValue(from: &r)
            }
            #expect(written == attrs.keys.map { Array($0.utf8) }.sorted { $0.lexicographicallyPrecedes($1) }, "\(attrs.keys.map(\.debugDescription))")
            // The decoder takes only names of 1 to 32 bytes: the short ones round-trip.
            if attrs.keys.allSatisfy({ $0.utf8.count <= 32 }) {
                var back = ByteReader(bytes)
                #expect(try AttributeCodec.decodeAttributes(from: &back) == attrs)
            }
        }
    }

    /// EVENT itemsChanged carries 0: any other value is malformed (a reply, so not a request vector).
    @Test func anItemsChangedEventWithAValueIsMalformed() throws {
        let good = AgentResponse.event(.itemsChanged(groups: nil)).encodeFrame(requestID: 0)
        #expect(good == [0, 0, 0, 0x0a, 0xc0, 0, 0, 0, 0, 0x04, 0, 0, 0, 0])
        var bad = good
        bad[13] = 1
        #expect(throws: ProtocolError.self) { _ = try Array(bad[4...]).withUnsafeBytes { try AgentResponse.decodeBody($0) } }
        let (_, decoded) = try Array(good[4...]).withUnsafeBytes { try AgentResponse.decodeBody($0) }
        guard case .event(.itemsChanged(nil)) = decoded else { Issue.record("\(decoded)"); return }
    }

    /// Kind 5 names the groups that changed: 1 to 256 non-empty names in ascending byte order. A
    /// count of 0 or over 256, an empty name, names out of order or repeated, and a cut-short name
    /// are malformed; the model sorts a set into that order and names none for more than 256.
    @Test func anItemsChangedEventNamesItsGroupsInOrder() throws {
        func frame(_ count: UInt32, _ names: [String]) -> [UInt8] {
            var w = ByteWriter()
            w.u8(0xc0); w.u32(0); w.u8(5); w.u32(count)
            for n in names { w.shortString(n) }
            return w.bytes
        }
        func decode(_ body: [UInt8]) throws -> AgentResponse { try body.withUnsafeBytes { try AgentResponse.decodeBody($0).1 } }
        let event = LockEvent.itemsChanged(in: ["zeta", "Alpha", "alpha", "é"])
        #expect(event == .itemsChanged(groups: ["Alpha", "alpha", "zeta", "é"]))
        let encoded = AgentResponse.event(event).encodeFrame(requestID: 0)
        #expect(Array(encoded[4...]) == frame(4, ["Alpha", "alpha", "zeta", "é"]))
        guard case .event(let back) = try decode(Array(encoded[4...])) else { Issue.record("not an event"); return }
        #expect(back == event)
        for (what, body) in [("no group", frame(0, [])), ("257 groups", frame(257, (0..<257).map { "g\(1000 + $0)" })),
                             ("an empty group", frame(1, [""])), ("out of order", frame(2, ["b", "a"])),
                             ("repeated", frame(2, ["a", "a"])), ("cut short", Array(frame(2, ["a", "b"]).dropLast()))] {
            #expect(throws: ProtocolError.self, "\(what)") { _ = try decode(body) }
        }
        #expect(LockEvent.itemsChanged(in: Set((0..<257).map { "g\($0)" })) == .itemsChanged(groups: nil))
        #expect(LockEvent.itemsChanged(in: []) == .itemsChanged(groups: nil))
        // 16 names of 4,094 bytes fit in 65,536 bytes with their lengths; a 17th does not.
        let long = (0..<17).map { "\($0)" + String(repeating: "g", count: 4094 - "\($0)".utf8.count) }
        #expect(LockEvent.itemsChanged(in: Set(long.prefix(16))) == .itemsChanged(groups: long.prefix(16).sorted()))
        #expect(LockEvent.itemsChanged(in: Set(long)) == .itemsChanged(groups: nil))
        // What a subscriber receives: the groups only if it asked for them.
        #expect(event.delivered(to: [.lock, .items]) == .itemsChanged(groups: nil))
        #expect(event.delivered(to: [.itemGroups]) == event)
        #expect(event.delivered(to: .lock) == nil)
        #expect(LockEvent.locked.delivered(to: [.items, .itemGroups]) == nil)
    }

    @Test func secretsDoNotLeakIntoErrors() {
        // A frame whose passcode field claims more bytes than exist: the message names the field only.
        let frame: [UInt8] = [3, 0, 0, 0, 1, 0, 0, 0, 9] + Array("hunter".utf8)
        do { _ = try frame.withUnsafeBytes { try AgentRequest.decodeBody($0) }; Issue.record("decoded") } catch let e as ProtocolError {
            #expect(e.description == "truncated passcode")
            #expect(!e.secError.message.contains("hunter"))
        } catch { Issue.record("untyped error") }
    }

    @Test func limitsAreEnforced() {
        var w = ByteWriter()
        w.u8(3); w.u32(1); w.u32(UInt32(WireFormat.maximumSecretBytes + 1))
        let frame = w.bytes + [UInt8](repeating: 0, count: WireFormat.maximumSecretBytes + 1)
        #expect(throws: ProtocolError.self) { try frame.withUnsafeBytes { try AgentRequest.decodeBody($0) } }
        var many = ByteWriter()
        many.u8(7); many.u32(1); many.u8(0); many.u16(UInt16(AttributeCodec.maxCount + 1))
        #expect(throws: ProtocolError.self) { try many.bytes.withUnsafeBytes { try AgentRequest.decodeBody($0) } }
    }
}

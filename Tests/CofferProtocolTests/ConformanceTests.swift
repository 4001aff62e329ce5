import CofferCrypto
import CofferModel
@testable import CofferProtocol
import Testing

/// Decoder rules of WireProtocol.md that issue #12 made explicit: UPDATE and DELETE act on every
/// match, and no error text quotes what the peer sent.
@Suite struct ConformanceTests {
    static let query = ItemQuery(itemClass: .genericPassword, attributes: ["svce": .string("mail")], limit: .all)

    /// A DELETE or UPDATE frame body whose query is `q`, written as given (no translation of `.one`).
    static func body(_ type: MessageType, _ q: ItemQuery) -> [UInt8] {
        var w = ByteWriter()
        w.u8(type.rawValue); w.u32(7)
        w.raw(QueryCodec.encode(q))
        if type == .update { w.u16(1); w.shortString("labl"); w.u8(1); w.string("n"); w.u8(0) }
        return w.bytes
    }

    static func decodeError(_ body: [UInt8]) -> ProtocolError? {
        do {
            _ = try body.withUnsafeBytes { try AgentRequest.decodeBody($0) }
            return nil
        } catch let e as ProtocolError {
            return e
        } catch {
            return ProtocolError("untyped \(error)")
        }
    }

    /// A "limit one" DELETE removed every match: a limit other than all, or a return flag, is now
    /// errSecParam for UPDATE and DELETE, never ignored.
    @Test(arguments: [MessageType.update, .delete])
    func updateAndDeleteRefuseALimitOtherThanAllAndReturnFlags(_ type: MessageType) throws {
        var one = Self.query; one.limit = .one
        var two = Self.query; two.limit = .count(2)
        var data = Self.query; data.returnData = true
        var attrs = Self.query; attrs.returnAttributes = true
        var ref = Self.query; ref.returnPersistentRef = true
        for q in [one, two, data, attrs, ref] {
            let e = try #require(Self.decodeError(Self.body(type, q)), "\(type) with \(q.limit) decoded")
            #expect(e.secError.status == .param)
        }
        #expect(Self.decodeError(Self.body(type, Self.query)) == nil, "limit all, no return flags must decode")
    }

    /// The Swift library sends the default limit (`.one`, "none given") as all and no return flags,
    /// so `coffer update`, `coffer delete` and existing callers keep working; `.count` goes out as given.
    @Test func theSwiftEncoderSendsTheDefaultLimitAsAll() throws {
        let plain = ItemQuery(itemClass: .genericPassword, attributes: ["svce": .string("mail")])
        for r in [AgentRequest.delete(plain), .update(plain, ItemChanges(attributes: ["labl": .string("x")]))] {
            let frame = r.encodeFrame(requestID: 3)
            let (_, back) = try Array(frame[4...]).withUnsafeBytes { try AgentRequest.decodeBody($0) }
            switch back {
            case .delete(let q), .update(let q, _): #expect(q.limit == .all && !q.returnData && !q.returnAttributes)
            default: Issue.record("decoded as \(back)")
            }
        }
        var counted = plain; counted.limit = .count(1)
        #expect(Self.decodeError(Array(AgentRequest.delete(counted).encodeFrame(requestID: 1)[4...])) != nil)
        // Return flags are not sent (the reply is a count): the query of a lookup can be reused.
        var returning = plain; returning.returnAttributes = true; returning.returnData = true
        let (_, stripped) = try Array(AgentRequest.delete(returning).encodeFrame(requestID: 1)[4...]).withUnsafeBytes { try AgentRequest.decodeBody($0) }
        guard case .delete(let sq) = stripped else { Issue.record("delete"); return }
        #expect(!sq.returnData && !sq.returnAttributes && sq.limit == .all)
        // COPY_MATCHING keeps `.one` as limit one.
        let (_, copy) = try Array(AgentRequest.copyMatching(plain).encodeFrame(requestID: 1)[4...]).withUnsafeBytes { try AgentRequest.decodeBody($0) }
        guard case .copyMatching(let cq) = copy else { Issue.record("copy"); return }
        #expect(cq.limit == .one)
    }
}

/// Error texts name fields, never values: every decoder path is fed payloads carrying a marker
/// string and marker numbers, and no error text may contain them.
@Suite struct ErrorTextTests {
    static let markerText = "zqMARKER"
    /// A 32-bit marker (decimal and hex spellings are both checked).
    static let markerNumber: UInt32 = 0x7A7A_7A7A
    /// An 8-bit marker for one-byte fields (type, class, tag, kind, flags).
    static let markerByte: UInt8 = 0xEE

    static func leaks(_ text: String) -> Bool {
        let lower = text.lowercased()
        return [markerText.lowercased(), "\(markerNumber)", String(markerNumber, radix: 16), "\(Int32(bitPattern: markerNumber))",
                "\(markerByte)", "0x" + String(markerByte, radix: 16), "\(Int8(bitPattern: markerByte))", "4294967295",
                "\(UInt16.max)", "31354", "122"].contains { lower.contains($0) }
    }

    /// Payloads that fail to decode, each with markers where the peer controls bytes or numbers.
    static var hostileBodies: [(String, [UInt8])] {
        var out: [(String, [UInt8])] = []
        func body(_ type: UInt8, _ build: (inout ByteWriter) -> Void) -> [UInt8] {
            var w = ByteWriter(); w.u8(type); w.u32(markerNumber); build(&w); return w.bytes
        }
        let name = Array(markerText.utf8)
        // Frame-level.
        out.append(("unknown type", body(markerByte) { _ in }))
        out.append(("reply type as request", body(0x80) { _ in }))
        out.append(("trailing bytes", body(0x02) { $0.raw([UInt8](repeating: 0x7A, count: 0x7A)) }))
        // Lengths: a secret, a persistent reference, a string claiming 0x7A7A7A7A or 0xFFFFFFFF bytes.
        for n in [markerNumber, UInt32.max] {
            out.append(("unlock length \(n)", body(0x03) { $0.u32(n); $0.raw(name) }))
            out.append(("query ref length \(n)", body(0x07) { w in w.u8(1); w.u16(0); w.u8(0); w.u32(0); w.u8(0); w.u32(n) }))
            out.append(("string value length \(n)", body(0x07) { w in
                w.u8(1); w.u16(1); w.shortString("svce"); w.u8(1); w.u32(n); w.raw(name) }))
            out.append(("data value length \(n)", body(0x07) { w in
                w.u8(1); w.u16(1); w.shortString("gena"); w.u8(3); w.u32(n); w.raw(name) }))
            out.append(("items ref length \(n)", body(0x87) { w in w.u32(1); w.u8(1); w.u8(4); w.u32(n); w.raw(name) }))
        }
        // One-byte fields with the marker byte.
        out.append(("item class", body(0x06) { w in w.u8(markerByte) }))
        out.append(("query class", body(0x07) { w in w.u8(markerByte) }))
        out.append(("value tag", body(0x07) { w in w.u8(1); w.u16(1); w.shortString(markerText); w.u8(markerByte) }))
        out.append(("limit kind", body(0x07) { w in w.u8(1); w.u16(0); w.u8(markerByte); w.u32(markerNumber) }))
        out.append(("limit count", body(0x07) { w in w.u8(1); w.u16(0); w.u8(0); w.u32(markerNumber) }))
        out.append(("return flags", body(0x07) { w in w.u8(1); w.u16(0); w.u8(1); w.u32(0); w.u8(markerByte) }))
        out.append(("add flags", body(0x06) { w in w.u8(1); w.u16(0); w.u32(0); w.u8(markerByte) }))
        out.append(("has secret", body(0x08) { w in
            w.u8(1); w.u16(0); w.u8(1); w.u32(0); w.u8(0); w.u32(0); w.u16(0); w.u8(markerByte) }))
        out.append(("bool value", body(0x07) { w in w.u8(1); w.u16(1); w.shortString("sync"); w.u8(4); w.u8(markerByte) }))
        out.append(("attribute count", body(0x07) { w in w.u8(1); w.u16(UInt16(0x7A7A)) }))
        out.append(("attribute count max", body(0x07) { w in w.u8(1); w.u16(.max) }))
        // Names: the marker, out of order, repeated, too long, not UTF-8.
        out.append(("unsorted names", body(0x07) { w in
            w.u8(1); w.u16(2); w.shortString(markerText + "b"); w.u8(4); w.u8(0); w.shortString(markerText + "a"); w.u8(4); w.u8(0) }))
        out.append(("repeated names", body(0x07) { w in
            w.u8(1); w.u16(2); w.shortString(markerText); w.u8(4); w.u8(0); w.shortString(markerText); w.u8(4); w.u8(0) }))
        out.append(("long name", body(0x07) { w in
            w.u8(1); w.u16(1); w.shortString(String(repeating: markerText, count: 8)); w.u8(4); w.u8(0) }))
        out.append(("name not UTF-8", body(0x07) { w in
            w.u8(1); w.u16(1); w.u16(UInt16(name.count + 1)); w.raw(name + [0xFF]); w.u8(4); w.u8(0) }))
        out.append(("string value not UTF-8", body(0x07) { w in
            w.u8(1); w.u16(1); w.shortString("svce"); w.u8(1); w.u32(UInt32(name.count + 1)); w.raw(name + [0xC0]) }))
        out.append(("date not finite", body(0x07) { w in
            w.u8(1); w.u16(1); w.shortString("cdat"); w.u8(5); w.u64(Double.nan.bitPattern | UInt64(markerNumber)) }))
        out.append(("client name not UTF-8", body(0x01) { w in w.u16(1); w.u16(1); w.u16(UInt16(name.count + 1)); w.raw(name + [0xFE]) }))
        // Replies a client decodes.
        out.append(("lock state", body(0x82) { w in w.u8(markerByte) }))
        out.append(("passcode flag", body(0x82) { w in w.u8(1); w.u8(markerByte) }))
        out.append(("event kind", body(0xC0) { w in w.u8(markerByte); w.u32(markerNumber) }))
        out.append(("item count", body(0x87) { w in w.u32(markerNumber) }))
        out.append(("page cursor no item", body(0x89) { w in w.u64(UInt64(markerNumber)); w.u32(0) }))
        out.append(("present flags", body(0x87) { w in w.u32(1); w.u8(1); w.u8(markerByte) }))
        out.append(("error status 0", body(0xFF) { w in w.u32(0); w.shortString(markerText) }))
        return out
    }

    @Test func noDecoderErrorQuotesThePayload() {
        var checked = 0
        for (what, bytes) in Self.hostileBodies {
            for decode in [{ (b: UnsafeRawBufferPointer) throws -> Void in _ = try AgentRequest.decodeBody(b) },
                           { (b: UnsafeRawBufferPointer) throws -> Void in _ = try AgentResponse.decodeBody(b) }] {
                do {
                    try bytes.withUnsafeBytes { try decode($0) }
                } catch let e as ProtocolError {
                    checked += 1
                    #expect(!Self.leaks(e.description) && !Self.leaks(e.secError.message), "\(what): \(e.description)")
                } catch {
                    Issue.record("\(what): untyped error \(error)")
                }
            }
        }
        #expect(checked >= Self.hostileBodies.count, "every hostile payload must fail at least one decoder")
    }

    /// The canonical attribute decoder (the wire, stored rows) names no value either.
    @Test func attributeCodecErrorsQuoteNothing() {
        var cases: [[UInt8]] = []
        var w = ByteWriter(); w.u16(UInt16(0x7A7A)); cases.append(w.bytes)
        w = ByteWriter(); w.u16(1); w.shortString(Self.markerText); w.u8(Self.markerByte); cases.append(w.bytes)
        w = ByteWriter(); w.u16(1); w.shortString(Self.markerText); w.u8(3); w.u32(Self.markerNumber); cases.append(w.bytes)
        w = ByteWriter(); w.u16(1); w.shortString(Self.markerText); w.u8(4); w.u8(Self.markerByte); cases.append(w.bytes)
        w = ByteWriter(); w.u16(1); w.shortString(Self.markerText); w.u8(1); w.u32(.max); cases.append(w.bytes)
        for bytes in cases {
            var r = ByteReader(bytes)
            do {
                _ = try AttributeCodec.decodeAttributes(from: &r)
                Issue.record("decoded")
            } catch {
                #expect(!Self.leaks(error.reason), "\(error.reason)")
            }
        }
        var r = ByteReader([0, 0, 0x7A, 0x7A])
        do {
            _ = try AttributeCodec.decodeAttributes(from: &r)
            try r.expectEnd("attributes")
            Issue.record("decoded")
        } catch { #expect(!Self.leaks(error.reason), "\(error.reason)") }
    }

    /// The messages the issue quoted, as they read now.
    @Test func theQuotedMessagesNoLongerEchoTheirInput() {
        // "persistent reference too long (4294967295 bytes)"
        var w = ByteWriter()
        w.u8(0x07); w.u32(1); w.u8(1); w.u16(0); w.u8(0); w.u32(0); w.u8(0); w.u32(.max)
        let e = ConformanceTests.decodeError(w.bytes)
        #expect(e?.description == "persistent reference too long (the limit is 4096 bytes)")
    }
}

/// WHOAMI_REPLY rules a client's decoder enforces (issue #13): the app id goes with a signed or
/// Flatpak identity only, and the flag is 0 or 1.
@Suite struct WhoAmIReplyTests {
    @Test(arguments: [
        // kind 0 (unsigned) with app id "x"
        "0000001a8a00000025000001780000004d00062f62696e2f780000000000",
        // kind 2 (flatpak) with mayAuthorize 2
        "000000318a000000260200056f72672e7800000001000a2f6170702f62696e2f7800000001000d666c617470616b3a6f72672e7802",
        // kind 3 (unknown)
        "0000001a8a00000027030001780000004d00062f62696e2f780000000000",
    ])
    func malformedRepliesAreRefused(hex: String) throws {
        let frame = hexBytes(hex)
        let b = try #require(body(of: frame))
        #expect(b.count + 4 == frame.count)
        #expect(throws: ProtocolError.self) { try b.withUnsafeBytes { try AgentResponse.decodeBody($0) } }
    }

    @Test func aRequestTypeIsNotAReply() throws {
        let b = Array(hexBytes("000000050c00000020")[4...])
        #expect(throws: ProtocolError.self) { try b.withUnsafeBytes { try AgentResponse.decodeBody($0) } }
        let r = Array(hexBytes("000000428a000000200100106f72672e6578616d706c652e6d61696c0000109200112f7573722f62696e2f6d61696c2d6170700000000200046d61696c000673686172656400")[4...])
        #expect(throws: ProtocolError.self) { try r.withUnsafeBytes { try AgentRequest.decodeBody($0) } }
    }
}

extension ConformanceTests {
    /// The `locked` bit of an item's `present` flags (WireProtocol.md, Locked matches by reference):
    /// exactly 0x14 (reference and locked) decodes as a locked match; the bit in any other
    /// combination is malformed; a locked match encodes back to 0x14.
    @Test func aLockedMatchIsItsReferenceAndNothingElse() throws {
        func items(present: UInt8, parts: [UInt8]) -> [UInt8] {
            var w = ByteWriter()
            w.u8(0x87); w.u32(9); w.u32(1); w.u8(1); w.u8(present); w.raw(parts)
            return w.bytes
        }
        let ref: [UInt8] = [0, 0, 0, 16] + Array(0..<16)
        let decoded = try items(present: 0x14, parts: ref).withUnsafeBytes { try AgentResponse.decodeBody($0) }
        guard case .items(let found) = decoded.1 else { Issue.record("not ITEMS: \(decoded.1)"); return }
        #expect(found.count == 1 && found[0].locked && found[0].persistentRef == Array(0..<16) && found[0].attributes == nil)
        #expect(AgentResponse.items(found).encodeFrame(requestID: 9) == [0, 0, 0, UInt8(items(present: 0x14, parts: ref).count)]
                + items(present: 0x14, parts: ref))
        for present: UInt8 in [0x10, 0x11, 0x12, 0x15, 0x16, 0x1c] {
            let threw = (try? items(present: present, parts: ref + [0, 0, 0, 0]).withUnsafeBytes { try AgentResponse.decodeBody($0) }) == nil
            #expect(threw, "present \(present) decoded")
        }
        // The flag in a query of COPY_MATCHING and COPY_MATCHING_PAGE only.
        var q = Self.query
        q.listsLockedItems = true
        q.returnPersistentRef = true
        for type in [MessageType.copyMatching, .copyMatchingPage] {
            var w = ByteWriter()
            w.u8(type.rawValue); w.u32(7); w.raw(QueryCodec.encode(q))
            if type == .copyMatchingPage { w.u64(0) }
            let request = try w.bytes.withUnsafeBytes { try AgentRequest.decodeBody($0) }.1
            switch request {
            case .copyMatching(let got), .copyMatchingPage(let got, _): #expect(got.listsLockedItems && got.returnPersistentRef)
            default: Issue.record("\(request)")
            }
        }
        #expect(Self.decodeError(Self.body(.promptRead, q)) != nil)
    }
}

import CofferClient
import CofferCrypto
import CofferModel
import CofferProtocol
import CofferSystem
import CofferTestSupport
import Foundation
import Testing

/// Replies larger than one frame: a real agent pages them (COPY_MATCHING_PAGE / ITEMS_PAGE), never
/// sends a frame above the connection's limit (256 KiB below version 4, as these tests' connections
/// are unless they say otherwise; 1.5 MiB at version 4), and refuses explicitly what cannot fit at all.
@Suite struct PagingTests {
    static let itemCount = 120
    static let long = String(repeating: "L", count: 4000)

    /// `itemCount` generic passwords, each with three 4,000-byte attributes and an 8 KiB secret:
    /// listing their attributes unpaged would be a 1.4 MiB ITEMS frame, with their secrets 2.4 MiB.
    static func fill(_ agent: AgentProcess) throws -> AgentConnection {
        let c = try AgentConnection(path: agent.socketPath, maximumVersion: 3)
        for i in 0..<itemCount {
            let attrs: Attributes = ["svce": .string("paged"), "acct": .string(String(format: "user-%03d", i)),
                                     "labl": .string(long), "desc": .string(long), "icmt": .string(long)]
            try c.add(NewItem(itemClass: .genericPassword, attributes: attrs, secret: secret(String(repeating: "s", count: 8192))))
        }
        return c
    }


    static func accounts(_ items: [ItemResult]) -> [String] {
        items.map { if case .string(let a)? = $0.attributes?["acct"] { a } else { "?" } }
    }

    @Test func aListingLargerThanAFrameArrivesInPagesOfAtMost256KiB() throws {
        let agent = try AgentProcess()
        let c = try Self.fill(agent)
        let expected = (0..<Self.itemCount).map { String(format: "user-%03d", $0) }
        let query = ItemQuery(itemClass: .genericPassword, attributes: ["svce": .string("paged")], limit: .all,
                              returnData: true, returnAttributes: true)

        // The library pages transparently: every item, oldest first, each with its secret.
        let all = try c.copyMatching(query)
        #expect(Self.accounts(all) == expected)
        #expect(all.allSatisfy { $0.data?.count == 8192 })
        let unpaged = WireFormat.itemsHeaderBytes + all.map(WireFormat.encodedSize(of:)).reduce(0, +)
        #expect(unpaged > 2 * 1024 * 1024, "the listing must be far larger than one frame (\(unpaged) bytes)")

        // Page by page: several pages, each a frame within the limit.
        var pages: [[ItemResult]] = []
        try c.forEachPage(query) { pages.append($0) }
        #expect(pages.count > 8 && pages.allSatisfy { !$0.isEmpty })
        #expect(Self.accounts(pages.flatMap { $0 }) == expected)
        for p in pages {
            let body = WireFormat.itemsPageHeaderBytes + p.map(WireFormat.encodedSize(of:)).reduce(0, +)
            #expect(body <= WireFormat.maximumBodyBytes)
        }

        // A count limit holds across a page boundary: exactly N, the N oldest.
        let firstPage = pages[0].count
        for n in [firstPage, firstPage + 1, firstPage + 3, Self.itemCount - 1] {
            var q = query
            q.limit = .count(n)
            let got = try c.copyMatching(q)
            #expect(Self.accounts(got) == Array(expected.prefix(n)), "limit \(n)")
        }
        var one = query
        one.limit = .one
        #expect(Self.accounts(try c.copyMatching(one)) == ["user-000"])

        // The CLI lists every item, in text and in JSON.
        let text = agent.cli(["find", "--service", "paged", "--limit", "all"])
        #expect(text.status == 0, "\(text.stderr)")
        #expect(text.stdout.components(separatedBy: "class: genp\n").count - 1 == Self.itemCount)
        #expect(expected.allSatisfy { text.stdout.contains("acct: \($0)\n") })
        let json = agent.cli(["find", "--service", "paged", "--json"])
        #expect(json.status == 0, "\(json.stderr)")
        let parsed = try JSONSerialization.jsonObject(with: Data(json.stdout.utf8)) as? [[String: Any]]
        #expect(parsed?.compactMap { $0["acct"] as? String } == expected)
        let limited = agent.cli(["find", "--service", "paged", "--limit", String(firstPage + 2), "--json"])
        let limitedParsed = try JSONSerialization.jsonObject(with: Data(limited.stdout.utf8)) as? [[String: Any]]
        #expect(limitedParsed?.count == firstPage + 2, "\(limited.stderr)")
        #expect(agent.stop() == 0)
    }

    /// What the agent writes on the socket, frame by frame: paged replies within the limit, and the
    /// unpaged COPY_MATCHING of the same listing refused with errSecAllocate instead of a 2 MiB frame.
    @Test func everyFrameOnTheSocketIsWithinTheLimit() throws {
        let agent = try AgentProcess()
        _ = try Self.fill(agent)
        let fd = try UnixSocket.connect(path: agent.socketPath)
        defer { close(fd) }
        func send(_ r: AgentRequest, _ id: UInt32) {
            let f = r.encodeFrame(requestID: id)
            #expect(f.withUnsafeBytes { UnixSocket.writeAll(fd, $0) })
        }
        func receive() throws -> (length: Int, response: AgentResponse) {
            var header: UInt32 = 0
            try #require(withUnsafeMutableBytes(of: &header) { UnixSocket.readExactly(fd, into: $0) })
            let length = Int(UInt32(bigEndian: header))
            try #require(length <= WireFormat.maximumBodyBytes, "the agent sent a frame of \(length) bytes")
            var body = [UInt8](repeating: 0, count: length)
            try #require(body.withUnsafeMutableBytes { UnixSocket.readExactly(fd, into: $0) })
            return (length, try body.withUnsafeBytes { try AgentResponse.decodeBody($0) }.1)
        }
        send(.hello(minVersion: 1, maxVersion: 1, clientName: "raw"), 1)
        _ = try receive()
        let query = ItemQuery(itemClass: .genericPassword, attributes: ["svce": .string("paged")], limit: .all,
                              returnData: true, returnAttributes: true)

        send(.copyMatching(query), 2)
        let whole = try receive()
        guard case .error(let e) = whole.response else { Issue.record("unpaged listing answered \(whole.response)"); return }
        #expect(e.status == .allocate && e.message.contains("COPY_MATCHING_PAGE"), "\(e)")

        var cursor: UInt64 = 0, received = 0, frames = 0, largest = 0
        repeat {
            send(.copyMatchingPage(query, cursor: cursor), 3)
            let (length, r) = try receive()
            guard case .itemsPage(let items, let next) = r else { Issue.record("page answered \(r)"); return }
            received += items.count
            frames += 1
            largest = max(largest, length)
            cursor = next
        } while cursor != 0 && frames < 1000
        #expect(received == Self.itemCount && frames > 8)
        #expect(largest > WireFormat.maximumBodyBytes - 20 * 1024, "pages should be nearly full (largest \(largest))")

        // A cursor past the end: an empty last page, not an error; nothing matching at all: not found.
        send(.copyMatchingPage(query, cursor: UInt64.max), 4)
        if case .itemsPage(let items, let next) = try receive().response { #expect(items.isEmpty && next == 0) } else { Issue.record("past the end") }
        send(.copyMatchingPage(ItemQuery(attributes: ["svce": .string("none")], limit: .all), cursor: 0), 5)
        if case .error(let e) = try receive().response { #expect(e.status == .itemNotFound) } else { Issue.record("no match") }
    }

    /// Below version 4: a secret of up to 1 MiB (stored through a version 4 connection) and a data
    /// attribute of up to 64 KiB are both allowed, so one item with both encodes to more than a version
    /// 3 frame holds. Asking for its data and attributes together is errSecAllocate, never an oversized
    /// frame; each part alone still arrives. An item exactly as large as a page can carry still arrives.
    @Test func anItemThatCannotFitInAnyReplyIsAnExplicitError() throws {
        let agent = try AgentProcess()
        let c = try AgentConnection(path: agent.socketPath, maximumVersion: 3)
        let large = try AgentConnection(path: agent.socketPath)
        try c.add(NewItem(itemClass: .genericPassword, attributes: ["svce": .string("big"), "acct": .string("0-small")],
                          secret: secret("x")))
        let gena = [UInt8](repeating: 0xAB, count: AttributeCodec.maxValueBytes)
        let key: Attributes = ["svce": .string("big"), "acct": .string("1-huge")]
        try c.add(NewItem(itemClass: .genericPassword, attributes: key.merging(["gena": .data(gena)]) { $1 }, secret: secret("y")))
        let huge = ItemQuery(itemClass: .genericPassword, attributes: key, limit: .one, returnData: true, returnAttributes: true)

        // The boundary: attributes of a known size, a secret that makes the item exactly fill a page.
        var attrsOnly = huge
        attrsOnly.returnData = false
        let attrResults = try c.copyMatching(attrsOnly)
        let attrBytes = WireFormat.encodedSize(of: attrResults[0]) - 2
        let fitting = WireFormat.maximumItemBytesPerPage(version: 3) - 2 - 4 - attrBytes
        #expect(fitting <= WireFormat.maximumSecretBytes)
        try c.update(ItemQuery(itemClass: .genericPassword, attributes: key), ItemChanges(secret: secret(count: fitting)))
        let page = try c.copyMatchingPage(huge, cursor: 0)
        #expect(page.items.count == 1 && page.items[0].data?.count == fitting && page.nextCursor == 0)
        #expect(WireFormat.itemsPageHeaderBytes + WireFormat.encodedSize(of: page.items[0]) == WireFormat.maximumBodyBytes)
        #expect(try c.copyMatching(huge).first?.data?.count == fitting) // unpaged ITEMS: the same item limit

        // One byte more, or the largest secret: no reply can hold the item with its attributes.
        for size in [fitting + 1, WireFormat.maximumSecretBytes] {
            try large.update(ItemQuery(itemClass: .genericPassword, attributes: key), ItemChanges(secret: secret(count: size)))
            let paged = failure { () throws(SecError) in _ = try c.copyMatchingPage(huge, cursor: 0) }
            let whole = failure { () throws(SecError) in _ = try c.copyMatching(huge) }
            #expect(paged?.status == .allocate && whole?.status == .allocate, "\(String(describing: paged)) \(String(describing: whole))")
        }
        // In a listing, the items before it arrive first, then the error; the connection still works.
        var all = huge
        all.attributes = ["svce": .string("big")]
        all.limit = .all
        var pages: [[ItemResult]] = []
        let listing = failure { () throws(SecError) in try c.forEachPage(all) { pages.append($0) } }
        #expect(listing?.status == .allocate, "\(String(describing: listing))")
        #expect(Self.accounts(pages.flatMap { $0 }) == ["0-small"])
        // Each part alone fits at version 3 (the attributes), and the whole item at version 4 (coffer get).
        #expect(try large.copyMatching(huge).first?.data?.count == WireFormat.maximumSecretBytes)
        let get = agent.cli(["get", "--service", "big", "--account", "1-huge"])
        #expect(get.status == 0 && get.stdout.utf8.count == WireFormat.maximumSecretBytes, "\(get.stderr)")
        let attrs = try c.copyMatching(attrsOnly)
        #expect(attrs.count == 1 && attrs[0].data == nil)
        #expect(try c.status().itemCount == 2)

        // Attributes alone can be too large too: a certificate may carry five 64 KiB data
        // attributes, added through an ADD and an UPDATE that each fit in a frame.
        let blob = AttributeValue.data([UInt8](repeating: 0xCD, count: AttributeCodec.maxValueBytes))
        try c.add(NewItem(itemClass: .certificate, attributes: ["issr": blob, "slnr": blob, "subj": blob], secret: secret("c")))
        try c.update(ItemQuery(itemClass: .certificate), ItemChanges(attributes: ["skid": blob, "pkhh": blob]))
        let cert = failure { () throws(SecError) in _ = try c.copyMatching(ItemQuery(itemClass: .certificate, limit: .all, returnAttributes: true)) }
        #expect(cert?.status == .allocate && cert?.message.contains("cdcd") == false, "\(String(describing: cert))")
        let refs = try c.copyMatching(ItemQuery(itemClass: .certificate, limit: .all, returnPersistentRef: true))
        #expect(refs.count == 1)
        // The CLI speaks version 4: the certificate lists whole.
        let found = agent.cli(["find", "--class", "cert"])
        #expect(found.status == 0, "\(found.stderr)")
        #expect(agent.cli(["find", "--service", "big", "--json"]).status == 0) // the others still list
    }

    /// ADD asking for its item back: a reply that could not be sent is refused before the item is
    /// added (the original agent added it, then sent a frame the client had to reject).
    @Test func anAddWhoseReplyCannotFitIsRefusedAndAddsNothing() throws {
        let agent = try AgentProcess()
        let c = try AgentConnection(path: agent.socketPath, maximumVersion: 3)
        let attrs: Attributes = ["svce": .string("add"), "acct": .string("a"),
                                 "gena": .data([UInt8](repeating: 1, count: AttributeCodec.maxValueBytes))]
        // The largest ADD frame: type, id, class, attributes, secret length, secret, flags.
        let secretBytes = WireFormat.maximumBodyBytes - 5 - 1 - AttributeCodec.encode(attrs).count - 4 - 1
        let item = NewItem(itemClass: .genericPassword, attributes: attrs, secret: secret(count: secretBytes))
        #expect(AgentRequest.add(item, .all).encodeFrame(requestID: 1).count - 4 == WireFormat.maximumBodyBytes)
        let added = failure { () throws(SecError) in _ = try c.add(item, returning: .all) }
        #expect(added?.status == .allocate, "\(String(describing: added))")
        let lookup = failure { () throws(SecError) in _ = try c.copyMatching(ItemQuery(attributes: ["svce": .string("add")])) }
        #expect(lookup?.status == .itemNotFound)
        // Without asking for the parts back it is added.
        #expect(try c.add(item, returning: []) == nil)
        #expect(try c.copyMatching(ItemQuery(attributes: ["svce": .string("add")], returnPersistentRef: true)).count == 1)
    }

    static var benchTool: String { Binaries.directory + "/coffer-bench" }

    /// `coffer find` over thousands of items: a keychain filled offline by `coffer-bench fill`
    /// (3,000 items here; 100,000 take the same path, one page per ~1,000 small items).
    @Test(.enabled(if: FileManager.default.isExecutableFile(atPath: PagingTests.benchTool), "needs coffer-bench (swift build)"))
    func findOverThousandsOfItems() throws {
        let agent = try AgentProcess()
        #expect(agent.stop() == 0)
        let fill = runShell("'\(Self.benchTool)' fill '\(agent.stateDir)' 3000 </dev/null", socket: "")
        try #require(fill.status == 0, "\(fill)")
        try agent.start()
        let t0 = Date()
        let json = agent.cli(["find", "--limit", "all", "--json"])
        let seconds = Date().timeIntervalSince(t0)
        #expect(json.status == 0, "\(json.stderr)")
        let parsed = try JSONSerialization.jsonObject(with: Data(json.stdout.utf8)) as? [[String: Any]]
        #expect(parsed?.count == 3000)
        #expect(parsed?.first?["acct"] as? String == "acct1" && parsed?.last?["acct"] as? String == "acct3000")
        #expect(seconds < 60, "find over 3,000 items took \(seconds) s")
        let text = agent.cli(["find", "--service", "svc5"])
        #expect(text.status == 0 && text.stdout.components(separatedBy: "class: genp").count - 1 == (1...3000).filter { $0 % 97 == 5 }.count)
    }
}

/// The error `body` throws, or nil if it succeeds.
func failure(_ body: () throws(SecError) -> Void) -> SecError? {
    do {
        try body()
        return nil
    } catch {
        return error
    }
}

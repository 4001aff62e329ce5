import CofferCrypto
import CofferModel
@testable import CofferProtocol
import CofferTestSupport
import Testing

/// COPY_MATCHING_PAGE and ITEMS_PAGE, and the sizes a sender fills a frame with.
@Suite struct ItemsPageTests {
    let attrs: Attributes = ["svce": .string("s"), "gena": .data([1, 2, 3]), "labl": .string("ünï")]

    @Test func pageMessagesRoundTrip() throws {
        let q = ItemQuery(itemClass: .genericPassword, attributes: attrs, limit: .count(3), returnAttributes: true)
        guard case .copyMatchingPage(let q2, let cursor) = try roundTrip(.copyMatchingPage(q, cursor: 1 << 40)) else {
            Issue.record("copyMatchingPage"); return
        }
        #expect(cursor == 1 << 40 && q2.attributes == attrs && q2.limit == .count(3))
        let items = [ItemResult(itemClass: .genericPassword, attributes: attrs, data: secret("d"), persistentRef: [UInt8](repeating: 2, count: 16))]
        guard case .itemsPage(let i2, let next) = try roundTrip(.itemsPage(items, nextCursor: 9)),
              next == 9, i2.count == 1, i2[0].attributes == attrs, text(i2[0].data) == "d" else { Issue.record("itemsPage"); return }
        guard case .itemsPage(let empty, 0) = try roundTrip(.itemsPage([], nextCursor: 0)), empty.isEmpty else {
            Issue.record("empty last page"); return
        }
        #expect(AgentResponse.itemsPage(items, nextCursor: 1).carriesSecret)
        #expect(!AgentResponse.itemsPage([ItemResult(itemClass: .key)], nextCursor: 1).carriesSecret)
    }

    /// A page that promises more must hold something, or a client could loop for ever.
    @Test func aPageWithANextCursorAndNoItemIsMalformed() {
        let frame = AgentResponse.itemsPage([], nextCursor: 5).encodeFrame(requestID: 1)
        #expect(throws: ProtocolError.self) { try Array(frame[4...]).withUnsafeBytes { try AgentResponse.decodeBody($0) } }
    }

    /// `encodedSize(of:)` is exactly what an item adds to an ITEMS or ITEMS_PAGE frame, so a sender
    /// that sums it never goes past the frame limit.
    @Test func encodedSizeIsExact() {
        let variants = [ItemResult(itemClass: .certificate),
                        ItemResult(itemClass: .genericPassword, attributes: attrs),
                        ItemResult(itemClass: .internetPassword, data: secret("secret")),
                        ItemResult(itemClass: .key, attributes: attrs, data: secret("k"), persistentRef: [UInt8](repeating: 1, count: 16))]
        for n in 0...variants.count {
            let items = Array(variants.prefix(n))
            let sum = items.map(WireFormat.encodedSize(of:)).reduce(0, +)
            #expect(AgentResponse.items(items).encodeFrame(requestID: 1).count - 4 == WireFormat.itemsHeaderBytes + sum)
            #expect(AgentResponse.itemsPage(items, nextCursor: 7).encodeFrame(requestID: 1).count - 4 == WireFormat.itemsPageHeaderBytes + sum)
        }
    }

    /// The same for check findings: the header constants and `encodedSize(of:)` are exactly what a
    /// CHECK_REPORT or CHECK_REPORT_PAGE frame holds, so the agent's budget never passes the limit.
    @Test func checkReportSizesAreExact() {
        let variants = [CheckFinding(persistentRef: [], reason: .group, quarantined: false, detail: ""),
                        CheckFinding(persistentRef: [UInt8](repeating: 3, count: 16), reason: .authentication, quarantined: true, detail: "ünï forged"),
                        CheckFinding(persistentRef: [UInt8](repeating: 4, count: 16), reason: .itemClass, quarantined: false,
                                     detail: String(repeating: "x", count: 512))]
        for n in 0...variants.count {
            let findings = Array(variants.prefix(n))
            let sum = findings.map(WireFormat.encodedSize(of:)).reduce(0, +)
            let report = CheckReport(checked: 1, skipped: 2, findings: findings, nextCursor: n == 0 ? 0 : 9)
            #expect(AgentResponse.checkReport(report).encodeFrame(requestID: 1).count - 4 == WireFormat.checkReportHeaderBytes + sum)
            #expect(AgentResponse.checkReportPage(report).encodeFrame(requestID: 1).count - 4 == WireFormat.checkReportPageHeaderBytes + sum)
        }
    }
}

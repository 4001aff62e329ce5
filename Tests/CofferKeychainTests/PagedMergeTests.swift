import CofferKeychain
import CofferModel
import Testing

/// A search over both index tiers (Always and passcode-tier items sharing an attribute) pages in row
/// order, without gaps or repeats, across more matches than one merge round takes.
@Suite struct PagedMergeTests {
    @Test func pagesOverBothTiersComeInRowOrderWithoutGapsOrRepeats() throws {
        let f = try Fixture(passcode: "pw")
        let n = 3 * 64 + 17
        for i in 0..<n {
            // Runs of different lengths in each tier, so that chunks end at different row ids.
            let pdmn = (i / (i % 3 == 0 ? 5 : 2)) % 2 == 0 ? "dk" : "ak"
            try f.addPassword(service: "shared", account: "a\(i)", secret: "s\(i)", ["pdmn": .string(pdmn)])
        }
        let q = ItemQuery(itemClass: .genericPassword, attributes: ["svce": .string("shared")], limit: .all,
                          returnAttributes: true)
        var seen: [String] = []
        var cursor: Int64 = 0
        var pages = 0
        while true {
            var room = 7
            let page = try f.keychain.copyMatchingPage(q, scope: .unrestricted, after: cursor) { _ in room -= 1; return room >= 0 }
            seen += page.items.compactMap { if case .string(let a)? = $0.attributes?["acct"] { a } else { nil } }
            pages += 1
            if page.isComplete { break }
            cursor = page.lastRowID
        }
        #expect(seen == (0..<n).map { "a\($0)" })
        #expect(pages == (n + 6) / 7)
        // A limit across the tiers stops exactly there.
        let limited = ItemQuery(itemClass: .genericPassword, attributes: ["svce": .string("shared")], limit: .count(100))
        #expect(try f.keychain.copyMatching(limited, scope: .unrestricted).count == 100)
    }
}

import CofferCrypto
@testable import CofferKeychain
import CofferStore
import CofferTestSupport
import Testing

/// The RollbackAnchor article's vectors, recomputed by the code that writes the records: the keys
/// from the index keys, the row digests, the roots (sums modulo 2^256) and the record tags.
@Suite struct RollbackAnchorVectorTests {
    static let article = "Sources/CofferKeychain/CofferKeychain.docc/RollbackAnchor.md"
    static var vectors: [[String: String]] { specVectorBlocks(article) }

    func ledger() throws -> RollbackLedger {
        let ledger = RollbackLedger()
        for v in Self.vectors where v["index-key"] != nil {
            let bucket: Int64 = v["name"] == "device key" ? 16 : 17
            hexDecode(v["index-key"]!)!.withUnsafeBytes { ledger.setKey(bucket: bucket, indexKey: $0) }
            #expect(ledger.key(bucket).map { k in k.withUnsafeBytes { Array($0) } } == hexDecode(v["key"]!), "\(v["name"]!)")
        }
        #expect(ledger.complete)
        return ledger
    }

    @Test func theArticleHasEveryKindOfVector() {
        #expect(Self.vectors.filter { $0["index-key"] != nil }.count == 2)
        #expect(Self.vectors.filter { $0["digest"] != nil }.count == 3)
        #expect(Self.vectors.filter { $0["tag"] != nil }.count == 2)
    }

    @Test func digestsRootsAndTagsMatchTheArticle() throws {
        let ledger = try ledger()
        var roots: [Int64: [UInt8]] = [:]
        for v in Self.vectors where v["digest"] != nil {
            let row = LedgerRow(id: Int64(v["id"]!)!, persistentRef: hexDecode(v["pref"]!)!, primaryKeyHash: hexDecode(v["pk"]!)!,
                                protectionClass: Int64(v["pclass"]!)!, meta: hexDecode(v["meta"] ?? "")!, secret: hexDecode(v["secret"]!)!)
            let (bucket, digest) = try ledger.digest(row)
            #expect(digest == hexDecode(v["digest"]!), "\(v["name"]!)")
            roots[bucket] = SetHashArithmetic.add(roots[bucket] ?? [UInt8](repeating: 0, count: 32), digest)
        }
        for v in Self.vectors where v["tag"] != nil {
            let bucket = Int64(v["bucket"]!)!
            #expect(roots[bucket] == hexDecode(v["root"]!), "\(v["name"]!)")
            let record = RollbackRecord(bucket: bucket, root: hexDecode(v["root"]!)!, count: Int64(v["n"]!)!,
                                        epoch: Int64(v["epoch"]!)!, tag: hexDecode(v["tag"]!)!)
            #expect(try ledger.tag(record) == record.tag, "\(v["name"]!)")
            #expect(ledger.verifies(record))
            var edited = record
            edited.epoch += 1
            #expect(!ledger.verifies(edited), "a record sealed at another epoch does not verify")
        }
    }

    @Test func subtractionUndoesAdditionModulo2To256() {
        let max = [UInt8](repeating: 0xFF, count: 32), one = [1] + [UInt8](repeating: 0, count: 31)
        let zero = [UInt8](repeating: 0, count: 32)
        #expect(SetHashArithmetic.add(max, one) == zero, "wraps around")
        #expect(SetHashArithmetic.subtract(zero, one) == max)
        #expect(SetHashArithmetic.subtract(SetHashArithmetic.add(max, max), max) == max)
    }
}

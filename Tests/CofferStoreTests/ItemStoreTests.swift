import CofferModel
import CSQLite
@testable import CofferStore
import CofferSystem
import CofferTestSupport
import Testing

func row(_ n: UInt8, pk: UInt8? = nil, index: [[UInt8]] = []) -> RowContent {
    RowContent(primaryKeyHash: [pk ?? n], persistentRef: [UInt8](repeating: n, count: 16), protectionClass: 1,
               meta: [n, 1], secret: [n, 2], indexHashes: index)
}

@Suite struct ItemStoreTests {
    @Test func insertFindIntersectAndCascade() throws {
        let dir = TemporaryDirectory()
        let store = try ItemStore(path: dir.file("db"))
        try store.insert(row(1, index: [[0xA], [0xB]]))
        try store.insert(row(2, index: [[0xA], [0xC]]))
        try store.insert(row(3, index: [[0xB]]))
        func ids(_ h: [[UInt8]]) throws -> [UInt8] {
            var out: [UInt8] = []
            try store.forEachRow(matchingAll: h) { out.append($0.meta[0]); return true }
            return out
        }
        #expect(try ids([[0xA]]) == [1, 2])
        #expect(try ids([[0xA], [0xB]]) == [1])
        #expect(try ids([[0xA], [0xB], [0xC]]) == [])
        #expect(try ids([]) == [1, 2, 3])
        // Early stop.
        var seen = 0
        try store.forEachRow(matchingAll: []) { _ in seen += 1; return false }
        #expect(seen == 1)
        try store.delete(id: 1)
        #expect(try ids([[0xB]]) == [3])
        #expect(try store.count() == 2)
        #expect(try store.integrityCheck())
    }

    @Test func uniquePrimaryKeyIsErrSecDuplicateItem() throws {
        let dir = TemporaryDirectory()
        let store = try ItemStore(path: dir.file("db"))
        try store.insert(row(1))
        do { try store.insert(row(2, pk: 1)); Issue.record("duplicate accepted") } catch {
            #expect(error.status == .duplicateItem)
        }
        // A failed transaction leaves nothing behind.
        do {
            try store.transaction { () throws(SecError) in
                try store.insert(row(3))
                try store.insert(row(4, pk: 1))
            }
        } catch {
            #expect(error.status == .duplicateItem)
        }
        #expect(try store.count() == 1)
        #expect(try store.row(persistentRef: [UInt8](repeating: 3, count: 16)) == nil)
    }

    @Test func fileIsPrivateAndReopens() throws {
        let dir = TemporaryDirectory()
        do { try ItemStore(path: dir.file("db")).insert(row(7)) }
        #expect(Files.mode(dir.file("db")) == 0o600)
        let again = try ItemStore(path: dir.file("db"))
        #expect(try again.row(persistentRef: [UInt8](repeating: 7, count: 16))?.secret == [7, 2])
    }

    /// Every search shape is index seeks on attr_index plus a rowid lookup in items: never a scan.
    @Test func searchesAreIndexSeeksNotScans() throws {
        let dir = TemporaryDirectory()
        _ = try ItemStore(path: dir.file("db"))
        var db: OpaquePointer?
        #expect(sqlite3_open(dir.file("db"), &db) == SQLITE_OK)
        defer { sqlite3_close(db) }
        for n in 1...4 {
            var stmt: OpaquePointer?
            #expect(sqlite3_prepare_v2(db, "EXPLAIN QUERY PLAN " + ItemStore.searchSQL(entries: n), -1, &stmt, nil) == SQLITE_OK)
            var plan: [String] = []
            while sqlite3_step(stmt) == SQLITE_ROW { plan.append(String(cString: sqlite3_column_text(stmt, 3))) }
            sqlite3_finalize(stmt)
            #expect(!plan.isEmpty)
            #expect(plan.allSatisfy { $0.hasPrefix("SEARCH") || $0.hasPrefix("CORRELATED") }, "\(n): \(plan)")
        }
    }
}

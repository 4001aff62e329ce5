import CSQLite
@testable import CofferStore
import CofferTestSupport
import Testing

/// The cursor of a paged search: only rows after a row id, still by index seeks.
@Suite struct CursorTests {
    @Test func aCursorSkipsTheRowsUpToIt() throws {
        let dir = TemporaryDirectory()
        let store = try ItemStore(path: dir.file("db"))
        for n: UInt8 in 1...6 { try store.insert(row(n, index: n % 2 == 0 ? [[0xA], [0xB]] : [[0xA]])) }
        func ids(_ h: [[UInt8]], after cursor: Int64) throws -> [Int64] {
            var out: [Int64] = []
            try store.forEachRow(matchingAll: h, after: cursor) { out.append($0.id); return true }
            return out
        }
        #expect(try ids([], after: 0) == [1, 2, 3, 4, 5, 6])
        #expect(try ids([], after: 4) == [5, 6])
        #expect(try ids([[0xA]], after: 2) == [3, 4, 5, 6])
        #expect(try ids([[0xA], [0xB]], after: 2) == [4, 6])
        #expect(try ids([[0xB], [0xA]], after: 5) == [6])
        #expect(try ids([[0xA]], after: 6) == [])
        #expect(try ids([[0xA]], after: Int64.max) == [])
    }

    /// A page after a cursor is a seek to it (rowid range or index range), never a scan.
    @Test func searchesAfterACursorAreSeeks() throws {
        let dir = TemporaryDirectory()
        _ = try ItemStore(path: dir.file("db"))
        var db: OpaquePointer?
        #expect(sqlite3_open(dir.file("db"), &db) == SQLITE_OK)
        defer { sqlite3_close(db) }
        for n in 0...3 {
            var stmt: OpaquePointer?
            let sql = ItemStore.searchSQL(entries: n, afterCursor: true)
            #expect(sqlite3_prepare_v2(db, "EXPLAIN QUERY PLAN " + sql, -1, &stmt, nil) == SQLITE_OK)
            var plan: [String] = []
            while sqlite3_step(stmt) == SQLITE_ROW { plan.append(String(cString: sqlite3_column_text(stmt, 3))) }
            sqlite3_finalize(stmt)
            #expect(!plan.isEmpty)
            #expect(plan.allSatisfy { $0.hasPrefix("SEARCH") || $0.hasPrefix("CORRELATED") }, "\(n): \(plan)")
        }
    }
}

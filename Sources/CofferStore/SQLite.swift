import CSQLite
import CofferModel

/// A thin, single-threaded wrapper over one SQLite connection (the only code that calls SQLite).
///
/// Not thread-safe: the owner serialises access.
@safe final class SQLiteConnection {
    private(set) var handle: OpaquePointer?
    private var cache: [String: OpaquePointer] = unsafe [:]
    let path: String

    init(path: String) throws(SecError) {
        self.path = path
        var db: OpaquePointer?
        let flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX | SQLITE_OPEN_NOFOLLOW
        let rc = unsafe sqlite3_open_v2(path, &db, flags, nil)
        unsafe handle = db
        guard rc == SQLITE_OK else {
            let msg = unsafe db.map { unsafe String(cString: sqlite3_errmsg($0)) } ?? "out of memory"
            unsafe sqlite3_close_v2(db)
            unsafe handle = nil
            throw .io("cannot open the keychain database \(path): \(msg)")
        }
        unsafe sqlite3_extended_result_codes(db, 1)
        unsafe sqlite3_busy_timeout(db, 5000)
    }

    deinit {
        for unsafe (_, s) in unsafe cache { unsafe sqlite3_finalize(s) }
        unsafe sqlite3_close_v2(handle)
    }

    /// Runs one or more statements with no parameters.
    func exec(_ sql: String) throws(SecError) {
        var err: UnsafeMutablePointer<CChar>?
        let rc = unsafe sqlite3_exec(handle, sql, nil, nil, &err)
        defer { unsafe sqlite3_free(err) }
        guard rc == SQLITE_OK else {
            throw unsafe error(rc, err.map { unsafe String(cString: $0) } ?? "exec failed")
        }
    }

    /// A cached prepared statement for `sql`, reset and with bindings cleared.
    func statement(_ sql: String) throws(SecError) -> Statement {
        if let s = unsafe cache[sql] {
            unsafe sqlite3_reset(s)
            unsafe sqlite3_clear_bindings(s)
            return unsafe Statement(stmt: s, db: self)
        }
        var s: OpaquePointer?
        let rc = unsafe sqlite3_prepare_v3(handle, sql, -1, UInt32(SQLITE_PREPARE_PERSISTENT), &s, nil)
        guard rc == SQLITE_OK, let s = unsafe s else { throw error(rc, "prepare failed") }
        unsafe cache[sql] = s
        return unsafe Statement(stmt: s, db: self)
    }

    var lastInsertRowID: Int64 { unsafe sqlite3_last_insert_rowid(handle) }
    var changes: Int { unsafe Int(sqlite3_changes(handle)) }
    /// Rows this connection has changed since it opened.
    var totalChanges: Int64 { unsafe sqlite3_total_changes64(handle) }

    /// Maps an SQLite result code to a SecError: corruption is errSecDecode, constraint errSecDuplicateItem.
    func error(_ rc: Int32, _ context: String) -> SecError {
        let msg = unsafe handle.map { unsafe String(cString: sqlite3_errmsg($0)) } ?? ""
        switch rc & 0xff {
        case SQLITE_CORRUPT, SQLITE_NOTADB:
            return .decode("the keychain database \(path) is corrupt: \(msg)")
        // SQLITE_CONSTRAINT_UNIQUE (2067) and _PRIMARYKEY (1555): Swift does not import the macros.
        case SQLITE_CONSTRAINT where rc == 2067 || rc == 1555:
            return .duplicateItem()
        case SQLITE_FULL, SQLITE_IOERR, SQLITE_CANTOPEN, SQLITE_READONLY, SQLITE_PERM:
            return .io("keychain database I/O error (\(context)): \(msg)")
        case SQLITE_NOMEM:
            return SecError(.allocate, "SQLite is out of memory")
        default:
            return SecError(.internalComponent, "SQLite error \(rc) (\(context)): \(msg)")
        }
    }
}

/// A prepared statement borrowed from the connection's cache.
@safe struct Statement {
    let stmt: OpaquePointer
    unowned let db: SQLiteConnection

    private static let transient = unsafe unsafeBitCast(-1, to: sqlite3_destructor_type.self)

    func bind(_ i: Int32, _ blob: [UInt8]) {
        _ = unsafe blob.withUnsafeBytes { unsafe sqlite3_bind_blob(stmt, i, $0.baseAddress ?? UnsafeRawPointer(bitPattern: 1), Int32($0.count), Self.transient) }
    }
    func bind(_ i: Int32, _ value: Int64) { unsafe sqlite3_bind_int64(stmt, i, value) }

    /// Steps once: true if a row is ready, false when done.
    func step() throws(SecError) -> Bool {
        let rc = unsafe sqlite3_step(stmt)
        if rc == SQLITE_ROW { return true }
        if rc == SQLITE_DONE { return false }
        let e = db.error(rc, "step")
        unsafe sqlite3_reset(stmt)
        throw e
    }

    /// Steps once and returns column 0 of the first row as an integer (0 if no row); resets.
    func scalarInt() throws(SecError) -> Int64 {
        defer { unsafe sqlite3_reset(stmt) }
        return try step() ? int64(0) : 0
    }

    /// Runs to completion, ignoring rows.
    func run() throws(SecError) {
        while try step() {}
        unsafe sqlite3_reset(stmt)
    }

    func int64(_ col: Int32) -> Int64 { unsafe sqlite3_column_int64(stmt, col) }
    func blob(_ col: Int32) -> [UInt8] {
        let n = unsafe Int(sqlite3_column_bytes(stmt, col))
        guard n > 0, let p = unsafe sqlite3_column_blob(stmt, col) else { return [] }
        return unsafe Array(UnsafeRawBufferPointer(start: p, count: n))
    }
    func isNull(_ col: Int32) -> Bool { unsafe sqlite3_column_type(stmt, col) == SQLITE_NULL }
}

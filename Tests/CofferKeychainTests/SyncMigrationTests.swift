import CofferKeychain
import CofferModel
import CofferTestSupport
import Testing

/// Store schema 6 (the sync tables; the file then goes on to schema 7) from the state directory the agent and CLI of schema 5 wrote
/// (`Fixtures/schema5`, see its manifest).
@Suite struct SyncMigrationTests {
    @Test func aSchema5KeychainMigratesAndCanSync() throws {
        let dir = try Fixtures.copy("schema5")
        let path = dir.file("keychain.db")
        #expect(sqlRows(path, "PRAGMA user_version") == [Array("5".utf8)])
        #expect(sqlRows(path, "SELECT name FROM sqlite_master WHERE name LIKE 'sync%'").isEmpty)
        var kc = try Keychain(directory: dir.path, lockingStateDirectory: false)
        #expect(sqlRows(path, "PRAGMA user_version") == [Array("7".utf8)])
        #expect(sqlRows(path, "SELECT name FROM sqlite_master WHERE name LIKE 'sync%' ORDER BY name") == [Array("sync_pending".utf8), Array("sync_state".utf8)])
        func expectIntact(_ kc: Keychain) throws {
            #expect(try kc.count() == 4)
            for (cls, account) in [(ItemClass.genericPassword, "alice"), (.genericPassword, "bob"), (.internetPassword, "carol"), (.genericPassword, "dave")] {
                let got = try kc.copyMatching(ItemQuery(itemClass: cls, attributes: ["acct": .string(account)], returnData: true, returnAttributes: true),
                                              scope: .unrestricted)
                #expect(got.count == 1 && text(got.first?.data) == "pw-" + account, "\(account)")
                #expect(got.first?.attributes?["sync"] == .bool(false))
            }
        }
        try expectIntact(kc)
        #expect(try kc.syncState() == nil)
        // Sync set up on the migrated keychain: a migrated item turned syncable is noted, and the note
        // survives a reopen (which changes nothing else).
        try kc.commitSyncRecorded(through: 0, state: [1])
        #expect(try kc.update(ItemQuery(attributes: ["acct": .string("alice")]), ItemChanges(attributes: ["sync": .bool(true)]), scope: .unrestricted) == 1)
        kc = try Keychain(directory: dir.path, lockingStateDirectory: false)
        #expect(sqlRows(path, "PRAGMA user_version") == [Array("7".utf8)])
        let pending = try kc.pendingSyncChanges()
        #expect(pending.changes.count == 1 && pending.changes.first?.payload != nil)
        #expect(text(try kc.syncState()) == "\u{1}")
    }
}

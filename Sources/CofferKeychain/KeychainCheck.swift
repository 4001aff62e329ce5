import CofferCrypto
import CofferKeybag
public import CofferModel
import CofferStore
import CofferSystem

// coffer check: verify, quarantine, list and restore rows.
extension Keychain {
    // MARK: Checking (coffer check)

    /// Runs a CHECK: verifies every row whose keys are in memory (see ``verify(_:_:)``), moves those
    /// that cannot be opened (they fail authentication, or their class or protection does not match
    /// their row) into the quarantine table (`.quarantine`), lists the quarantine, or restores one row
    /// from it (errSecItemNotFound if no quarantined row has that reference; errSecDuplicateItem if an
    /// item with its primary key was added since). Nothing is ever deleted. Every row, every access
    /// group: the agent allows it to whole-keychain callers only.
    ///
    /// Paged: only rows after `cursor` (a row id for verify and quarantine, a quarantine id for the
    /// list; 0 from the start), and each finding is offered to `fits` (a front end's reply size); the
    /// first it refuses ends the page, whose `nextCursor` then says where the next page starts (0: the
    /// end was reached). A quarantine page moves its own rows in one transaction, after its findings
    /// are known. With `wholeOrNothing` a refused finding instead fails the whole request with
    /// errSecAllocate before anything is moved (a front end that cannot page).
    public func check(_ operation: CheckOperation, after cursor: Int64 = 0, wholeOrNothing: Bool = false,
                      fits: (CheckFinding) -> Bool = { _ in true }) throws(SecError) -> CheckReport {
        try guarded.withLock { (s: inout State) throws(SecError) in
            let store = s.store
            func full() -> SecError { SecError(.allocate, "the check report does not fit in one reply; use the paged check") }
            switch operation {
            case .listQuarantine:
                var findings: [CheckFinding] = [], next: UInt64 = 0
                try store.reading { () throws(SecError) in
                    var last = cursor
                    for row in try store.quarantined(after: cursor) {
                        let f = CheckFinding(persistentRef: row.persistentRef, reason: CheckFinding.Reason(rawValue: row.code) ?? .authentication,
                                             quarantined: true, detail: row.reason)
                        guard fits(f) else {
                            if wholeOrNothing || findings.isEmpty { throw full() }
                            next = UInt64(last)
                            return
                        }
                        findings.append(f)
                        last = row.quarantineID
                    }
                }
                return CheckReport(checked: 0, skipped: 0, findings: findings, nextCursor: next)
            case .restore(let ref):
                let restored = try writing(store) { () throws(SecError) in try store.restoreQuarantined(persistentRef: ref) }
                guard restored else { throw .itemNotFound("no quarantined item has that persistent reference") }
                return CheckReport(checked: 0, skipped: 0, findings: [
                    CheckFinding(persistentRef: ref, reason: .authentication, quarantined: false, detail: "restored")])
            case .verify, .quarantine:
                var checked: UInt32 = 0, skipped: UInt32 = 0, next: UInt64 = 0
                var findings: [(Int64, CheckFinding)] = []
                try store.reading { () throws(SecError) in
                    var last = cursor
                    for (id, _) in try store.rowClasses() where id > cursor {
                        guard let row = try store.row(id: id) else { continue }
                        switch try verify(store, row) {
                        case .none: checked += 1
                        case .some(nil): skipped += 1
                        case .some(.some(let f)):
                            guard fits(f) else {
                                if wholeOrNothing || findings.isEmpty { throw full() }
                                next = UInt64(last)
                                return
                            }
                            checked += 1
                            findings.append((id, f))
                        }
                        last = id
                    }
                }
                if operation == .quarantine {
                    let unopenable: Set<CheckFinding.Reason> = [.authentication, .itemClass]
                    let failing = findings.indices.filter { unopenable.contains(findings[$0].1.reason) }
                    if !failing.isEmpty {
                        let moved = try writing(store) { () throws(SecError) -> [Bool] in
                            var moved: [Bool] = []
                            for i in failing {
                                moved.append(try store.quarantine(id: findings[i].0, reason: findings[i].1.detail,
                                                                  code: findings[i].1.reason.rawValue))
                            }
                            return moved
                        }
                        for (i, ok) in zip(failing, moved) {
                            if ok {
                                findings[i].1.quarantined = true
                            } else {
                                findings[i].1.detail = "not quarantined: its persistent reference is invalid or already in the quarantine (a forged copy?)"
                            }
                        }
                    }
                }
                return CheckReport(checked: checked, skipped: skipped, findings: findings.map(\.1), nextCursor: next)
            }
        }
    }

    /// Verifies one row: nil if it is sound, `.some(nil)` if its keys are not in memory (not
    /// checked), else what is wrong. Sound means: a valid class and reference; attributes and secret
    /// that open (AEAD authentication under the current keys; a secret behind an application password
    /// is checked up to that layer); a class and protection in the attributes matching the row; an
    /// access group; and the primary-key hash and blind-index entries its attributes give.
    private func verify(_ store: ItemStore, _ row: StoredRow) throws(SecError) -> CheckFinding?? {
        func finding(_ reason: CheckFinding.Reason, _ detail: String) -> CheckFinding?? {
            .some(CheckFinding(persistentRef: row.persistentRef, reason: reason, quarantined: false, detail: detail))
        }
        guard let p = ProtectionClass(rawValue: row.protectionClass), row.persistentRef.count == 16 else {
            return finding(.itemClass, "invalid protection class or persistent reference")
        }
        guard keybag.isAvailable(p) else { return .some(nil) }
        let opened: (ItemClass, Attributes)
        do {
            opened = try openAttributes(row)
        } catch where error.status == .decode {
            let plainOpens = unsafe (try? keybag.withMetadataKey(p) { k throws(SecError) in
                try unsafe ItemCrypto.openMeta(row.meta, classKey: k, ref: row.persistentRef, protection: p)
            }) != nil
            return plainOpens ? finding(.itemClass, "its item class or protection does not match its row")
                : finding(.authentication, "its attributes fail authentication (altered, forged, or sealed under a key the keybag no longer holds)")
        }
        let (cls, attrs) = opened
        let secretOK = try unsafe keybag.withClassKey(p) { k -> Bool in
            if ItemCrypto.needsApplicationPassword(row.secret) {
                return unsafe ItemCrypto.unwraps(row.secret, classKey: k, ref: row.persistentRef, protection: p, keyRole: .secretKey)
            }
            guard let plain = try? unsafe ItemCrypto.openSecret(row.secret, classKey: k, ref: row.persistentRef, protection: p) else { return false }
            plain.wipe()
            return true
        }
        guard secretOK else { return finding(.authentication, "its secret fails authentication") }
        guard let group = attrs.accessGroup, !group.isEmpty else { return finding(.group, "it has no access group") }
        var full = attrs
        full["class"] = .string(cls.rawValue)
        let (pk, index) = try unsafe keybag.withIndexKey(IndexTier.of(p)) { k in unsafe Self.hashes(k, cls, full) }
        guard try store.primaryKeyHash(id: row.id) == pk, Set(try store.indexHashes(item: row.id)) == Set(index) else {
            return finding(.index, "its primary-key hash or index entries do not match its attributes (searches may miss it)")
        }
        return nil
    }
}

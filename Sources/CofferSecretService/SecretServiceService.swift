import CSDBus
import CofferClient
import CofferCrypto
import CofferModel
import CofferSecretServiceCrypto
import CofferSystem
import Glibc

/// The org.freedesktop.Secret.Service methods other than OpenSession (SecretServiceFrontEnd.swift).
extension SecretServiceFrontEnd {
    // MARK: Service

    func serviceSearchItems(_ m: OpaquePointer?, _ c: Caller) throws(BusError) -> Int32 {
        let attributes = try Self.callerAttributes(Self.readDictionary(m))
        let mark = changeMark()
        let (found, lockedAway) = try search(c, attributes: attributes)
        rememberSearch(c, attributes: attributes, found: found, mark: mark)
        // Locked or not, as the agent answered each match: locked away (by reference), or needing the person.
        var locked: [String] = [], unlocked: [String] = []
        for r in found { if r.needsAuthentication { locked.append(r.path) } else { unlocked.append(r.path) } }
        locked += lockedAway
        return replyWith(m) { r in
            let rc = Self.appendStrings(r, "o", unlocked)
            return rc < 0 ? rc : Self.appendStrings(r, "o", locked)
        }
    }

    func getSecrets(_ m: OpaquePointer?, _ c: Caller) throws(BusError) -> Int32 {
        let paths = try Self.readPaths(m)
        let sessionPath = try Self.readString(m, CChar(UInt8(ascii: "o")))
        let session = try session(c, sessionPath)
        var found: [(Record, SecureBytes)] = []
        defer { found.forEach { $0.1.wipe() } }
        var seen = Set<String>()
        var batch = batchSecrets(c, paths)
        defer { batch.values.forEach { $0.1.wipe() } }
        for path in paths where seen.insert(path).inserted {
            if let hit = batch.removeValue(forKey: path) {
                found.append(hit)
                continue
            }
            // Locked and unknown items are left out (the spec's GetSecrets).
            do {
                let (record, secret) = try item(c, path, withSecret: true)
                if let secret { found.append((record, secret)) }
            } catch where error.name == BusError.noSuchObject || error.name == BusError.isLocked {
                continue
            }
        }
        var failure: BusError?
        let rc = replyWith(m) { r in
            var rc = ssb_open_secrets(r)
            for (record, secret) in found where rc >= 0 {
                do throws(BusError) { rc = try Self.appendSecret(r, itemPath: record.path, sessionPath: sessionPath, session, secret, contentType: record.contentType) } catch {
                    failure = error
                    return -EINVAL
                }
            }
            return rc < 0 ? rc : ssb_close_container(r)
        }
        if let failure { throw failure }
        return rc
    }

    func readAlias(_ m: OpaquePointer?, _ c: Caller) throws(BusError) -> Int32 {
        let alias = try Self.readString(m)
        guard let name = try aliasTarget(c, alias), try collectionNames(c).contains(name) else { return replyPath(m, Self.noPrompt) }
        return replyPath(m, Self.collectionPath(name))
    }

    func setAlias(_ m: OpaquePointer?, _ c: Caller) throws(BusError) -> Int32 {
        let alias = try Self.readString(m)
        let path = try Self.readString(m, CChar(UInt8(ascii: "o")))
        guard !alias.isEmpty, GeneralAttributes.isValidName(alias) else {
            throw BusError(name: BusError.invalidArgs, message: "an alias is 1 to \(GeneralAttributes.maxNameBytes) bytes")
        }
        if path == Self.noPrompt {
            try deleteRecords(c, recordQuery(c, service: Self.aliasService, account: alias))
        } else {
            let name = try collection(c, path)
            try putRecord(c, service: Self.aliasService, account: alias, [Self.collectionKey: .string(name)])
        }
        return ssb_reply_empty(m)
    }

    /// CreateCollection: an existing collection with the alias is returned as it is; else a new
    /// collection named after its label (lowercase letters and digits, a number added when taken).
    func createCollection(_ m: OpaquePointer?, _ c: Caller) throws(BusError) -> Int32 {
        var label = ""
        guard ssb_enter_properties(m) >= 0 else { throw BusError(name: BusError.invalidArgs, message: "bad properties") }
        var key: UnsafePointer<CChar>?, contents: UnsafePointer<CChar>?
        while true {
            let r = ssb_next_property(m, &key, &contents)
            guard r >= 0 else { throw BusError(name: BusError.invalidArgs, message: "bad properties") }
            if r == 0 { break }
            if let key, String(cString: key) == "org.freedesktop.Secret.Collection.Label" {
                var s: UnsafePointer<CChar>?
                guard ssb_read_variant_string(m, &s) >= 0, let s else {
                    throw BusError(name: BusError.invalidArgs, message: "org.freedesktop.Secret.Collection.Label is a string")
                }
                label = String(cString: s)
            } else {
                guard ssb_skip_variant(m) >= 0 else { throw BusError(name: BusError.invalidArgs, message: "bad properties") }
            }
            guard ssb_end_property(m) >= 0 else { throw BusError(name: BusError.invalidArgs, message: "bad properties") }
        }
        let alias = try Self.readString(m)
        let names = try collectionNames(c)
        if !alias.isEmpty, let existing = try aliasTarget(c, alias), names.contains(existing) {
            return replyPath(m, Self.collectionPath(existing), Self.noPrompt)
        }
        let kept = label.lowercased().unicodeScalars.filter { $0.isASCII && ($0.properties.isAlphabetic || ("0"..."9").contains($0)) }
        var base = String(String(kept).prefix(24))
        if base.isEmpty || base == "session" { base = "collection" }
        var name = base, n = 1
        while names.contains(name) {
            n += 1
            name = base + String(n)
        }
        try putRecord(c, service: Self.collectionService, account: name, ["labl": .string(label)])
        if !alias.isEmpty, GeneralAttributes.isValidName(alias) {
            try putRecord(c, service: Self.aliasService, account: alias, [Self.collectionKey: .string(name)])
        }
        collectionEvent("CollectionCreated", name, by: c)
        return replyPath(m, Self.collectionPath(name), Self.noPrompt)
    }

    func lock(_ m: OpaquePointer?, _ c: Caller) throws(BusError) -> Int32 {
        let paths = try Self.readPaths(m)
        // Only persistent collections and items lock (the keybag); the session collection never does.
        let persistent = paths.filter {
            switch Self.parse($0) {
            case .collection(let n)?: n != Self.sessionCollection
            case .item(let n, _)?: n != Self.sessionCollection
            case .reference?: true
            case .alias(let a)?: ((try? aliasTarget(c, a)) ?? nil).map { $0 != Self.sessionCollection } ?? false
            case nil: false
            }
        }
        guard !persistent.isEmpty else { return replyPaths(m, [], then: Self.noPrompt) }
        let events = completions.eventCount
        try agentCall { () throws(SecError) in try c.agent.lock() }
        // Locked now: the client's next call finds it so, whether or not the watch has heard the event.
        completions.post(inferred: .locked, ifNoEventSince: events)
        return replyPaths(m, persistent, then: Self.noPrompt)
    }

    func unlock(_ m: OpaquePointer?, _ c: Caller) throws(BusError) -> Int32 {
        let paths = try Self.readPaths(m)
        // The agent's events say unlocked: so it is (a lock since only costs the prompt an unlock).
        // Locked: asked of the agent itself, so that a stale event never asks the person for nothing.
        var state = try lockState(c)
        if state != .unlocked { state = try freshLockState(c) }
        var unlocked: [String] = [], locked: [String] = []
        var reads: [String: ItemQuery] = [:], probes: Set<String> = []
        for path in paths {
            switch Self.parse(path) {
            case .item?, .reference?:
                // An item the agent cannot read while locked is locked; one that is not there is left out.
                // An item with an access control is read by the prompt (the person answers its control).
                do {
                    // The sender's search just named it (libsecret unlocks what SearchItems said is
                    // locked): its record then, if nothing changed since, else the agent's.
                    let record: Record
                    if let searched = searchedRecordForLockState(c, path) { record = searched } else { record = try item(c, path).0 }
                    if record.needsAuthentication {
                        locked.append(path)
                        var read = try itemQuery(c, path: path, returnData: true)
                        // The prompt's read opens that row by reference (no index search), checked
                        // against the path's query as well.
                        if let ref = record.ref { read.persistentRef = ref }
                        reads[path] = read
                    } else {
                        unlocked.append(path)
                    }
                } catch where error.name == BusError.isLocked {
                    locked.append(path)
                    // Whether it has an access control cannot be read while the keybag is locked: the
                    // prompt looks once it has unlocked it.
                    if let query = try? itemQuery(c, path: path, returnData: true) {
                        reads[path] = query
                        probes.insert(path)
                    }
                } catch {
                    continue
                }
            case .collection?, .alias?:
                guard let name = try? collection(c, path) else { continue }
                if state == .unlocked || name == Self.sessionCollection { unlocked.append(path) } else { locked.append(path) }
            case nil: continue
            }
        }
        guard !locked.isEmpty else { return replyPaths(m, unlocked, then: Self.noPrompt) }
        return replyPaths(m, unlocked, then: try newPrompt(c, unlocking: locked, reading: reads, probing: probes,
                                                           keybagUnlocked: state == .unlocked))
    }
}

import CSDBus
import CofferClient
import CofferCrypto
import CofferModel
import CofferSecretServiceCrypto
import CofferSystem
import Glibc

/// The org.freedesktop.Secret.Item methods, and the changes and deletions of an item they make.
extension SecretServiceFrontEnd {
    // MARK: Item

    func getSecret(_ m: OpaquePointer?, _ c: Caller, _ path: String) throws(BusError) -> Int32 {
        let sessionPath = try Self.readString(m, CChar(UInt8(ascii: "o")))
        let session = try session(c, sessionPath)
        let (record, secret) = try item(c, path, withSecret: true)
        guard let secret else { throw BusError(name: BusError.failed, message: "the agent sent no secret") }
        defer { secret.wipe() }
        var failure: BusError?
        let rc = replyWith(m) { r in
            do throws(BusError) { return try Self.appendSecret(r, sessionPath: sessionPath, session, secret, contentType: record.contentType) } catch {
                failure = error
                return -EINVAL
            }
        }
        if let failure { throw failure }
        return rc
    }

    func setSecret(_ m: OpaquePointer?, _ c: Caller, _ path: String) throws(BusError) -> Int32 {
        let (secret, contentType) = try readSecret(m, c)
        defer { secret.wipe() }
        let (record, _) = try item(c, path)
        try change(c, record, secret: secret, contentType: contentType)
        itemEvent("ItemChanged", record, by: c)
        return ssb_reply_empty(m)
    }

    func deleteItem(_ m: OpaquePointer?, _ c: Caller, _ path: String) throws(BusError) -> Int32 {
        let (record, _) = try item(c, path)
        try remove(c, record)
        itemEvent("ItemDeleted", record, by: c)
        return replyPath(m, Self.noPrompt)
    }

    /// Changes an item (a keychain item, or a `session` one in memory): a new label, attribute set,
    /// secret and content type, each when given.
    func change(_ c: Caller, _ record: Record, label: String? = nil, attributes: [String: String]? = nil,
                secret: SecureBytes? = nil, contentType: String? = nil, extra: Attributes = [:]) throws(BusError) {
        if record.collection == Self.sessionCollection {
            guard var item = sessionItems[c.group]?[record.id] else { throw BusError(name: BusError.noSuchObject, message: "no item \(record.path)") }
            if let label { item.label = label }
            if let attributes { item.attributes = attributes }
            if let secret {
                item.secret.wipe()
                item.secret = secret.slice(0..<secret.count)
            }
            if let contentType { item.contentType = contentType }
            item.modified = Self.now()
            sessionItems[c.group]?[record.id] = item
            noteSessionAccess(c, .update)
            return
        }
        var changes = extra
        if attributes != nil || contentType != nil { changes.merge(record.general(attributes: attributes, contentType: contentType)) { $1 } }
        if let label { changes["labl"] = .string(label) }
        _ = try agentCall { () throws(SecError) in
            try c.agent.update(itemQuery(c, collection: record.collection, id: record.id), ItemChanges(attributes: changes, secret: secret))
        }
    }

    func remove(_ c: Caller, _ record: Record) throws(BusError) {
        if record.collection == Self.sessionCollection {
            if let gone = sessionItems[c.group]?.removeValue(forKey: record.id) {
                gone.secret.wipe()
                noteSessionAccess(c, .delete)
            }
            return
        }
        _ = try agentCall { () throws(SecError) in try c.agent.delete(itemQuery(c, collection: record.collection, id: record.id)) }
    }
}

import CSDBus
public import CofferClient
import CofferCrypto
public import CofferModel
import CofferSecretServiceCrypto
public import CofferImport
import CofferSystem
import Glibc

/// `coffer import secret-service`: every item of the provider owning `org.freedesktop.secrets` on the
/// session bus (gnome-keyring, KeePassXC, KWallet's bridge), read through the Secret Service API as a
/// client, stored as the Secret Service items Coffer's own front end serves
/// (SecretServiceMapping.md): a generic password with service `org.freedesktop.secrets`, a random
/// 128-bit account, the label, the attributes as general attributes, the collection and content type
/// as the reserved attributes `coffer:collection` and `coffer:content-type`.
///
/// The session is `dh-ietf1024-sha256-aes128-cbc-pkcs7` (``SecretServiceClientHandshake``), `plain`
/// only when the provider does not offer it. A locked collection is unlocked through the provider's
/// own prompt (its password dialog); if the prompt is dismissed, or there is no way to show one, its
/// items are reported as failed and the rest continue. An item whose collection, label and
/// attributes equal an existing item's is a duplicate and left alone.
public enum SecretServiceImport {
    /// The bus name of a Secret Service provider.
    public static let busName = "org.freedesktop.secrets"
    /// The item service of every Secret Service item in Coffer.
    public static let itemService = "org.freedesktop.secrets"
    /// The reserved attribute naming an item's collection.
    public static let collectionAttribute = "coffer:collection"
    /// The reserved attribute keeping an item's content type.
    public static let contentTypeAttribute = "coffer:content-type"
    /// How long the provider's unlock prompt may stay open (a person typing a password).
    public static let promptTimeoutSeconds: UInt64 = 300
    /// Items asked for in one GetSecrets call.
    static let batchSize = 64
    static let collectionPrefix = "/org/freedesktop/secrets/collection"

    /// Imports every item of the provider on the session bus (only those of collection `collection`,
    /// by name or label, when given) over `connection`, into access group `group` (else the caller's
    /// default). Throws when there is no provider, the provider is coffer-secret-service itself,
    /// the session cannot be opened, `collection` does not exist, or the agent is gone.
    public static func run(collection only: String?, group: String?, dryRun: Bool, on connection: AgentConnection) throws(SecError) -> ImportSummary {
        try ImportTarget.requireUnlocked(connection)
        let provider = try Provider.connect()
        defer { provider.close() }
        let session = try provider.openSession()
        defer { provider.closeSession(session.path) }

        var summary = ImportSummary(dryRun: dryRun)
        let collections = try provider.paths(Self.servicePath, "org.freedesktop.Secret.Service", "Collections")
        var matched = false
        for (index, path) in collections.enumerated() {
            guard let name = Provider.name(of: path, below: collectionPrefix) else { continue }
            // The provider's in-memory collection is gone at logout; Coffer's `session` collection is its own.
            if name == "session" { continue }
            let label = (try? provider.string(path, "org.freedesktop.Secret.Collection", "Label")) ?? name
            if let only, only != name && only != label { continue }
            matched = true
            do {
                try importCollection(path, name: name, provider: provider, session: session, group: group, into: &summary, on: connection)
            } catch {
                // importCollection has reported this collection's entries; the later ones are not read.
                for later in collections[(index + 1)...] {
                    if let n = Provider.name(of: later, below: collectionPrefix), n != "session", only == nil || only == n {
                        summary.record("collection \(n)", .failed("not read: the provider left the bus"))
                    }
                }
                return summary
            }
        }
        if let only, !matched { throw .itemNotFound("the provider has no collection '\(TerminalSafeText.escaped(only))'") }
        return summary
    }

    static let servicePath = "/org/freedesktop/secrets"

    /// The provider left the bus in the middle of the import (the entries it affects are recorded).
    struct ProviderGone: Error {}

    /// One collection: unlocked if need be (through the provider's prompt), its items read in
    /// batches and stored. Throws ``ProviderGone`` when the provider leaves the bus meanwhile.
    static func importCollection(_ path: String, name: String, provider: Provider, session: ProviderSession,
                                 group: String?, into summary: inout ImportSummary, on connection: AgentConnection) throws(ProviderGone) {
        let items: [String]
        do { items = try provider.paths(path, "org.freedesktop.Secret.Collection", "Items") } catch {
            if !provider.isPresent {
                summary.record("collection \(name)", .failed("not read: the provider left the bus"))
                throw ProviderGone()
            }
            summary.record("collection \(name)", .failed("cannot list its items: \(error.message)"))
            return
        }
        if (try? provider.bool(path, "org.freedesktop.Secret.Collection", "Locked")) ?? false, let reason = provider.unlock([path]) {
            if items.isEmpty { summary.record("collection \(name)", .failed(reason)) }
            for item in items { summary.record("\(name)/\(Provider.itemID(item))", .failed(reason)) }
            if !provider.isPresent { throw ProviderGone() }
            return
        }
        var start = 0
        while start < items.count {
            let batch = Array(items[start..<min(start + batchSize, items.count)])
            let rest = items[start...]
            start += batchSize
            var secrets: [String: Result<(SecureBytes, String), SecError>]
            do {
                secrets = try provider.secrets(batch, session: session)
                // Items locked on their own (KeePassXC's per-entry confirmation): unlocked through the
                // provider's prompt, then asked for again; a refusal leaves them reported as locked.
                let locked = batch.filter { secrets[$0] == nil }
                if !locked.isEmpty, provider.unlock(locked) == nil {
                    for (item, secret) in try provider.secrets(locked, session: session) { secrets[item] = secret }
                }
            } catch {
                if !provider.isPresent {
                    for item in rest { summary.record("\(name)/\(Provider.itemID(item))", .failed("not read: the provider left the bus")) }
                    throw ProviderGone()
                }
                for item in batch { summary.record("\(name)/\(Provider.itemID(item))", .failed(error.message)) }
                continue
            }
            defer { for case .success(let s) in secrets.values { s.0.wipe() } }
            for (position, item) in batch.enumerated() {
                let label: String, attributes: [String: String]
                do {
                    label = try provider.string(item, "org.freedesktop.Secret.Item", "Label")
                    attributes = try provider.attributes(item)
                } catch {
                    guard provider.isPresent else {
                        for unread in rest.dropFirst(position) { summary.record("\(name)/\(Provider.itemID(unread))", .failed("not read: the provider left the bus")) }
                        throw ProviderGone()
                    }
                    summary.record("\(name)/\(Provider.itemID(item))", .failed("cannot read its label or attributes: \(error.message)"))
                    continue
                }
                let entry = "\(name)/\(label)"
                switch secrets[item] {
                case nil: summary.record(entry, .failed("the provider returned no secret for it (the item is locked)"))
                case .failure(let e)?: summary.record(entry, .failed(e.message))
                case .success(let (value, contentType))?:
                    store(entry, collection: name, label: label, attributes: attributes, secret: value, contentType: contentType,
                          group: group, into: &summary, on: connection)
                }
            }
        }
    }

    /// One item: a duplicate (equal collection, label and attributes) is reported, anything else added.
    static func store(_ entry: String, collection: String, label: String, attributes: [String: String], secret: SecureBytes, contentType: String,
                      group: String?, into summary: inout ImportSummary, on connection: AgentConnection) {
        var query: Attributes = ["svce": .string(itemService), "labl": .string(label),
                                 GeneralAttributes.key(collectionAttribute): .string(collection)]
        for (k, v) in attributes { query[GeneralAttributes.key(k)] = .string(v) }
        if let group { query["agrp"] = .string(group) }
        var wanted = attributes
        wanted[collectionAttribute] = collection
        do {
            let found = try connection.copyMatching(ItemQuery(itemClass: .genericPassword, attributes: query, limit: .all, returnAttributes: true))
            if found.contains(where: { result in
                var theirs = (result.attributes ?? [:]).generalAttributes
                theirs[contentTypeAttribute] = nil
                return theirs == wanted
            }) {
                summary.record(entry, .duplicate)
                return
            }
        } catch where error.status == .itemNotFound {
        } catch {
            summary.record(entry, .failed(error.description))
            return
        }
        guard !summary.dryRun else { summary.record(entry, .imported); return }
        var item = query
        item["acct"] = .string(Hex.encode(Random.bytes(16)))
        item[GeneralAttributes.key(contentTypeAttribute)] = .string(contentType)
        do {
            _ = try connection.add(NewItem(itemClass: .genericPassword, attributes: item, secret: secret))
            summary.record(entry, .imported)
        } catch {
            summary.record(entry, .failed(error.description))
        }
    }
}

/// The provider's session: its object path and the transport encryption it negotiated.
struct ProviderSession {
    let path: String
    let crypto: SecretServiceSession
}

/// The provider on the session bus, through CSecretServiceClient.h (sd-bus, in CSDBus): every call goes to the
/// unique name that owned `org.freedesktop.secrets` when the import began, so a provider that leaves
/// is never silently replaced by another.
final class Provider {
    let bus: OpaquePointer
    let owner: String

    private init(bus: OpaquePointer, owner: String) {
        self.bus = bus
        self.owner = owner
    }

    /// The last failure's D-Bus error.
    var lastError: String { String(cString: ssc_last_error()) }

    /// Connects and finds the provider; refuses coffer-secret-service itself.
    static func connect() throws(SecError) -> Provider {
        var bus: OpaquePointer?
        guard ssc_open(&bus) >= 0, let bus else {
            throw .notAvailable("cannot connect to the session bus (\(String(cString: ssc_last_error()))); is DBUS_SESSION_BUS_ADDRESS set?")
        }
        var owner: UnsafeMutablePointer<CChar>?
        let r = ssc_name_owner(bus, SecretServiceImport.busName, &owner)
        guard r >= 0, let owner else {
            ssc_close(bus)
            if r == -ENXIO { throw .notAvailable("no Secret Service provider is on the session bus (nothing owns org.freedesktop.secrets)") }
            throw .io("cannot ask the bus who owns org.freedesktop.secrets: \(String(cString: ssc_last_error()))")
        }
        let unique = String(cString: owner)
        free(owner)
        let provider = Provider(bus: bus, owner: unique)
        if provider.isCofferFrontEnd {
            provider.close()
            throw .param("the provider on the session bus is coffer-secret-service itself: there is nothing to import "
                         + "(run the import while gnome-keyring, KeePassXC or KWallet still owns org.freedesktop.secrets)")
        }
        return provider
    }

    /// True when the provider's process runs coffer-secret-service (its executable's name).
    var isCofferFrontEnd: Bool {
        var pid: UInt32 = 0
        guard ssc_process_id(bus, owner, &pid) >= 0, pid > 0 else { return false }
        var buffer = [CChar](repeating: 0, count: 4096)
        let n = readlink("/proc/\(pid)/exe", &buffer, buffer.count - 1)
        guard n > 0 else { return false }
        var path = String(decoding: buffer[0..<n].map { UInt8(bitPattern: $0) }, as: UTF8.self)
        if path.hasSuffix(" (deleted)") { path = String(path.dropLast(10)) }
        return path.split(separator: "/").last == "coffer-secret-service"
    }

    /// Whether the provider is still on the bus.
    var isPresent: Bool {
        var o: UnsafeMutablePointer<CChar>?
        guard ssc_name_owner(bus, owner, &o) >= 0, let o else { return false }
        free(o)
        return true
    }

    func close() { ssc_close(bus) }

    /// OpenSession: the DH algorithm, `plain` when the provider does not support it.
    func openSession() throws(SecError) -> ProviderSession {
        for algorithm in [SecretServiceAlgorithm.dhIETF1024SHA256AES128CBCPKCS7, .plain] {
            let handshake: SecretServiceClientHandshake
            do { handshake = try SecretServiceClientHandshake.begin(algorithm) } catch { throw SecError(.internalComponent, "session key: \(error)") }
            var output: UnsafeMutableRawPointer?
            var size = 0
            var path: UnsafeMutablePointer<CChar>?
            let r = handshake.input.withUnsafeBytes { input in
                ssc_open_session(bus, owner, algorithm.rawValue, algorithm == .plain ? 0 : 1, input.baseAddress, input.count, &output, &size, &path)
            }
            if r < 0 {
                if algorithm != .plain && lastError.hasPrefix("org.freedesktop.DBus.Error.NotSupported") { continue }
                throw .io("the provider refused OpenSession(\(algorithm.rawValue)): \(lastError)")
            }
            let serverOutput = output.map { Array(UnsafeRawBufferPointer(start: $0, count: size)) } ?? []
            free(output)
            let sessionPath = path.map { String(cString: $0) } ?? "/"
            free(path)
            do {
                return ProviderSession(path: sessionPath, crypto: try handshake.complete(serverOutput: serverOutput))
            } catch {
                closeSession(sessionPath)
                throw .decode("the provider's OpenSession answer is not usable: \(error)")
            }
        }
        throw .notAvailable("the provider supports no session algorithm Coffer knows")
    }

    func closeSession(_ path: String) { _ = ssc_close_session(bus, owner, path) }

    /// A property of type `ao`.
    func paths(_ path: String, _ interface: String, _ property: String) throws(SecError) -> [String] {
        var v: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?
        guard ssc_get_paths(bus, owner, path, interface, property, &v) >= 0 else { throw .io("\(property): \(lastError)") }
        return Self.strings(v)
    }

    /// A property of type `s`.
    func string(_ path: String, _ interface: String, _ property: String) throws(SecError) -> String {
        var v: UnsafeMutablePointer<CChar>?
        guard ssc_get_string(bus, owner, path, interface, property, &v) >= 0, let v else { throw .io("\(property): \(lastError)") }
        defer { free(v) }
        return String(cString: v)
    }

    /// A property of type `b`.
    func bool(_ path: String, _ interface: String, _ property: String) throws(SecError) -> Bool {
        var v: Int32 = 0
        guard ssc_get_bool(bus, owner, path, interface, property, &v) >= 0 else { throw .io("\(property): \(lastError)") }
        return v != 0
    }

    /// An item's attributes.
    func attributes(_ item: String) throws(SecError) -> [String: String] {
        var v: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?
        guard ssc_get_attributes(bus, owner, item, &v) >= 0 else { throw .io("Attributes: \(lastError)") }
        let flat = Self.strings(v)
        var out: [String: String] = [:]
        var i = 0
        while i + 1 < flat.count { out[flat[i]] = flat[i + 1]; i += 2 }
        return out
    }

    /// Unlocks `objects` (a collection, or items) through Service.Unlock and, if the provider asks,
    /// its prompt. Nil when they are unlocked; else why not.
    func unlock(_ objects: [String]) -> String? {
        var unlocked: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?
        var prompt: UnsafeMutablePointer<CChar>?
        let r = objects.withCStrings { paths in ssc_unlock(bus, owner, paths, objects.count, &unlocked, &prompt) }
        guard r >= 0 else { return "locked, and Unlock failed: \(lastError)" }
        let done = Set(Self.strings(unlocked))
        let promptPath = prompt.map { String(cString: $0) } ?? "/"
        free(prompt)
        if objects.allSatisfy(done.contains) { return nil }
        guard promptPath != "/" else { return "locked, and the provider would not unlock it" }
        var dismissed: Int32 = 1
        var result: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?
        guard ssc_prompt(bus, owner, promptPath, SecretServiceImport.promptTimeoutSeconds * 1_000_000, &dismissed, &result) >= 0 else {
            return "locked, and its unlock prompt failed: \(lastError)"
        }
        let after = done.union(Self.strings(result))
        if dismissed != 0 { return "locked, and its unlock prompt was dismissed (no way to ask, or cancelled); unlock it in its own application and import again" }
        return objects.allSatisfy(after.contains) ? nil : "locked, still after its unlock prompt"
    }

    /// GetSecrets of `items`: each returned item's secret, decrypted into secure memory, and its content type.
    func secrets(_ items: [String], session: ProviderSession) throws(SecError) -> [String: Result<(SecureBytes, String), SecError>] {
        final class Sink {
            let crypto: SecretServiceSession
            var out: [String: Result<(SecureBytes, String), SecError>] = [:]
            init(_ crypto: SecretServiceSession) { self.crypto = crypto }
        }
        let sink = Sink(session.crypto)
        let callback: ssc_secret_sink = { context, item, parameters, parametersSize, value, valueSize, contentType in
            let sink = Unmanaged<Sink>.fromOpaque(context!).takeUnretainedValue()
            let path = String(cString: item!)
            let parameters = parametersSize > 0 ? Array(UnsafeRawBufferPointer(start: parameters, count: parametersSize)) : []
            do {
                let secret = try sink.crypto.decrypt(parameters: parameters, value: UnsafeRawBufferPointer(start: valueSize > 0 ? value : nil, count: valueSize))
                sink.out[path] = .success((secret, contentType.map { String(cString: $0) } ?? "text/plain"))
            } catch {
                sink.out[path] = .failure(.decode("the provider's secret does not decrypt: \(error)"))
            }
        }
        let r = items.withCStrings { paths in
            ssc_get_secrets(bus, owner, paths, items.count, session.path, callback, Unmanaged.passUnretained(sink).toOpaque())
        }
        guard r >= 0 else {
            for case .success(let s) in sink.out.values { s.0.wipe() }
            throw .io("GetSecrets: \(lastError)")
        }
        return sink.out
    }

    /// The name below `prefix` of `path`, unescaped.
    static func name(of path: String, below prefix: String) -> String? {
        var v: UnsafeMutablePointer<CChar>?
        guard ssc_path_name(path, prefix, &v) >= 0, let v else { return nil }
        defer { free(v) }
        return String(cString: v)
    }

    /// An item path's last component (what names an item before its label is known).
    static func itemID(_ path: String) -> String { String(path.split(separator: "/").last ?? Substring(path)) }

    /// The strings of a NULL-terminated array from the C wall, which is freed.
    static func strings(_ v: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?) -> [String] {
        guard let v else { return [] }
        defer { ssc_strv_free(v) }
        var out: [String] = []
        var i = 0
        while let p = v[i] { out.append(String(cString: p)); i += 1 }
        return out
    }
}

extension Array where Element == String {
    /// Calls `body` with these strings as a C array of `const char *`.
    func withCStrings<R>(_ body: (UnsafePointer<UnsafePointer<CChar>?>) -> R) -> R {
        let copies = map { strdup($0) }
        defer { copies.forEach { free($0) } }
        let pointers = copies.map { UnsafePointer<CChar>($0) }
        return pointers.withUnsafeBufferPointer { body($0.baseAddress!) }
    }
}

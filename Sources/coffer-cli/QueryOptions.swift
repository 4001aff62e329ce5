import ArgumentParser
import CofferCLISupport
import CofferModel

/// Parses `KEY=VALUE` into a typed attribute using Apple's short names and their kinds; any other
/// name (or one starting with `@`, for a name Apple's catalog also has) is a general attribute, whose
/// value is the text as it is (``GeneralAttributes``; the agent checks its limits).
///
/// Integers and dates (seconds since 1970) are decimal; bools are true/false/yes/no/1/0; data is
/// `hex:…` or, otherwise, the UTF-8 bytes of the text.
func parseAttribute(_ text: String) throws -> (String, AttributeValue) {
    guard let eq = text.firstIndex(of: "=") else { throw ValidationError("--attr needs KEY=VALUE, got '\(Output.escapedText(text))'") }
    let key = String(text[..<eq]), raw = String(text[text.index(after: eq)...])
    guard let kind = AttributeCatalog.kinds[key] else {
        guard !key.isEmpty else { throw ValidationError("--attr needs a name before the =") }
        return (GeneralAttributes.isGeneral(key) ? key : GeneralAttributes.key(key), .string(raw))
    }
    switch kind {
    case .string: return (key, .string(raw))
    case .integer:
        guard let v = Int64(raw) else { throw ValidationError("attribute '\(key)' takes an integer") }
        return (key, .integer(v))
    case .bool:
        switch raw.lowercased() {
        case "true", "yes", "1": return (key, .bool(true))
        case "false", "no", "0": return (key, .bool(false))
        default: throw ValidationError("attribute '\(key)' takes true or false")
        }
    case .date:
        guard let v = Double(raw), v.isFinite else { throw ValidationError("attribute '\(key)' takes seconds since 1970") }
        return (key, .date(v))
    case .data:
        if raw.hasPrefix("hex:") {
            guard let bytes = Hex.decode(String(raw.dropFirst(4))) else { throw ValidationError("attribute '\(key)': bad hex") }
            return (key, .data(bytes))
        }
        return (key, .data(Array(raw.utf8)))
    }
}

/// Item selection shared by get, find, update and delete, and the attributes of add.
struct ItemOptions: ParsableArguments {
    @Option(name: .customLong("class"), help: "Item class: genp (generic password), inet, keys, cert.", completion: ValueCompletion.itemClass)
    var itemClass: String?

    @Option(help: "Service (svce).", completion: ValueCompletion.names("svce"))
    var service: String?

    @Option(help: "Account (acct).", completion: ValueCompletion.names("acct"))
    var account: String?

    @Option(help: "Label (labl).")
    var label: String?

    @Option(name: .customLong("access-group"), help: "Access group (agrp).")
    var accessGroup: String?

    @Option(help: "Server (srvr): makes an internet password.")
    var server: String?

    @Option(name: .customLong("protocol"), help: "Protocol (ptcl): a scheme (https, imaps, ftp, ssh) or Apple's code (htps).")
    var protocolName: String?

    @Option(help: "Port (port).")
    var port: Int64?

    @Option(help: "Path (path).")
    var path: String?

    @Option(name: .customLong("attr"), help: "Another attribute NAME=VALUE (repeatable; a search needs all): Apple's short name (desc, icmt, gena, …) or any other name, a general attribute (@NAME when Apple's catalog has the name).")
    var attrs: [String] = []

    /// The item class: explicit, else internet password if --server is given, else generic password.
    func resolvedClass(defaultIfNone: Bool) throws -> ItemClass? {
        if let itemClass {
            let byName: [String: ItemClass] = ["generic": .genericPassword, "internet": .internetPassword,
                                               "key": .key, "certificate": .certificate]
            guard let c = ItemClass(rawValue: itemClass) ?? byName[itemClass] else {
                throw ValidationError("unknown class '\(itemClass)' (genp, inet, keys, cert)")
            }
            return c
        }
        if server != nil || protocolName != nil || port != nil || path != nil { return .internetPassword }
        return defaultIfNone ? .genericPassword : nil
    }

    func attributes() throws -> Attributes {
        var a: Attributes = [:]
        if let service { a["svce"] = .string(service) }
        if let account { a["acct"] = .string(account) }
        if let label { a["labl"] = .string(label) }
        if let accessGroup { a["agrp"] = .string(accessGroup) }
        if let server { a["srvr"] = .string(server) }
        if let protocolName { a["ptcl"] = .string(InternetProtocol.keychainCode(protocolName)) }
        if let port { a["port"] = .integer(port) }
        if let path { a["path"] = .string(path) }
        for text in attrs {
            let (k, v) = try parseAttribute(text)
            a[k] = v
        }
        return a
    }
}

/// Parses a protection class (`when-unlocked`, `ak`, …) for `--accessible`.
func parseAccessible(_ text: String) throws -> ProtectionClass {
    guard let c = ProtectionClass(parsing: text) else {
        let names = ProtectionClass.allCases.map(\.cliName).joined(separator: ", ")
        throw ValidationError("unknown accessibility '\(text)'; one of: \(names) (or ak, ck, dk, aku, cku, dku, akpu)")
    }
    return c
}


/// When an item is available and what authentication it needs (`add`, `ssh keygen`, `ssh import`).
struct ProtectionOptions: ParsableArguments {
    @Option(help: "When the item is available: when-unlocked (default), after-first-unlock, always, …-this-device-only, when-passcode-set-this-device-only, or ak/ck/dk/aku/cku/dku/akpu.",
            completion: ValueCompletion.accessible)
    var accessible: String?
    @Option(name: .customLong("access-control"),
            help: "Authentication the item needs: user-presence, biometry-any, biometry-current-set, device-passcode, joined with ,or, or ,and, (e.g. biometry-any,or,device-passcode). Needs a passcode; the item stays on this device.",
            completion: ValueCompletion.accessControl)
    var accessControl: String?
    @Option(name: .customLong("access-control-ops"), help: "Which operations need it: read,update,delete (default all three; read is also signing with a key).")
    var accessControlOps: String?

    func validate() throws {
        if let accessible { _ = try parseAccessible(accessible) }
        _ = try rule()
        if accessControlOps != nil && accessControl == nil { throw ValidationError("--access-control-ops needs --access-control") }
    }

    /// The parsed --access-control / --access-control-ops.
    func rule() throws -> AccessControl? {
        guard let accessControl else { return nil }
        var ops: AccessControl.Operations = []
        for word in (accessControlOps ?? "read,update,delete").split(separator: ",") {
            switch word {
            case "read": ops.insert(.useSecret)
            case "update": ops.insert(.update)
            case "delete": ops.insert(.delete)
            default: throw ValidationError("--access-control-ops takes read, update and delete, joined with commas")
            }
        }
        guard let a = AccessControl(parsing: accessControl, operations: ops) else {
            throw ValidationError("--access-control: factors are user-presence, biometry-any, biometry-current-set, device-passcode, application-password, joined with ,or, or ,and, (one kind of joiner)")
        }
        return a
    }

    /// Puts `pdmn` and `accc` into `attrs` as given.
    func apply(to attrs: inout Attributes) throws {
        if let accessible { attrs["pdmn"] = .string(try parseAccessible(accessible).shortCode) }
        if let acl = try rule() { attrs[AccessControl.attributeName] = .data(acl.encoded()) }
    }
}

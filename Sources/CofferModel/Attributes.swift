/// One attribute value, as SecItem dictionaries carry them.
public enum AttributeValue: Sendable, Hashable {
    /// A UTF-8 string (CFString).
    case string(String)
    /// A signed integer (CFNumber).
    case integer(Int64)
    /// Raw bytes (CFData). Never used for secrets: those travel as ``CofferCrypto/SecureBytes``.
    case data([UInt8])
    /// A boolean (CFBoolean).
    case bool(Bool)
    /// A date, seconds since 1970-01-01 UTC (CFDate).
    case date(Double)

    /// The kind of value, for validation and messages.
    public enum Kind: String, Sendable { case string, integer, data, bool, date }

    /// This value's kind.
    public var kind: Kind {
        switch self {
        case .string: .string
        case .integer: .integer
        case .data: .data
        case .bool: .bool
        case .date: .date
        }
    }
}

/// Attribute dictionary keyed by Apple's short names (`svce`, `acct`, `agrp`, …).
public typealias Attributes = [String: AttributeValue]

/// The value type each known attribute takes (Apple's short name → kind).
public enum AttributeCatalog {
    /// Every attribute name Coffer accepts, with its kind.
    public static let kinds: [String: AttributeValue.Kind] = {
        var k: [String: AttributeValue.Kind] = [:]
        for s in ["agrp", "pdmn", "labl", "desc", "icmt", "acct", "svce", "sdmn", "srvr", "ptcl", "atyp", "path"] { k[s] = .string }
        for i in ["crtr", "type", "port", "ctyp", "cenc", "kcls", "bsiz", "esiz", "reus"] { k[i] = .integer }
        for d in ["gena", "issr", "slnr", "subj", "skid", "pkhh", "klbl", "atag", "alis", "accc", "pubk"] { k[d] = .data }
        for b in ["sync", "invi", "nega", "scrp", "perm", "priv", "modi", "sens", "asen", "extr", "next", "encr",
                  "decr", "drve", "sign", "vrfy", "snrc", "vyrc", "wrap", "unwp"] { k[b] = .bool }
        for t in ["cdat", "mdat", "sdat", "edat"] { k[t] = .date }
        return k
    }()

    /// Attributes the keychain sets itself; callers may not write them.
    public static let readOnly: Set<String> = ["cdat", "mdat"]

    /// Attributes that get a blind index, so equality queries on them are index seeks, not scans.
    public static let indexed: Set<String> = Set(ItemClass.allCases.flatMap(\.primaryKey)).union(["labl", "class"])

    /// True if attribute `name` gets a blind-index entry: an ``indexed`` one, or any general attribute.
    public static func isIndexed(_ name: String) -> Bool { indexed.contains(name) || GeneralAttributes.isGeneral(name) }
}

/// General attributes: any string name with a string value, as Secret Service items carry them
/// (`xdg:schema`, `application`, `username`, `server` …), beside Apple's catalog attributes.
///
/// In an ``Attributes`` dictionary (and so on the wire, in backups and in sealed rows) a general
/// attribute `NAME` is the string attribute `@NAME`: no catalog name starts with `@`, so the two never
/// collide, even for a general attribute named like a catalog one (`@acct` is not `acct`). Every
/// general attribute gets a blind-index entry, so a query naming any subset of them is index seeks,
/// and matches exactly (the same bytes; no prefix or case-insensitive match).
public enum GeneralAttributes {
    /// What starts a general attribute's name in an attribute dictionary.
    public static let prefix = "@"
    /// Longest name (bytes of UTF-8, without the prefix: the wire's 256-byte names less the `@`).
    public static let maxNameBytes = 255
    /// Longest value (bytes of UTF-8), as for every string attribute.
    public static let maxValueBytes = 4096
    /// Most general attributes one item (or one query) carries: 128 of a program's own, and room for
    /// those a front end adds (the Secret Service's collection and content type).
    public static let maxCount = 160
    /// Most bytes of names and values (without prefixes) one item's general attributes hold together.
    public static let maxTotalBytes = 64 * 1024

    /// In an update's changes, this key (`@` alone) with the empty string as its value names the empty
    /// set: the item is left no general attributes (an update naming general attributes replaces the
    /// item's set with those; this one replaces it with none). Anywhere else it is refused (an empty name).
    public static let noneKey = prefix

    /// The dictionary key of general attribute `name` (`@name`).
    public static func key(_ name: String) -> String { prefix + name }

    /// True if `key` names a general attribute (it starts with `@`).
    public static func isGeneral(_ key: String) -> Bool { key.utf8.first == 0x40 }

    /// The general attribute's name in `key` (without the `@`), nil for a catalog name.
    public static func name(ofKey key: String) -> String? { isGeneral(key) ? String(decoding: key.utf8.dropFirst(), as: UTF8.self) : nil }

    /// True if `name` (without the prefix) is a name a general attribute may have: 1 to
    /// ``maxNameBytes`` bytes, no control character (C0, DEL or C1).
    public static func isValidName(_ name: String) -> Bool {
        let n = name.utf8.count
        return n >= 1 && n <= maxNameBytes && !name.unicodeScalars.contains { $0.value < 0x20 || (0x7F...0x9F).contains($0.value) }
    }
}

extension Dictionary where Key == String, Value == AttributeValue {
    /// The access group these attributes name (`agrp`), if they name one as a string.
    @inlinable
    public var accessGroup: String? {
        if case .string(let g)? = self["agrp"] { return g }
        return nil
    }

    /// The general attributes among these (name without the `@` → value).
    public var generalAttributes: [String: String] {
        var out: [String: String] = [:]
        for (k, v) in self {
            if let name = GeneralAttributes.name(ofKey: k), case .string(let s) = v { out[name] = s }
        }
        return out
    }

    /// These attributes without the general ones.
    public var withoutGeneralAttributes: Attributes { filter { !GeneralAttributes.isGeneral($0.key) } }
}

/// How many items a search returns (kSecMatchLimit).
public enum MatchLimit: Sendable, Hashable {
    /// kSecMatchLimitOne: the first match (the default).
    case one
    /// kSecMatchLimitAll: every match.
    case all
    /// At most this many.
    case count(Int)

    /// The numeric bound (nil for all).
    public var bound: Int? {
        switch self {
        case .one: 1
        case .all: nil
        case .count(let n): n
        }
    }
}

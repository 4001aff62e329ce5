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

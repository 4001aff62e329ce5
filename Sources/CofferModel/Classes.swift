/// When an item's class key is available (kSecAttrAccessible), with Apple's short codes.
///
/// The raw value is the class key's stable identifier in the keybag and the item store.
public enum ProtectionClass: UInt8, Sendable, CaseIterable, Hashable {
    /// kSecAttrAccessibleWhenUnlocked (`ak`): only while unlocked; migrates to backups.
    case whenUnlocked = 1
    /// kSecAttrAccessibleAfterFirstUnlock (`ck`): from the first unlock until restart.
    case afterFirstUnlock = 2
    /// kSecAttrAccessibleAlways (`dk`): always, even before the first unlock.
    case always = 3
    /// kSecAttrAccessibleWhenUnlockedThisDeviceOnly (`aku`).
    case whenUnlockedThisDeviceOnly = 4
    /// kSecAttrAccessibleAfterFirstUnlockThisDeviceOnly (`cku`).
    case afterFirstUnlockThisDeviceOnly = 5
    /// kSecAttrAccessibleAlwaysThisDeviceOnly (`dku`).
    case alwaysThisDeviceOnly = 6
    /// kSecAttrAccessibleWhenPasscodeSetThisDeviceOnly (`akpu`): only while unlocked, and only if a passcode is set.
    case whenPasscodeSetThisDeviceOnly = 7

    /// The three availability tiers a class belongs to.
    public enum Availability: Sendable { case whenUnlocked, afterFirstUnlock, always }

    /// Apple's short code (the value of `pdmn`).
    public var shortCode: String {
        switch self {
        case .whenUnlocked: "ak"
        case .afterFirstUnlock: "ck"
        case .always: "dk"
        case .whenUnlockedThisDeviceOnly: "aku"
        case .afterFirstUnlockThisDeviceOnly: "cku"
        case .alwaysThisDeviceOnly: "dku"
        case .whenPasscodeSetThisDeviceOnly: "akpu"
        }
    }

    /// The CLI's spelling, e.g. `when-unlocked-this-device-only`.
    public var cliName: String {
        switch self {
        case .whenUnlocked: "when-unlocked"
        case .afterFirstUnlock: "after-first-unlock"
        case .always: "always"
        case .whenUnlockedThisDeviceOnly: "when-unlocked-this-device-only"
        case .afterFirstUnlockThisDeviceOnly: "after-first-unlock-this-device-only"
        case .alwaysThisDeviceOnly: "always-this-device-only"
        case .whenPasscodeSetThisDeviceOnly: "when-passcode-set-this-device-only"
        }
    }

    /// Parses a short code (`ak`) or a CLI name (`when-unlocked`).
    public init?(parsing text: String) {
        guard let c = ProtectionClass.allCases.first(where: { $0.shortCode == text || $0.cliName == text }) else { return nil }
        self = c
    }

    /// When the class key is available.
    public var availability: Availability {
        switch self {
        case .whenUnlocked, .whenUnlockedThisDeviceOnly, .whenPasscodeSetThisDeviceOnly: .whenUnlocked
        case .afterFirstUnlock, .afterFirstUnlockThisDeviceOnly: .afterFirstUnlock
        case .always, .alwaysThisDeviceOnly: .always
        }
    }

    /// True for the classes that never leave this device (excluded from migratable backups).
    public var isThisDeviceOnly: Bool { rawValue >= 4 }

    /// True for the class that exists only while a passcode is set.
    public var requiresPasscode: Bool { self == .whenPasscodeSetThisDeviceOnly }

    /// The default for new items, as on iOS: WhenUnlocked.
    public static let defaultForNewItems = ProtectionClass.whenUnlocked
}

/// The keychain item classes (kSecClass) and their primary keys.
public enum ItemClass: String, Sendable, CaseIterable, Hashable {
    /// kSecClassGenericPassword.
    case genericPassword = "genp"
    /// kSecClassInternetPassword.
    case internetPassword = "inet"
    /// kSecClassKey.
    case key = "keys"
    /// kSecClassCertificate.
    case certificate = "cert"

    /// Attributes that make an item unique (Apple's primary key); every class adds `agrp` and `sync`.
    public var primaryKey: [String] {
        switch self {
        case .genericPassword: ["acct", "svce", "agrp", "sync"]
        case .internetPassword: ["acct", "sdmn", "srvr", "ptcl", "atyp", "port", "path", "agrp", "sync"]
        case .certificate: ["ctyp", "issr", "slnr", "agrp", "sync"]
        case .key: ["kcls", "klbl", "atag", "type", "crtr", "bsiz", "esiz", "sdat", "edat", "agrp", "sync"]
        }
    }

    /// The attributes an item of this class may carry (besides `pdmn`, which every class has).
    public var allowedAttributes: Set<String> {
        switch self {
        case .genericPassword: ItemClass.genericAllowed
        case .internetPassword: ItemClass.internetAllowed
        case .certificate: ItemClass.certificateAllowed
        case .key: ItemClass.keyAllowed
        }
    }

    private static let common: Set<String> = ["agrp", "sync", "pdmn", "labl", "cdat", "mdat", "accc"]
    private static let genericAllowed = common.union(["acct", "svce", "desc", "icmt", "gena", "crtr", "type", "invi", "nega", "scrp", "alis"])
    private static let internetAllowed = common.union(["acct", "sdmn", "srvr", "ptcl", "atyp", "port", "path", "desc", "icmt", "crtr",
                                                       "type", "invi", "nega", "scrp", "alis"])
    private static let certificateAllowed = common.union(["ctyp", "cenc", "issr", "slnr", "subj", "skid", "pkhh", "alis"])
    private static let keyAllowed = common.union(["kcls", "klbl", "atag", "type", "crtr", "bsiz", "esiz", "sdat", "edat", "perm",
                                                  "priv", "modi", "sens", "asen", "extr", "next", "encr", "decr", "drve", "sign",
                                                  "vrfy", "snrc", "vyrc", "wrap", "unwp", "alis", "pubk", "reus"])
}

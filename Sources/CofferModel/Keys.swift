/// The attribute values of key items (class `keys`) that the agent creates itself (KEY_CREATE): Apple's
/// SecKey attributes where Apple defines them, and Coffer's own where it does not (said so below).
public enum KeyItem {
    /// kSecAttrKeyClass (`kcls`): Apple's values.
    public enum KeyClass: Int64, Sendable { case `public` = 0, `private` = 1, symmetric = 2 }

    /// kSecAttrKeyType (`type`). RSA (42) and ECSECPrimeRandom (73) are Apple's values; Apple has no
    /// SecKey type for Ed25519, so Coffer uses 2100 for it (a value Apple does not use).
    public enum KeyType: Int64, Sendable, CaseIterable {
        case rsa = 42
        case ecSECPrimeRandom = 73
        case ed25519 = 2100
    }

    /// Coffer's own attribute: the public half of the key, as an SSH public key blob (RFC 4253 §6.6,
    /// RFC 5656 §3.1, RFC 8709 §4). Apple keeps a key pair's public half as a second item; Coffer keeps
    /// it on the private key's item, so a key is one write and listing it needs no secret.
    public static let publicKeyAttribute = "pubk"
    /// Coffer's own attribute: how many seconds (0 to 300) a person's authentication for this key
    /// (its access control) serves the same caller's later uses of it, as LocalAuthentication's reuse
    /// duration does for an app; 0 or absent: each use asks.
    public static let reuseAttribute = "reus"
    /// The agent's `extr` (kSecAttrIsExtractable) on the keys it creates: false, always.
    public static let extractableAttribute = "extr"
    /// The attributes only the agent sets on a key it creates (a KEY_CREATE that gives one is refused).
    public static let agentSet: Set<String> = ["kcls", "klbl", "type", "bsiz", "esiz", "extr", "perm", "sign", "sens", "asen", "next",
                                               "pubk"]

    /// True if `attributes` describe a key whose private half no request may return (`extr` false).
    public static func isNonExtractable(_ attributes: Attributes) -> Bool {
        attributes[extractableAttribute] == .bool(false)
    }
}

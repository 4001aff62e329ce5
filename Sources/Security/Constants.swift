#if os(Linux)
// The keychain's dictionary keys and values, with Apple's spellings (their strings are Apple's too, and the
// attribute names are the short names the agent stores).
public import Foundation

// MARK: Item classes (kSecClass and its values).
/// The item class of a query or item.
nonisolated(unsafe) public let kSecClass: CFString = "class" as CFString
/// A generic password.
nonisolated(unsafe) public let kSecClassGenericPassword: CFString = "genp" as CFString
/// An internet password.
nonisolated(unsafe) public let kSecClassInternetPassword: CFString = "inet" as CFString
/// A cryptographic key.
nonisolated(unsafe) public let kSecClassKey: CFString = "keys" as CFString
/// A certificate (its DER bytes as the item's data).
nonisolated(unsafe) public let kSecClassCertificate: CFString = "cert" as CFString
/// An identity (certificate and private key): Coffer stores none, errSecUnimplemented.
nonisolated(unsafe) public let kSecClassIdentity: CFString = "idnt" as CFString

// MARK: Attributes (Apple's short names, which are also Coffer's).
/// When the item can be read (its protection class).
nonisolated(unsafe) public let kSecAttrAccessible: CFString = "pdmn" as CFString
/// The item's access control (a SecAccessControl).
nonisolated(unsafe) public let kSecAttrAccessControl: CFString = "accc" as CFString
/// The item's access group.
nonisolated(unsafe) public let kSecAttrAccessGroup: CFString = "agrp" as CFString
/// Whether the item syncs: Coffer's git sync between a person's machines (no iCloud).
nonisolated(unsafe) public let kSecAttrSynchronizable: CFString = "sync" as CFString
/// When the item was made (read-only).
nonisolated(unsafe) public let kSecAttrCreationDate: CFString = "cdat" as CFString
/// When the item last changed (read-only).
nonisolated(unsafe) public let kSecAttrModificationDate: CFString = "mdat" as CFString
/// A description for people.
nonisolated(unsafe) public let kSecAttrDescription: CFString = "desc" as CFString
/// A comment.
nonisolated(unsafe) public let kSecAttrComment: CFString = "icmt" as CFString
/// The creator code (a number).
nonisolated(unsafe) public let kSecAttrCreator: CFString = "crtr" as CFString
/// The item type code (a number).
nonisolated(unsafe) public let kSecAttrType: CFString = "type" as CFString
/// A label for people.
nonisolated(unsafe) public let kSecAttrLabel: CFString = "labl" as CFString
/// Whether the item is hidden from people.
nonisolated(unsafe) public let kSecAttrIsInvisible: CFString = "invi" as CFString
/// Whether the item is a placeholder without a password.
nonisolated(unsafe) public let kSecAttrIsNegative: CFString = "nega" as CFString
/// The account name.
nonisolated(unsafe) public let kSecAttrAccount: CFString = "acct" as CFString
/// The service name.
nonisolated(unsafe) public let kSecAttrService: CFString = "svce" as CFString
/// Application data (Data).
nonisolated(unsafe) public let kSecAttrGeneric: CFString = "gena" as CFString
/// An internet password's security domain.
nonisolated(unsafe) public let kSecAttrSecurityDomain: CFString = "sdmn" as CFString
/// An internet password's server.
nonisolated(unsafe) public let kSecAttrServer: CFString = "srvr" as CFString
/// An internet password's protocol (kSecAttrProtocolHTTPS, …).
nonisolated(unsafe) public let kSecAttrProtocol: CFString = "ptcl" as CFString
/// An internet password's authentication type.
nonisolated(unsafe) public let kSecAttrAuthenticationType: CFString = "atyp" as CFString
/// An internet password's port (a number).
nonisolated(unsafe) public let kSecAttrPort: CFString = "port" as CFString
/// An internet password's path.
nonisolated(unsafe) public let kSecAttrPath: CFString = "path" as CFString
/// A key's class (kSecAttrKeyClassPublic, …).
nonisolated(unsafe) public let kSecAttrKeyClass: CFString = "kcls" as CFString
/// A key's label for programs (Data; for agent keys the SHA-256 of the public key).
nonisolated(unsafe) public let kSecAttrApplicationLabel: CFString = "klbl" as CFString
/// A key's private tag (Data).
nonisolated(unsafe) public let kSecAttrApplicationTag: CFString = "atag" as CFString
/// A key's algorithm (kSecAttrKeyTypeECSECPrimeRandom, …).
nonisolated(unsafe) public let kSecAttrKeyType: CFString = "type" as CFString
/// A key's size in bits.
nonisolated(unsafe) public let kSecAttrKeySizeInBits: CFString = "bsiz" as CFString
/// A key's effective size in bits.
nonisolated(unsafe) public let kSecAttrEffectiveKeySize: CFString = "esiz" as CFString
/// Whether SecKeyCreateRandomKey stores the key in the keychain.
nonisolated(unsafe) public let kSecAttrIsPermanent: CFString = "perm" as CFString
/// Whether the key is sensitive.
nonisolated(unsafe) public let kSecAttrIsSensitive: CFString = "sens" as CFString
/// Whether the key's private half may leave the keychain.
nonisolated(unsafe) public let kSecAttrIsExtractable: CFString = "extr" as CFString
/// Whether the key signs.
nonisolated(unsafe) public let kSecAttrCanSign: CFString = "sign" as CFString
/// Whether the key verifies.
nonisolated(unsafe) public let kSecAttrCanVerify: CFString = "vrfy" as CFString
/// Whether the key encrypts.
nonisolated(unsafe) public let kSecAttrCanEncrypt: CFString = "encr" as CFString
/// Whether the key decrypts.
nonisolated(unsafe) public let kSecAttrCanDecrypt: CFString = "decr" as CFString
/// Whether the key derives.
nonisolated(unsafe) public let kSecAttrCanDerive: CFString = "drve" as CFString
/// Whether the key wraps.
nonisolated(unsafe) public let kSecAttrCanWrap: CFString = "wrap" as CFString
/// Whether the key unwraps.
nonisolated(unsafe) public let kSecAttrCanUnwrap: CFString = "unwp" as CFString
/// The token a key lives in (kSecAttrTokenIDSecureEnclave).
nonisolated(unsafe) public let kSecAttrTokenID: CFString = "tkid" as CFString
/// A certificate's type.
nonisolated(unsafe) public let kSecAttrCertificateType: CFString = "ctyp" as CFString
/// A certificate's encoding.
nonisolated(unsafe) public let kSecAttrCertificateEncoding: CFString = "cenc" as CFString
/// A certificate's subject (Data).
nonisolated(unsafe) public let kSecAttrSubject: CFString = "subj" as CFString
/// A certificate's issuer (Data).
nonisolated(unsafe) public let kSecAttrIssuer: CFString = "issr" as CFString
/// A certificate's serial number (Data).
nonisolated(unsafe) public let kSecAttrSerialNumber: CFString = "slnr" as CFString
/// A certificate's subject key identifier (Data).
nonisolated(unsafe) public let kSecAttrSubjectKeyID: CFString = "skid" as CFString
/// A certificate's public key hash (Data).
nonisolated(unsafe) public let kSecAttrPublicKeyHash: CFString = "pkhh" as CFString

// MARK: Values of kSecAttrAccessible (Coffer's protection classes, with Apple's codes).
/// Only while unlocked.
nonisolated(unsafe) public let kSecAttrAccessibleWhenUnlocked: CFString = "ak" as CFString
/// From the first unlock after the agent started.
nonisolated(unsafe) public let kSecAttrAccessibleAfterFirstUnlock: CFString = "ck" as CFString
/// Always (deprecated by Apple; Coffer keeps it).
nonisolated(unsafe) public let kSecAttrAccessibleAlways: CFString = "dk" as CFString
/// Only while unlocked; never leaves this machine.
nonisolated(unsafe) public let kSecAttrAccessibleWhenUnlockedThisDeviceOnly: CFString = "aku" as CFString
/// From the first unlock; never leaves this machine.
nonisolated(unsafe) public let kSecAttrAccessibleAfterFirstUnlockThisDeviceOnly: CFString = "cku" as CFString
/// Always; never leaves this machine.
nonisolated(unsafe) public let kSecAttrAccessibleAlwaysThisDeviceOnly: CFString = "dku" as CFString
/// Only while unlocked and while a passcode is set.
nonisolated(unsafe) public let kSecAttrAccessibleWhenPasscodeSetThisDeviceOnly: CFString = "akpu" as CFString

// MARK: Values of kSecAttrSynchronizable in a query.
/// Match synchronizable and local items alike.
nonisolated(unsafe) public let kSecAttrSynchronizableAny: CFString = "syna" as CFString

// MARK: Values of kSecAttrKeyType and kSecAttrKeyClass.
/// ECDSA on a NIST curve (P-256 here).
nonisolated(unsafe) public let kSecAttrKeyTypeECSECPrimeRandom: CFString = "73" as CFString
/// The older name of kSecAttrKeyTypeECSECPrimeRandom.
nonisolated(unsafe) public let kSecAttrKeyTypeEC: CFString = "73" as CFString
/// RSA (stored and listed; SecKeyCreateRandomKey refuses it with errSecUnimplemented).
nonisolated(unsafe) public let kSecAttrKeyTypeRSA: CFString = "42" as CFString
/// Ed25519: Coffer's own value (Apple's SecKey has no Ed25519; CryptoKit's Curve25519 does).
nonisolated(unsafe) public let kSecAttrKeyTypeEd25519: CFString = "2100" as CFString
/// A public key.
nonisolated(unsafe) public let kSecAttrKeyClassPublic: CFString = "0" as CFString
/// A private key.
nonisolated(unsafe) public let kSecAttrKeyClassPrivate: CFString = "1" as CFString
/// A symmetric key.
nonisolated(unsafe) public let kSecAttrKeyClassSymmetric: CFString = "2" as CFString
/// A key that never leaves the agent (in the TPM where the agent uses one).
nonisolated(unsafe) public let kSecAttrTokenIDSecureEnclave: CFString = "com.apple.setoken" as CFString

// MARK: Values of kSecAttrProtocol.
/// A protocol or authentication type, as Apple spells it.
nonisolated(unsafe) public let kSecAttrProtocolFTP: CFString = "ftp " as CFString
/// A protocol or authentication type, as Apple spells it.
nonisolated(unsafe) public let kSecAttrProtocolHTTP: CFString = "http" as CFString
/// A protocol or authentication type, as Apple spells it.
nonisolated(unsafe) public let kSecAttrProtocolHTTPS: CFString = "htps" as CFString
/// A protocol or authentication type, as Apple spells it.
nonisolated(unsafe) public let kSecAttrProtocolSSH: CFString = "ssh " as CFString
/// A protocol or authentication type, as Apple spells it.
nonisolated(unsafe) public let kSecAttrProtocolSMTP: CFString = "smtp" as CFString
/// A protocol or authentication type, as Apple spells it.
nonisolated(unsafe) public let kSecAttrProtocolIMAP: CFString = "imap" as CFString
/// A protocol or authentication type, as Apple spells it.
nonisolated(unsafe) public let kSecAttrProtocolIMAPS: CFString = "imps" as CFString
/// A protocol or authentication type, as Apple spells it.
nonisolated(unsafe) public let kSecAttrProtocolPOP3: CFString = "pop3" as CFString
/// A protocol or authentication type, as Apple spells it.
nonisolated(unsafe) public let kSecAttrProtocolPOP3S: CFString = "pops" as CFString
/// A protocol or authentication type, as Apple spells it.
nonisolated(unsafe) public let kSecAttrProtocolLDAP: CFString = "ldap" as CFString
/// A protocol or authentication type, as Apple spells it.
nonisolated(unsafe) public let kSecAttrProtocolLDAPS: CFString = "ldps" as CFString
/// A protocol or authentication type, as Apple spells it.
nonisolated(unsafe) public let kSecAttrProtocolTelnet: CFString = "teln" as CFString
/// A protocol or authentication type, as Apple spells it.
nonisolated(unsafe) public let kSecAttrProtocolFTPS: CFString = "ftps" as CFString
/// A protocol or authentication type, as Apple spells it.
nonisolated(unsafe) public let kSecAttrProtocolSMB: CFString = "smb " as CFString
/// A protocol or authentication type, as Apple spells it.
nonisolated(unsafe) public let kSecAttrProtocolAFP: CFString = "afp " as CFString
/// A protocol or authentication type, as Apple spells it.
nonisolated(unsafe) public let kSecAttrProtocolIRC: CFString = "irc " as CFString
/// A protocol or authentication type, as Apple spells it.
nonisolated(unsafe) public let kSecAttrProtocolIRCS: CFString = "ircs" as CFString
/// A protocol or authentication type, as Apple spells it.
nonisolated(unsafe) public let kSecAttrProtocolSOCKS: CFString = "sox " as CFString
/// A protocol or authentication type, as Apple spells it.
nonisolated(unsafe) public let kSecAttrProtocolCIFS: CFString = "cifs" as CFString

// MARK: Values of kSecAttrAuthenticationType.
/// A protocol or authentication type, as Apple spells it.
nonisolated(unsafe) public let kSecAttrAuthenticationTypeNTLM: CFString = "ntlm" as CFString
/// A protocol or authentication type, as Apple spells it.
nonisolated(unsafe) public let kSecAttrAuthenticationTypeMSN: CFString = "msna" as CFString
/// A protocol or authentication type, as Apple spells it.
nonisolated(unsafe) public let kSecAttrAuthenticationTypeDPA: CFString = "dpaa" as CFString
/// A protocol or authentication type, as Apple spells it.
nonisolated(unsafe) public let kSecAttrAuthenticationTypeRPA: CFString = "rpaa" as CFString
/// A protocol or authentication type, as Apple spells it.
nonisolated(unsafe) public let kSecAttrAuthenticationTypeHTTPBasic: CFString = "http" as CFString
/// A protocol or authentication type, as Apple spells it.
nonisolated(unsafe) public let kSecAttrAuthenticationTypeHTTPDigest: CFString = "httd" as CFString
/// A protocol or authentication type, as Apple spells it.
nonisolated(unsafe) public let kSecAttrAuthenticationTypeHTMLForm: CFString = "form" as CFString
/// A protocol or authentication type, as Apple spells it.
nonisolated(unsafe) public let kSecAttrAuthenticationTypeDefault: CFString = "dflt" as CFString

// MARK: Search keys (kSecMatch…).
/// How many items a search returns.
nonisolated(unsafe) public let kSecMatchLimit: CFString = "m_Limit" as CFString
/// The first match (the default).
nonisolated(unsafe) public let kSecMatchLimitOne: CFString = "m_LimitOne" as CFString
/// Every match.
nonisolated(unsafe) public let kSecMatchLimitAll: CFString = "m_LimitAll" as CFString

// MARK: Return-type keys (kSecReturn…).
/// Return the item's data (its secret).
nonisolated(unsafe) public let kSecReturnData: CFString = "r_Data" as CFString
/// Return the item's attributes as a dictionary.
nonisolated(unsafe) public let kSecReturnAttributes: CFString = "r_Attributes" as CFString
/// Return a reference (a SecKey, for keys).
nonisolated(unsafe) public let kSecReturnRef: CFString = "r_Ref" as CFString
/// Return a persistent reference (Data).
nonisolated(unsafe) public let kSecReturnPersistentRef: CFString = "r_PersistentRef" as CFString

// MARK: Value keys (kSecValue…).
/// The item's data (its secret).
nonisolated(unsafe) public let kSecValueData: CFString = "v_Data" as CFString
/// A reference (a SecKey).
nonisolated(unsafe) public let kSecValueRef: CFString = "v_Ref" as CFString
/// A persistent reference (Data).
nonisolated(unsafe) public let kSecValuePersistentRef: CFString = "v_PersistentRef" as CFString

// MARK: Other keys (kSecUse…).
/// An LAContext whose evaluation and options the call uses.
nonisolated(unsafe) public let kSecUseAuthenticationContext: CFString = "u_AuthCtx" as CFString
/// What the prompt says the operation is.
nonisolated(unsafe) public let kSecUseOperationPrompt: CFString = "u_OpPrompt" as CFString
/// Whether the call may ask the person.
nonisolated(unsafe) public let kSecUseAuthenticationUI: CFString = "u_AuthUI" as CFString
/// Ask the person when an item needs it (the default).
nonisolated(unsafe) public let kSecUseAuthenticationUIAllow: CFString = "u_AuthUIA" as CFString
/// Never ask: errSecInteractionNotAllowed instead.
nonisolated(unsafe) public let kSecUseAuthenticationUIFail: CFString = "u_AuthUIF" as CFString
/// Never ask: a search leaves out what would need it.
nonisolated(unsafe) public let kSecUseAuthenticationUISkip: CFString = "u_AuthUIS" as CFString
/// Use the data protection keychain: Coffer has no other, so this is accepted and changes nothing.
nonisolated(unsafe) public let kSecUseDataProtectionKeychain: CFString = "nleg" as CFString
/// The older form of kSecUseAuthenticationUIFail (a boolean).
nonisolated(unsafe) public let kSecUseNoAuthenticationUI: CFString = "u_NoAuthUI" as CFString

// MARK: SecKeyCreateRandomKey's parameters.
/// The private key's attributes.
nonisolated(unsafe) public let kSecPrivateKeyAttrs: CFString = "private" as CFString
/// The public key's attributes.
nonisolated(unsafe) public let kSecPublicKeyAttrs: CFString = "public" as CFString

#endif

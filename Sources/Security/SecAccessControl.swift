#if os(Linux)
// SecAccessControl: an item's access control, as Coffer's AccessControl (stored sealed with the item as `accc`).
public import Foundation
import CofferModel

/// The flags of SecAccessControlCreateWithFlags, with Apple's bit values.
public struct SecAccessControlCreateFlags: OptionSet, Sendable, Hashable {
    public let rawValue: UInt
    public init(rawValue: UInt) { self.rawValue = rawValue }
    /// Biometry if enrolled, else the passcode (Coffer's user-presence factor).
    public static let userPresence = SecAccessControlCreateFlags(rawValue: 1 << 0)
    /// Any enrolled finger, also one enrolled later.
    public static let biometryAny = SecAccessControlCreateFlags(rawValue: 1 << 1)
    /// Apple's older name of ``biometryAny``.
    public static let touchIDAny = biometryAny
    /// Only the fingers enrolled when the item was made.
    public static let biometryCurrentSet = SecAccessControlCreateFlags(rawValue: 1 << 3)
    /// Apple's older name of ``biometryCurrentSet``.
    public static let touchIDCurrentSet = biometryCurrentSet
    /// The passcode (the login password, checked by PAM).
    public static let devicePasscode = SecAccessControlCreateFlags(rawValue: 1 << 4)
    /// A watch nearby: no such thing here (refused with errSecUnimplemented).
    public static let watch = SecAccessControlCreateFlags(rawValue: 1 << 5)
    /// Any one of the factors.
    public static let or = SecAccessControlCreateFlags(rawValue: 1 << 14)
    /// Every factor.
    public static let and = SecAccessControlCreateFlags(rawValue: 1 << 15)
    /// A key made in the agent may be used (signed with) there: the only use Coffer's agent keys have.
    public static let privateKeyUsage = SecAccessControlCreateFlags(rawValue: 1 << 30)
    /// An extra password the app supplies (LAContext.setCredential with .applicationPassword).
    public static let applicationPassword = SecAccessControlCreateFlags(rawValue: 1 << 31)
}

/// An item's access control: when it may be read (its protection class) and which authentication its
/// operations need.
public final class SecAccessControl: @unchecked Sendable, CustomStringConvertible {
    // @unchecked Sendable: immutable.
    /// The protection class (kSecAttrAccessible…) the item gets.
    let protection: ProtectionClass
    /// The rule; nil when the flags name no factor (only the protection class, or only privateKeyUsage).
    let rule: AccessControl?
    /// The flags as given.
    let flags: SecAccessControlCreateFlags

    init(protection: ProtectionClass, rule: AccessControl?, flags: SecAccessControlCreateFlags) {
        self.protection = protection
        self.rule = rule
        self.flags = flags
    }

    /// An access control read back from an item (`accc`), for its attributes dictionary.
    init?(stored bytes: [UInt8], protection: ProtectionClass) {
        guard let rule = AccessControl(encoded: bytes) else { return nil }
        self.protection = protection
        self.rule = rule
        var f: SecAccessControlCreateFlags = []
        for factor in rule.factors {
            switch factor {
            case .userPresence: f.insert(.userPresence)
            case .biometryAny: f.insert(.biometryAny)
            case .biometryCurrentSet: f.insert(.biometryCurrentSet)
            case .devicePasscode: f.insert(.devicePasscode)
            case .applicationPassword: f.insert(.applicationPassword)
            }
        }
        if rule.factors.count > 1 { f.insert(rule.combination == .and ? .and : .or) }
        flags = f
    }

    /// What evaluating this access control takes: the person at all, biometry only, an application password.
    package var authenticationNeeds: (person: Bool, biometryOnly: Bool, applicationPassword: Bool) {
        guard let rule else { return (false, false, false) }
        let personal = rule.factors.filter { $0 != .applicationPassword }
        return (!personal.isEmpty, !personal.isEmpty && personal.allSatisfy(\.isBiometric), rule.factors.contains(.applicationPassword))
    }

    public var description: String {
        "<SecAccessControl: \(protection.shortCode); \(rule?.description ?? "no authentication")>"
    }
}

/// Makes an access control: `protection` is a kSecAttrAccessible value (…ThisDeviceOnly ones included), `flags`
/// the factors and how they combine (one of .or and .and when there are several; .or if neither).
/// `allocator` is ignored. On a bad argument: nil, and `error` (if given) gets errSecParam.
public func SecAccessControlCreateWithFlags(_ allocator: CFAllocator?, _ protection: CFTypeRef,
                                            _ flags: SecAccessControlCreateFlags,
                                            _ error: UnsafeMutablePointer<Unmanaged<CFError>?>?) -> SecAccessControl? {
    do {
        return try makeAccessControl(protection, flags)
    } catch let f as SecFailure {
        SecurityErrors.store(f.status, f.detail, in: error)
        return nil
    } catch {
        return nil
    }
}

private func makeAccessControl(_ protection: CFTypeRef, _ flags: SecAccessControlCreateFlags) throws -> SecAccessControl {
    guard let code = ValueConversion.string(protection), let pc = ProtectionClass(parsing: code), code == pc.shortCode else {
        throw SecFailure.param("SecAccessControlCreateWithFlags: the protection is not a kSecAttrAccessible value")
    }
    let known: SecAccessControlCreateFlags = [.userPresence, .biometryAny, .biometryCurrentSet, .devicePasscode, .watch, .or, .and,
                                              .privateKeyUsage, .applicationPassword]
    guard flags.isSubset(of: known) else { throw SecFailure.param("SecAccessControlCreateWithFlags: unknown flags \(flags.rawValue)") }
    guard !flags.contains(.watch) else { throw SecFailure.unimplemented("a watch is not an authentication factor here") }
    guard !(flags.contains(.or) && flags.contains(.and)) else { throw SecFailure.param("SecAccessControlCreateWithFlags: both .or and .and") }
    var factors: [AccessControl.Factor] = []
    if flags.contains(.userPresence) { factors.append(.userPresence) }
    if flags.contains(.biometryAny) { factors.append(.biometryAny) }
    if flags.contains(.biometryCurrentSet) { factors.append(.biometryCurrentSet) }
    if flags.contains(.devicePasscode) { factors.append(.devicePasscode) }
    if flags.contains(.applicationPassword) { factors.append(.applicationPassword) }
    guard factors.count <= 1 || flags.contains(.or) || flags.contains(.and) else {
        throw SecFailure.param("SecAccessControlCreateWithFlags: several factors need .or or .and")
    }
    let rule: AccessControl?
    if factors.isEmpty {
        rule = nil
    } else {
        guard let r = AccessControl(factors: factors, combination: flags.contains(.and) ? .and : .or) else {
            throw SecFailure.param("SecAccessControlCreateWithFlags: the factors do not form a rule")
        }
        rule = r
    }
    return SecAccessControl(protection: pc, rule: rule, flags: flags)
}
#endif

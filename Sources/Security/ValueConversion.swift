#if os(Linux)
// Reading the values of a Security dictionary as Apple code puts them there (Swift values, or the Foundation
// objects they bridge to), and writing the values Apple code reads back.
import Foundation
import CofferCrypto
import CofferModel

/// An Optional of any type, seen through `Any`.
private protocol OptionalValue { var wrappedValue: Any? { get } }
extension Optional: OptionalValue {
    fileprivate var wrappedValue: Any? { map { $0 as Any } }
}

enum ValueConversion {
    /// `value` without Optional wrapping (an implicitly unwrapped `kCFBooleanTrue` put in a `[String: Any]`
    /// arrives as an Optional in an `Any`); nil for nil.
    static func unwrapped(_ value: Any) -> Any? {
        guard let optional = value as? any OptionalValue else { return value }
        return optional.wrappedValue.flatMap(unwrapped)
    }

    static func string(_ value: Any) -> String? {
        // Swift's dynamic casts see through an Optional in the Any (an implicitly unwrapped kCFBooleanTrue).
        // A dictionary's values arrive as NSString: tried first (the cheaper cast).
        switch value {
        case let s as NSString: s as String
        case let s as String: s
        case let s as Substring: String(s)
        default: nil
        }
    }

    static func bool(_ value: Any) -> Bool? {
        switch value {
        case let n as NSNumber: n.boolValue
        case let b as Bool: b
        case let i as Int where i == 0 || i == 1: i == 1
        default: nil
        }
    }

    static func integer(_ value: Any) -> Int64? {
        switch value {
        case let n as NSNumber: n.int64Value
        case let s as NSString: Int64(s as String)
        case is Bool: nil
        case let i as Int: Int64(i)
        case let i as Int32: Int64(i)
        case let i as Int64: i
        case let i as UInt32: Int64(i)
        case let i as UInt16: Int64(i)
        case let s as String: Int64(s)
        default: nil
        }
    }

    static func data(_ value: Any) -> [UInt8]? {
        switch value {
        case let d as NSData: [UInt8](d as Data)
        case let d as Data: [UInt8](d)
        case let b as [UInt8]: b
        default: nil
        }
    }

    /// A secret (kSecValueData) copied from the caller's Data into secure memory.
    static func secret(_ value: Any) -> SecureBytes? {
        switch value {
        case let d as NSData: (d as Data).withUnsafeBytes { SecureBytes(copying: $0) }
        case let d as Data: d.withUnsafeBytes { SecureBytes(copying: $0) }
        case let b as [UInt8]: b.withUnsafeBytes { SecureBytes(copying: $0) }
        default: nil
        }
    }

    static func date(_ value: Any) -> Double? {
        switch value {
        case let d as NSDate: d.timeIntervalSince1970
        case let d as Date: d.timeIntervalSince1970
        default: nil
        }
    }

    /// The attribute value `value` as an attribute of kind `kind` takes it (the kind of its name in Coffer's
    /// catalog, which is Apple's); nil if it is not of that kind.
    static func attribute(_ kind: AttributeValue.Kind, _ value: Any) -> AttributeValue? {
        switch kind {
        case .string: return string(value).map { .string($0) }
        case .integer: return integer(value).map { .integer($0) }
        case .data:
            // Apple's CF stores a string given for a data attribute (a tag) as its UTF-8 bytes.
            if let s = string(value) { return .data(Array(s.utf8)) }
            return data(value).map { .data($0) }
        case .bool: return bool(value).map { .bool($0) }
        case .date: return date(value).map { .date($0) }
        }
    }

    /// What Apple code reads back for an attribute value.
    static func object(_ value: AttributeValue) -> Any {
        switch value {
        case .string(let s): s
        case .integer(let i): Int(i)
        case .data(let d): Data(d)
        case .bool(let b): b
        case .date(let t): Date(timeIntervalSince1970: t)
        }
    }

    /// The entries of a Security dictionary by key (keys that are not strings are refused), its values as the
    /// dictionary holds them (NSString, NSNumber, NSData, …: the casts here take those first). Read as its keys
    /// and its values, two arrays in the same order: on swift-corelibs-foundation that copies a plain
    /// NSDictionary's storage as it is, where `getObjects(_:andKeys:count:)` and iteration bridge every key and
    /// value back to a Swift value (a protocol conformance lookup each; 2.5 times the time for a SecItem query).
    static func entries(_ dictionary: CFDictionary) throws(SecFailure) -> [(String, Any)] {
        var keys = dictionary.allKeys, objects = dictionary.allValues
        if keys.count != objects.count {
            // A dictionary changed by another thread meanwhile: one consistent copy instead.
            keys = []; objects = []
            dictionary.getObjects(&objects, andKeys: &keys, count: dictionary.count)
        }
        var out: [(String, Any)] = []
        out.reserveCapacity(keys.count)
        for (k, v) in zip(keys, objects) {
            guard let key = string(k) else { throw .param("a dictionary key that is not a string") }
            out.append((key, v))
        }
        return out
    }
}
#endif

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

    // A dictionary's keys and values are objects (NSString, NSNumber, NSData, …), read here as `AnyObject`: taking
    // one out of its `Any` (`as AnyObject`) and checking its class costs about a third of a cast from the `Any`
    // itself, which goes through the runtime's general cast (existential unboxing, bridging lookups: some 750
    // instructions a cast on swift-corelibs-foundation). What is not one of those objects (a boxed Swift value,
    // a SecKey) is read by the `Any` versions below, as before.

    static func string(_ object: AnyObject) -> String? {
        if let s = object as? NSString { return s as String }
        return string(object as Any)
    }

    static func bool(_ object: AnyObject) -> Bool? {
        if let n = object as? NSNumber { return n.boolValue }
        return bool(object as Any)
    }

    static func integer(_ object: AnyObject) -> Int64? {
        if let n = object as? NSNumber { return n.int64Value }
        return integer(object as Any)
    }

    static func data(_ object: AnyObject) -> [UInt8]? {
        if let d = object as? NSData { return [UInt8](d as Data) }
        return data(object as Any)
    }

    static func secret(_ object: AnyObject) -> SecureBytes? {
        if let d = object as? NSData { return (d as Data).withUnsafeBytes { SecureBytes(copying: $0) } }
        return secret(object as Any)
    }

    static func date(_ object: AnyObject) -> Double? {
        if let d = object as? NSDate { return d.timeIntervalSince1970 }
        return date(object as Any)
    }

    /// The attribute value `object` as an attribute of kind `kind` takes it (as for a value in an `Any`, below).
    static func attribute(_ kind: AttributeValue.Kind, _ object: AnyObject) -> AttributeValue? {
        switch kind {
        case .string: return string(object).map { .string($0) }
        case .integer: return integer(object).map { .integer($0) }
        case .data:
            if let s = string(object) { return .data(Array(s.utf8)) }
            return data(object).map { .data($0) }
        case .bool: return bool(object).map { .bool($0) }
        case .date: return date(object).map { .date($0) }
        }
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
    /// objects the dictionary holds; see ``forEachEntry(_:_:)``.
    static func entries(_ dictionary: CFDictionary) throws(SecFailure) -> [(String, AnyObject)] {
        var out: [(String, AnyObject)] = []
        out.reserveCapacity(dictionary.count)
        try forEachEntry(dictionary) { key, value in out.append((key, value)) }
        return out
    }

    /// Calls `body` with each entry of a Security dictionary: its key (a dictionary with a key that is not a
    /// string is refused, whatever `body` threw for an entry before it) and its value as the object the
    /// dictionary holds (NSString, NSNumber, NSData, …: the casts here take those first). Read as its keys and
    /// its values, two arrays in the same order: on swift-corelibs-foundation that copies a plain NSDictionary's
    /// storage as it is, where `getObjects(_:andKeys:count:)` and iteration bridge every key and value back to a
    /// Swift value (a protocol conformance lookup each; 2.5 times the time for a SecItem query).
    static func forEachEntry(_ dictionary: CFDictionary, _ body: (String, AnyObject) throws(SecFailure) -> Void) throws(SecFailure) {
        var keys = dictionary.allKeys, objects = dictionary.allValues
        if keys.count != objects.count {
            // A dictionary changed by another thread meanwhile: one consistent copy instead.
            keys = []; objects = []
            dictionary.getObjects(&objects, andKeys: &keys, count: dictionary.count)
        }
        // Made only when thrown (a message built on every call costs).
        var notAString: SecFailure { .param("a dictionary key that is not a string") }
        do throws(SecFailure) {
            for i in keys.indices {
                // What the dictionary holds is an object (a Swift value in it is boxed): `as AnyObject` unwraps it.
                guard let key = string(keys[i] as AnyObject) else { throw notAString }
                try body(key, objects[i] as AnyObject)
            }
        } catch {
            if keys.contains(where: { string($0 as AnyObject) == nil }) { throw notAString }
            throw error
        }
    }
}
#endif

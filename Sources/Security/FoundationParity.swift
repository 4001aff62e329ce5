#if os(Linux)
// Equality of the CF types' objects with their Swift values, as Apple's Foundation has it.
//
// On Apple platforms an NSString is equal, as an AnyHashable, to the String with the same characters (and a
// CFBoolean to the Bool): Foundation gives each class a custom AnyHashable representation, its Swift value.
// swift-corelibs-foundation does not (NSData's it has), so there
// `AnyHashable("genp" as NSString) != AnyHashable("genp")`. Code written for Apple meets that wherever it
// compares dictionaries holding Security's constants: `NSDictionary(dictionary: a).isEqual(to: b)` reads
// the NSDictionary's values back bridged to Swift values (`kSecClassGenericPassword` comes back a String)
// and compares them as AnyHashables with the other dictionary's objects, so two identical queries compare
// unequal. (SimpleKeychain's own tests compare its queries that way.) Since the CF types are these
// classes here (CoreFoundationTypes.swift), this module gives them Apple's representation.
//
// The conformances are Foundation's classes' and the standard library's protocol's, neither this module's:
// should swift-corelibs-foundation add its own, the compiler warns of a redundant conformance (an error in
// CI, where warnings are errors), as it does for NSData's, and the conformance here is then deleted.
public import Foundation

extension NSString: @retroactive _HasCustomAnyHashableRepresentation {
    /// The String with the same characters (a copy: a mutable string changed later keeps its hash), as on
    /// Apple platforms.
    public func _toCustomAnyHashable() -> AnyHashable? {
        AnyHashable(String._unconditionallyBridgeFromObjectiveC(self))
    }
}

extension NSNumber: @retroactive _HasCustomAnyHashableRepresentation {
    /// A boolean (`kCFBooleanTrue`, `NSNumber(value: true)`: objCType `c` on swift-corelibs-foundation,
    /// whose integers of every width are `i`, `q`, …) is the Bool, as on Apple platforms; any other number
    /// keeps Foundation's representation (which already equals the Swift number's).
    public func _toCustomAnyHashable() -> AnyHashable? {
        unsafe objCType.pointee == CChar(UInt8(ascii: "c")) ? AnyHashable(boolValue) : nil
    }
}
#endif

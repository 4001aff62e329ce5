#if os(Linux)
// The Core Foundation types as Swift code written for Apple platforms sees them, on swift-corelibs-foundation.
//
// On Apple platforms `CFString`, `CFDictionary`, … are toll-free bridged to the Foundation classes; on Linux
// Foundation does not export Core Foundation's types to Swift. Here each is the Foundation class it bridges
// to, so that `query as CFDictionary`, `kSecClass as String`, `result as? Data` and
// `result as? [[String: Any]]` compile and behave as on Apple platforms.
public import Foundation

/// Core Foundation's string (bridged to `String`): `NSString` here.
public typealias CFString = NSString
/// Core Foundation's dictionary (bridged to `[String: Any]`): `NSDictionary` here.
public typealias CFDictionary = NSDictionary
/// Core Foundation's mutable dictionary: `NSMutableDictionary` here.
public typealias CFMutableDictionary = NSMutableDictionary
/// Core Foundation's data (bridged to `Data`): `NSData` here.
public typealias CFData = NSData
/// Core Foundation's array (bridged to `[Any]`): `NSArray` here.
public typealias CFArray = NSArray
/// Core Foundation's boolean (`kCFBooleanTrue`, `kCFBooleanFalse`): `NSNumber` here.
public typealias CFBoolean = NSNumber
/// Core Foundation's number: `NSNumber` here.
public typealias CFNumber = NSNumber
/// Core Foundation's date: `NSDate` here.
public typealias CFDate = NSDate
/// Core Foundation's error (bridged to `Error`): `NSError` here.
public typealias CFError = NSError
/// Any Core Foundation object.
public typealias CFTypeRef = AnyObject
/// Core Foundation's index type.
public typealias CFIndex = Int
/// Core Foundation's type identifier (CFGetTypeID, SecCertificateGetTypeID, …).
public typealias CFTypeID = UInt
/// The status every Security function returns: `errSecSuccess` (0) or an `errSec…` code.
public typealias OSStatus = Int32
/// MacTypes' "no error" (0), which `import Security` brings on Apple platforms too.
public let noErr: OSStatus = 0

/// Core Foundation's allocator: only the default exists here.
public typealias CFAllocator = NSObject
/// The default allocator (what nil means too).
nonisolated(unsafe) public let kCFAllocatorDefault: CFAllocator? = nil

/// The type of a Core Foundation object, as Apple code tells a search's results apart
/// (`CFGetTypeID(ref) == SecCertificateGetTypeID()`): the Security types' ids, and those of the Foundation
/// classes the CF types are here (CFNumber's for booleans too); 0 for anything else.
public func CFGetTypeID(_ cf: CFTypeRef!) -> CFTypeID {
    switch cf {
    case is SecCertificate: TypeIDs.certificate
    case is SecKey: TypeIDs.key
    case is SecAccessControl: TypeIDs.accessControl
    case is NSString: TypeIDs.string
    case is NSData: TypeIDs.data
    case is NSDictionary: TypeIDs.dictionary
    case is NSArray: TypeIDs.array
    case is NSNumber: TypeIDs.number
    case is NSDate: TypeIDs.date
    default: 0
    }
}

/// The type id of CFString.
public func CFStringGetTypeID() -> CFTypeID { TypeIDs.string }
/// The type id of CFData.
public func CFDataGetTypeID() -> CFTypeID { TypeIDs.data }
/// The type id of CFDictionary.
public func CFDictionaryGetTypeID() -> CFTypeID { TypeIDs.dictionary }
/// The type id of CFArray.
public func CFArrayGetTypeID() -> CFTypeID { TypeIDs.array }
/// The type id of CFNumber (and of CFBoolean: both are NSNumber here).
public func CFNumberGetTypeID() -> CFTypeID { TypeIDs.number }
/// The type id of CFDate.
public func CFDateGetTypeID() -> CFTypeID { TypeIDs.date }

/// The type ids this module hands out (stable within a process, as Apple's; not Apple's numbers).
enum TypeIDs {
    static let string: CFTypeID = 7, data: CFTypeID = 20, dictionary: CFTypeID = 18, array: CFTypeID = 19, number: CFTypeID = 22,
               date: CFTypeID = 42
    static let key: CFTypeID = 0x5EC0_0001, certificate: CFTypeID = 0x5EC0_0002, accessControl: CFTypeID = 0x5EC0_0003
}

/// The type id of SecKey.
public func SecKeyGetTypeID() -> CFTypeID { TypeIDs.key }
/// The type id of SecAccessControl.
public func SecAccessControlGetTypeID() -> CFTypeID { TypeIDs.accessControl }

/// Core Foundation's true, as Apple declares it (implicitly unwrapped).
public let kCFBooleanTrue: CFBoolean! = NSNumber(value: true)
/// Core Foundation's false, as Apple declares it (implicitly unwrapped).
public let kCFBooleanFalse: CFBoolean! = NSNumber(value: false)
#endif

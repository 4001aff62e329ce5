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
/// The status every Security function returns: `errSecSuccess` (0) or an `errSec…` code.
public typealias OSStatus = Int32
/// MacTypes' "no error" (0), which `import Security` brings on Apple platforms too.
public let noErr: OSStatus = 0

/// Core Foundation's allocator: only the default exists here.
public typealias CFAllocator = NSObject
/// The default allocator (what nil means too).
nonisolated(unsafe) public let kCFAllocatorDefault: CFAllocator? = nil

/// Core Foundation's true, as Apple declares it (implicitly unwrapped).
public let kCFBooleanTrue: CFBoolean! = NSNumber(value: true)
/// Core Foundation's false, as Apple declares it (implicitly unwrapped).
public let kCFBooleanFalse: CFBoolean! = NSNumber(value: false)
#endif

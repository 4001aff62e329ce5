import CofferCrypto
import CofferModel

/// A device in a sync circle: the first 16 bytes of SHA-256 over its two public keys (SyncFormat.md).
public struct SyncDeviceID: Hashable, Comparable, Sendable, CustomStringConvertible {
    /// The 16 bytes.
    public let bytes: [UInt8]
    public static let byteCount = 16

    /// An identifier from exactly 16 bytes; nil otherwise.
    public init?<C: Collection>(bytes: C) where C.Element == UInt8 {
        guard bytes.count == Self.byteCount else { return nil }
        self.bytes = Array(bytes)
    }

    /// From 32 lowercase hexadecimal digits (its file and directory name); nil otherwise.
    public init?(hex: String) {
        guard let b = Hex.decodeLowercase(Array(hex.utf8)[...], byteCount: Self.byteCount) else { return nil }
        self.bytes = b
    }

    /// The identifier of the device holding these public keys.
    public static func of(signingKey: [UInt8], boxKey: [UInt8]) -> SyncDeviceID {
        SyncDeviceID(bytes: SHA256.hash(Array("coffer-sync device".utf8) + signingKey + boxKey).prefix(byteCount))!
    }

    /// 32 lowercase hexadecimal digits.
    public var hex: String { Hex.encode(bytes) }
    public var description: String { hex }
    public static func < (a: SyncDeviceID, b: SyncDeviceID) -> Bool { a.bytes.lexicographicallyPrecedes(b.bytes) }
}

/// A hybrid logical clock reading (Kulkarni et al.): wall-clock milliseconds, a counter for events
/// within one millisecond or behind a clock seen from another device, and the device as the final
/// tie-break, so every two readings in a circle are ordered and the same on every device.
public struct HLCTimestamp: Comparable, Hashable, Sendable {
    public let wallMillis: UInt64
    public let counter: UInt32
    public let device: SyncDeviceID

    public init(wallMillis: UInt64, counter: UInt32, device: SyncDeviceID) {
        self.wallMillis = wallMillis
        self.counter = counter
        self.device = device
    }

    public static func < (a: HLCTimestamp, b: HLCTimestamp) -> Bool {
        if a.wallMillis != b.wallMillis { return a.wallMillis < b.wallMillis }
        if a.counter != b.counter { return a.counter < b.counter }
        return a.device < b.device
    }
}

/// One device's hybrid logical clock: every reading it gives is later than every reading it gave or
/// observed before, and never far from its wall clock.
public struct HybridLogicalClock: Sendable {
    public let device: SyncDeviceID
    /// The last reading's wall part and counter (0, 0 before the first).
    public private(set) var wallMillis: UInt64
    public private(set) var counter: UInt32

    public init(device: SyncDeviceID, wallMillis: UInt64 = 0, counter: UInt32 = 0) {
        self.device = device
        self.wallMillis = wallMillis
        self.counter = counter
    }

    /// A reading for a local event at wall-clock time `now` (milliseconds since the epoch).
    public mutating func tick(now: UInt64) -> HLCTimestamp {
        if now > wallMillis {
            wallMillis = now
            counter = 0
        } else {
            counter &+= 1
        }
        return HLCTimestamp(wallMillis: wallMillis, counter: counter, device: device)
    }

    /// Takes in a reading from another device, so that the next local reading comes after it.
    public mutating func observe(_ t: HLCTimestamp) {
        if t.wallMillis > wallMillis {
            wallMillis = t.wallMillis
            counter = t.counter
        } else if t.wallMillis == wallMillis, t.counter > counter {
            counter = t.counter
        }
    }
}

public import CofferCrypto
import CofferModel

/// A device's own sync keys: an Ed25519 key pair that signs what it writes and an X25519 key pair
/// the circle key is sealed to. The secret halves stay in secure memory; the agent keeps them in the
/// keybag (a ThisDeviceOnly class: they never leave the machine).
public struct SyncDeviceKeys: Sendable {
    public let signingPublicKey: [UInt8]
    public let signingSecretKey: SecureBytes
    public let boxPublicKey: [UInt8]
    public let boxSecretKey: SecureBytes

    /// New keys for a device joining or founding a circle.
    public static func generate() -> SyncDeviceKeys {
        let s = Ed25519.generateKeyPair(), b = SealedBox.generateKeyPair()
        return SyncDeviceKeys(signingPublicKey: s.publicKey, signingSecretKey: s.secretKey, boxPublicKey: b.publicKey, boxSecretKey: b.secretKey)
    }

    /// The keys derived from a 32-byte Ed25519 seed and a 32-byte X25519 secret key: what the
    /// keybag stores (``exportSecret()``), and fixed keys for vectors.
    public static func restore(ed25519Seed seed: SecureBytes, x25519SecretKey box: SecureBytes) throws(SyncError) -> SyncDeviceKeys {
        guard seed.count == Ed25519.seedBytes, box.count == SealedBox.secretKeyBytes else {
            throw .malformed("sync device keys must be a 32-byte Ed25519 seed and a 32-byte X25519 key")
        }
        let s = Ed25519.keyPair(seed: seed)
        return SyncDeviceKeys(signingPublicKey: s.publicKey, signingSecretKey: s.secretKey,
                              boxPublicKey: SealedBox.publicKey(secretKey: box), boxSecretKey: box)
    }

    /// The 64 secret bytes ``restore(ed25519Seed:x25519SecretKey:)`` takes back: Ed25519 seed ‖ X25519 secret key.
    public func exportSecret() -> SecureBytes {
        let out = SecureBytes(count: 64)
        unsafe out.withUnsafeMutableBytes { o in
            unsafe signingSecretKey.withUnsafeBytes { s in unsafe o.baseAddress!.copyMemory(from: s.baseAddress!, byteCount: 32) }
            unsafe boxSecretKey.withUnsafeBytes { b in unsafe (o.baseAddress! + 32).copyMemory(from: b.baseAddress!, byteCount: 32) }
        }
        return out
    }

    public var id: SyncDeviceID { SyncDeviceID.of(signingKey: signingPublicKey, boxKey: boxPublicKey) }

    func sign(_ message: [UInt8]) -> [UInt8] { Ed25519.sign(message, secretKey: signingSecretKey) }

    /// `body` followed by this device's signature over (`body` ‖ its id ‖ `path`): how records, seen
    /// files and checkpoints are bound to their writer and to the path they were written at.
    func signFile(_ body: [UInt8], path: String) -> [UInt8] { body + sign(body + id.bytes + Array(path.utf8)) }
}

/// A device as the circle knows it: the public file `devices/ID.device` (SyncFormat.md), signed by
/// the device itself. Publishing it asks to join; only a member's approval (a circle epoch listing
/// it) makes it a member.
public struct SyncDevice: Sendable, Equatable {
    public static let magic: [UInt8] = Array("CSD1".utf8)
    public static let version: UInt8 = 1
    /// The longest device name, in UTF-8 bytes.
    public static let maxNameBytes = 128

    public let signingPublicKey: [UInt8]
    public let boxPublicKey: [UInt8]
    /// A name for people ("laptop"), chosen by the device; never trusted for anything.
    public let name: String
    /// When the device made its keys (milliseconds since the epoch).
    public let createdMillis: UInt64

    public var id: SyncDeviceID { SyncDeviceID.of(signingKey: signingPublicKey, boxKey: boxPublicKey) }

    /// True if `file` ends in this device's signature over (everything before it ‖ its id ‖ `path`)
    /// (``SyncDeviceKeys``' `signFile`).
    func signed(_ file: [UInt8], at path: String) -> Bool {
        guard file.count >= Ed25519.signatureBytes else { return false }
        return Ed25519.verify(signature: Array(file.suffix(Ed25519.signatureBytes)),
                              message: Array(file.dropLast(Ed25519.signatureBytes)) + id.bytes + Array(path.utf8), publicKey: signingPublicKey)
    }

    /// The repository path of this device's file.
    public var path: String { "devices/\(id.hex).device" }

    public init(keys: SyncDeviceKeys, name: String, createdMillis: UInt64) {
        signingPublicKey = keys.signingPublicKey
        boxPublicKey = keys.boxPublicKey
        self.name = String(decoding: Array(name.utf8).prefix(Self.maxNameBytes), as: UTF8.self)
        self.createdMillis = createdMillis
    }

    private init(signing: [UInt8], box: [UInt8], name: String, created: UInt64) {
        signingPublicKey = signing
        boxPublicKey = box
        self.name = name
        createdMillis = created
    }

    private var signedPart: [UInt8] {
        var w = ByteWriter()
        w.raw(Self.magic)
        w.u8(Self.version)
        w.raw(signingPublicKey)
        w.raw(boxPublicKey)
        w.shortString(name)
        w.u64(createdMillis)
        return w.take()
    }

    /// The file's bytes, signed with `keys` (which must be this device's).
    public func encoded(signedWith keys: SyncDeviceKeys) -> [UInt8] {
        precondition(keys.signingPublicKey == signingPublicKey, "a device file is signed by its own device")
        let body = signedPart
        return body + keys.sign(body)
    }

    /// Reads and checks a device file: format, the self-signature, and (when given) that it is the
    /// file for `expected` (its name).
    public static func decode(_ bytes: [UInt8], expected: SyncDeviceID? = nil) throws(SyncError) -> SyncDevice {
        var r = ByteReader(bytes)
        let device: SyncDevice, signature: [UInt8]
        do throws(DecodeError) {
            guard Array(try r.raw(4, "magic")) == magic else { throw DecodeError("not a Coffer sync device file") }
            let v = try r.u8("version")
            guard v == version else { throw DecodeError("device file version \(v) is not supported (this Coffer reads \(version))") }
            let signing = Array(try r.raw(32, "signing key")), box = Array(try r.raw(32, "box key"))
            let name = try r.shortString("name")
            guard name.utf8.count <= maxNameBytes else { throw DecodeError("device name longer than \(maxNameBytes) bytes") }
            let created = try r.u64("creation time")
            device = SyncDevice(signing: signing, box: box, name: name, created: created)
            signature = Array(try r.raw(Ed25519.signatureBytes, "signature"))
            try r.expectEnd("the device file")
        } catch {
            throw .malformed("device file\(expected.map { " \($0.hex)" } ?? ""): \(error.reason)")
        }
        guard Ed25519.verify(signature: signature, message: device.signedPart, publicKey: device.signingPublicKey) else {
            throw .forged("device file\(expected.map { " \($0.hex)" } ?? "") is not signed by its own key")
        }
        if let expected, device.id != expected {
            throw .forged("device file \(expected.hex) holds the keys of device \(device.id.hex)")
        }
        return device
    }
}

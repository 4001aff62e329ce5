public import CofferCrypto
import CofferModel

/// The code a joining device shows and a member types (SyncFormat.md, "Pairing"): 12 characters of
/// RFC 4648 base32 as `LLLL-SSSS-SSSS`. The first four (the locator, 20 bits) name the pairing's
/// directory on the remote and are public; all twelve are CPace's password, so the eight secret ones
/// (40 bits) never reach the remote in any form an attacker can test offline.
public struct SyncPairingCode: Sendable, Equatable {
    static let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZ234567".utf8)
    /// The code as shown, `LLLL-SSSS-SSSS`.
    public let text: String

    private init(text: String) { self.text = text }

    /// A fresh random code.
    public static func random() -> SyncPairingCode {
        let bytes = Random.bytes(12)
        let chars = bytes.map { alphabet[Int($0 & 31)] }
        return SyncPairingCode(text: group(chars))
    }

    private static func group(_ c: [UInt8]) -> String {
        String(decoding: c[0..<4], as: UTF8.self) + "-" + String(decoding: c[4..<8], as: UTF8.self) + "-" + String(decoding: c[8..<12], as: UTF8.self)
    }

    /// `text` read leniently (lower case, spaces or dashes anywhere); nil if it cannot be a code.
    public static func parse(_ text: String) -> SyncPairingCode? {
        let u = Array(text.uppercased().utf8.filter { $0 != UInt8(ascii: "-") && $0 != UInt8(ascii: " ") })
        let valid = Set(alphabet)
        guard u.count == 12, u.allSatisfy(valid.contains) else { return nil }
        return SyncPairingCode(text: group(u))
    }

    /// The locator, lower case, as the directory `pairing/LOCATOR` is named.
    public var locator: String { String(text.prefix(4)).lowercased() }
    /// The pairing's directory on the remote.
    public var directory: String { "pairing/" + locator }

    /// CPace's password: the twelve characters without dashes, in secure memory.
    var password: SecureBytes {
        let chars = Array(text.utf8.filter { $0 != UInt8(ascii: "-") })
        return unsafe chars.withUnsafeBytes { unsafe SecureBytes(copying: $0) }
    }
}

/// The three pairing messages (SyncFormat.md, "Pairing"), exchanged through the remote, which may be
/// entirely in an attacker's hands: the joiner's request (its device file and CPace share), the
/// approving member's response (its share, the circle it vouches for and its confirmation tag), and
/// the joiner's confirmation (its tag, or its refusal). Each is `"CSP1"` ‖ u8 version ‖ u8 kind ‖
/// the 16-byte session id ‖ the kind's fields.
public enum SyncPairing {
    public static let magic: [UInt8] = Array("CSP1".utf8)
    public static let version: UInt8 = 1
    /// CPace's channel identifier for Coffer's pairing, format 1.
    static let channel = Array("coffer-sync pairing 1".utf8)
    public static let sidBytes = 16

    public enum Kind: UInt8, Sendable { case request = 1, response = 2, confirm = 3 }

    /// `pairing/LOCATOR/request`, written by the joiner.
    public struct Request: Sendable {
        public let sid: [UInt8]
        /// The joiner's CPace share Ya.
        public let share: [UInt8]
        /// The joiner's device file, as signed by it.
        public let deviceFile: [UInt8]
        public let device: SyncDevice
        public let encoded: [UInt8]

        /// ADa: what the joiner's share vouches for (its device file, by hash).
        var associatedData: [UInt8] { Array("coffer-sync joiner".utf8) + SHA256.hash(deviceFile) }

        init(sid: [UInt8], share: [UInt8], deviceFile: [UInt8]) throws(SyncError) {
            var w = ByteWriter()
            w.raw(magic); w.u8(version); w.u8(Kind.request.rawValue); w.raw(sid); w.raw(share); w.blob(deviceFile)
            self = try Self.decode(w.take())
        }

        private init(sid: [UInt8], share: [UInt8], deviceFile: [UInt8], device: SyncDevice, encoded: [UInt8]) {
            (self.sid, self.share, self.deviceFile, self.device, self.encoded) = (sid, share, deviceFile, device, encoded)
        }

        public static func decode(_ bytes: [UInt8]) throws(SyncError) -> Request {
            var r = ByteReader(bytes)
            let (sid, share, file): ([UInt8], [UInt8], [UInt8])
            do throws(DecodeError) {
                sid = try header(&r, .request)
                share = Array(try r.raw(CPace.elementBytes, "share"))
                file = Array(try r.blob(max: 4096, "device file"))
                try r.expectEnd("the pairing request")
            } catch {
                throw .malformed("pairing request: \(error.reason)")
            }
            return Request(sid: sid, share: share, deviceFile: file, device: try SyncDevice.decode(file), encoded: bytes)
        }
    }

    /// `pairing/LOCATOR/response`, written by the approving member.
    public struct Response: Sendable {
        public let sid: [UInt8]
        /// The member's CPace share Yb.
        public let share: [UInt8]
        /// The approving member's device id.
        public let approver: SyncDeviceID
        /// The circle the member vouches for: its first epoch's hash, and its current epoch.
        public let firstEpochHash: [UInt8]
        public let epoch: UInt64
        public let epochHash: [UInt8]
        /// Tb: the member's key-confirmation tag.
        public let tag: [UInt8]
        public let encoded: [UInt8]

        /// ADb: the approver and the circle it vouches for.
        var associatedData: [UInt8] { Self.associatedData(approver, firstEpochHash, epoch, epochHash) }

        static func associatedData(_ approver: SyncDeviceID, _ first: [UInt8], _ epoch: UInt64, _ hash: [UInt8]) -> [UInt8] {
            var w = ByteWriter()
            w.raw(Array("coffer-sync approver".utf8)); w.raw(approver.bytes); w.raw(first); w.u64(epoch); w.raw(hash)
            return w.take()
        }

        static func make(sid: [UInt8], share: [UInt8], approver: SyncDeviceID, first: [UInt8], epoch: UInt64, epochHash: [UInt8],
                         tag: [UInt8]) throws(SyncError) -> Response {
            var w = ByteWriter()
            w.raw(magic); w.u8(version); w.u8(Kind.response.rawValue); w.raw(sid); w.raw(share); w.raw(approver.bytes)
            w.raw(first); w.u64(epoch); w.raw(epochHash); w.raw(tag)
            return try decode(w.take())
        }

        public static func decode(_ bytes: [UInt8]) throws(SyncError) -> Response {
            var r = ByteReader(bytes)
            do throws(DecodeError) {
                let sid = try header(&r, .response)
                let share = Array(try r.raw(CPace.elementBytes, "share"))
                let approver = SyncDeviceID(bytes: try r.raw(16, "approver"))!
                let first = Array(try r.raw(32, "first epoch hash"))
                let epoch = try r.u64("epoch")
                guard epoch >= 1 else { throw DecodeError("epoch 0") }
                let hash = Array(try r.raw(32, "epoch hash"))
                let tag = Array(try r.raw(CPace.tagBytes, "tag"))
                try r.expectEnd("the pairing response")
                return Response(sid: sid, share: share, approver: approver, firstEpochHash: first, epoch: epoch, epochHash: hash, tag: tag,
                                encoded: bytes)
            } catch {
                throw .malformed("pairing response: \(error.reason)")
            }
        }
    }

    /// `pairing/LOCATOR/confirm`, written by the joiner: its tag Ta (the response proved the code), or
    /// a refusal (it did not: the run is over on both sides).
    public struct Confirm: Sendable {
        public let sid: [UInt8]
        /// Ta, or nil for a refusal.
        public let tag: [UInt8]?
        public let encoded: [UInt8]

        static func make(sid: [UInt8], tag: [UInt8]?) throws(SyncError) -> Confirm {
            var w = ByteWriter()
            w.raw(magic); w.u8(version); w.u8(Kind.confirm.rawValue); w.raw(sid)
            if let tag { w.u8(1); w.raw(tag) } else { w.u8(0) }
            return try decode(w.take())
        }

        public static func decode(_ bytes: [UInt8]) throws(SyncError) -> Confirm {
            var r = ByteReader(bytes)
            do throws(DecodeError) {
                let sid = try header(&r, .confirm)
                let verdict = try r.u8("verdict")
                guard verdict <= 1 else { throw DecodeError("verdict \(verdict)") }
                let tag = verdict == 1 ? Array(try r.raw(CPace.tagBytes, "tag")) : nil
                try r.expectEnd("the pairing confirmation")
                return Confirm(sid: sid, tag: tag, encoded: bytes)
            } catch {
                throw .malformed("pairing confirmation: \(error.reason)")
            }
        }
    }

    private static func header(_ r: inout ByteReader, _ kind: Kind) throws(DecodeError) -> [UInt8] {
        guard Array(try r.raw(4, "magic")) == magic else { throw DecodeError("not a Coffer pairing message") }
        let v = try r.u8("version")
        guard v == version else { throw DecodeError("pairing version \(v) is not supported (this Coffer speaks \(version))") }
        let k = try r.u8("kind")
        guard k == kind.rawValue else { throw DecodeError("kind \(k) where \(kind.rawValue) belongs") }
        return Array(try r.raw(sidBytes, "session id"))
    }

    /// The joiner's side between its request and its membership, kept (sealed) in the sync state: the
    /// code, the CPace secret and share, the request's session id and device-file hash, and how far it
    /// got.
    public struct Joining: Sendable, Equatable {
        public static func == (a: Joining, b: Joining) -> Bool { a.encoded() == b.encoded() }
        public enum Stage: UInt8, Sendable {
            /// The request is on the remote; no response has been read.
            case requested = 1
            /// A response proved the code: the circle is pinned and the confirmation written.
            case confirmed = 2
            /// A response did not prove the code (or was malformed): the run is over; join again.
            case failed = 3
        }
        public var stage: Stage
        public let code: SyncPairingCode
        public let sid: [UInt8]
        public let scalar: SecureBytes
        public let share: [UInt8]
        public let deviceFile: [UInt8]
        /// Why it failed (stage `failed`), or the circle fingerprint it confirmed.
        public var note: String

        func encoded() -> [UInt8] {
            var w = ByteWriter()
            w.u8(stage.rawValue)
            w.shortString(code.text)
            w.raw(sid)
            unsafe scalar.withUnsafeBytes { unsafe w.raw($0) }
            w.raw(share)
            w.blob(deviceFile)
            w.string(note)
            return w.take()
        }

        static func decode(_ r: inout ByteReader) throws(DecodeError) -> Joining {
            guard let stage = Stage(rawValue: try r.u8("pairing stage")) else { throw DecodeError("unknown pairing stage") }
            guard let code = SyncPairingCode.parse(try r.shortString("pairing code")) else { throw DecodeError("pairing code") }
            let sid = Array(try r.raw(sidBytes, "pairing session id"))
            let scalar = unsafe try r.raw(CPace.scalarBytes, "pairing scalar").withUnsafeBytes { unsafe SecureBytes(copying: $0) }
            let share = Array(try r.raw(CPace.elementBytes, "pairing share"))
            let file = Array(try r.blob(max: 4096, "pairing device file"))
            let note = try r.string(max: 4096, "pairing note")
            return Joining(stage: stage, code: code, sid: sid, scalar: scalar, share: share, deviceFile: file, note: note)
        }
    }

    /// The joiner starts: a fresh session id and CPace share for `code`, and the request to publish.
    public static func start(code: SyncPairingCode, deviceFile: [UInt8], scalar: SecureBytes? = nil, sid: [UInt8]? = nil)
        throws(SyncError) -> (Joining, Request) {
        let sid = sid ?? Random.bytes(sidBytes)
        let password = code.password
        defer { password.wipe() }
        let party = CPace.start(prs: password, ci: channel, sid: sid, scalar: scalar)
        let request = try Request(sid: sid, share: party.message, deviceFile: deviceFile)
        return (Joining(stage: .requested, code: code, sid: sid, scalar: party.scalar, share: party.message, deviceFile: deviceFile, note: ""), request)
    }

    /// The member answers `request` for `code`, vouching for `circle` as `approver`: its response, and
    /// the session key to check the joiner's confirmation with. nil session: the request's share is
    /// invalid (refused).
    public static func respond(to request: Request, code: SyncPairingCode, approver: SyncDeviceID, circle: SyncCircle, scalar: SecureBytes? = nil)
        throws(SyncError) -> (response: Response, isk: SecureBytes) {
        try respond(to: request, code: code, approver: approver, first: circle.epochs[0].hash, epoch: circle.current.epoch,
                    epochHash: circle.current.hash, scalar: scalar)
    }

    /// ``respond(to:code:approver:circle:scalar:)`` with the circle given by its first epoch's hash and
    /// its current epoch (the vectors fix them).
    static func respond(to request: Request, code: SyncPairingCode, approver: SyncDeviceID, first: [UInt8], epoch: UInt64, epochHash: [UInt8],
                        scalar: SecureBytes? = nil) throws(SyncError) -> (response: Response, isk: SecureBytes) {
        let password = code.password
        defer { password.wipe() }
        let party = CPace.start(prs: password, ci: channel, sid: request.sid, scalar: scalar)
        defer { party.scalar.wipe() }
        let adb = Response.associatedData(approver, first, epoch, epochHash)
        guard let isk = CPace.sessionKey(own: party, peerMessage: request.share, sid: request.sid, ya: request.share, ada: request.associatedData,
                                         yb: party.message, adb: adb) else {
            throw .forged("the pairing request's share is not a valid group element")
        }
        let tag = CPace.confirmationTag(isk: isk, sid: request.sid, message: party.message, ad: adb)
        let response = try Response.make(sid: request.sid, share: party.message, approver: approver, first: first, epoch: epoch,
                                         epochHash: epochHash, tag: tag)
        return (response, isk)
    }

    /// The joiner reads a response: if it proves the code, the joiner's confirmation tag (and the
    /// response's circle is the one to pin); otherwise `.forged` (the run is over).
    public static func verify(_ response: Response, joining: Joining) throws(SyncError) -> [UInt8] {
        guard response.sid == joining.sid else {
            throw .forged("the pairing response belongs to another pairing (a replayed or misplaced message)")
        }
        let ada = Array("coffer-sync joiner".utf8) + SHA256.hash(joining.deviceFile)
        guard let isk = CPace.sessionKey(own: CPace.Party(scalar: joining.scalar, message: joining.share), peerMessage: response.share,
                                         sid: joining.sid, ya: joining.share, ada: ada, yb: response.share, adb: response.associatedData) else {
            throw .forged("the pairing response's share is not a valid group element")
        }
        defer { isk.wipe() }
        let expected = CPace.confirmationTag(isk: isk, sid: joining.sid, message: response.share, ad: response.associatedData)
        guard CPace.tagsEqual(expected, response.tag) else {
            throw .forged("the pairing response does not prove the code: the code typed on the approving machine differs from the one shown here, or someone else answered")
        }
        return CPace.confirmationTag(isk: isk, sid: joining.sid, message: joining.share, ad: ada)
    }

    /// The member checks the joiner's confirmation against the session key of its response.
    public static func check(_ confirm: Confirm, request: Request, isk: SecureBytes) throws(SyncError) {
        guard confirm.sid == request.sid else { throw .forged("the pairing confirmation belongs to another pairing (a replayed or misplaced message)") }
        guard let tag = confirm.tag else {
            throw .forged("the joining machine refused the exchange: the code typed here is not the one it shows, or someone tampered with the remote; run coffer sync join again there")
        }
        let expected = CPace.confirmationTag(isk: isk, sid: request.sid, message: request.share, ad: request.associatedData)
        guard CPace.tagsEqual(expected, tag) else {
            throw .forged("the pairing confirmation does not prove the code: the joining machine did not take part in this exchange")
        }
    }
}

extension SyncCircle {
    /// The circle's fingerprint for people to compare (SyncFormat.md, "Pairing"): 15 decimal digits in
    /// three groups, from SHA-256("coffer-sync circle" ‖ the first epoch's hash).
    public static func fingerprint(firstEpochHash: [UInt8]) -> String {
        let h = SHA256.hash(Array("coffer-sync circle".utf8) + firstEpochHash)
        var v: UInt64 = 0
        for b in h.prefix(8) { v = v << 8 | UInt64(b) }
        let digits = String(v % 1_000_000_000_000_000)
        let padded = String(repeating: "0", count: 15 - digits.count) + digits
        let c = Array(padded)
        return String(c[0..<5]) + " " + String(c[5..<10]) + " " + String(c[10..<15])
    }

    public var fingerprint: String { Self.fingerprint(firstEpochHash: epochs[0].hash) }
}

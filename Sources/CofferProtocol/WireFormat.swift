import CofferCrypto
public import CofferModel

/// Constants and framing of the Coffer wire protocol, versions 1 to 4 (see the WireProtocol article).
public enum WireFormat {
    /// The highest protocol version this code speaks (2: AUTH_FEEDBACK_KIND; 3: the access-state
    /// flag, and PROMPT_READ answering with a grant instead of the secrets; 4: large frames).
    public static let version: UInt16 = 4
    /// The lowest protocol version this code still speaks: an agent answers a HELLO whose range
    /// holds only 1 as it always did.
    public static let minimumVersion: UInt16 = 1
    /// The version from which the agent sends AUTH_FEEDBACK_KIND instead of AUTH_FEEDBACK.
    public static let feedbackKindVersion: UInt16 = 2
    /// The version from which PROMPT_READ answers with a grant to the delegated process instead of the
    /// secrets (an older connection still gets them), and the access-state flag is defined.
    public static let grantingVersion: UInt16 = 3
    /// The version from which a frame body may be up to ``maximumLargeBodyBytes`` in both directions
    /// (a 1 MiB secret travels whole); below it, and before the HELLO reply, ``maximumBodyBytes``.
    public static let largeFramesVersion: UInt16 = 4
    /// Smallest frame body: type (1) + request id (4).
    public static let minimumBodyBytes = 5
    /// Largest frame body at versions 1 to 3 and before the HELLO reply (256 KiB, like ssh-agent's
    /// AGENT_MAX_LEN): bounds what one client can make the agent allocate; a length outside 5...256 KiB
    /// is then a framing error and closes the connection.
    public static let maximumBodyBytes = 256 * 1024
    /// Largest frame body on a connection at version 4 or later (1.5 MiB): a secret of
    /// ``maximumSecretBytes`` with its item's attributes (general attributes at most 64 KiB, and the
    /// catalog's).
    public static let maximumLargeBodyBytes = 1536 * 1024
    /// The largest frame body either side may send or receive on a connection at `version` (nil:
    /// before the HELLO reply).
    public static func maximumBodyBytes(version: UInt16?) -> Int {
        (version ?? 0) >= largeFramesVersion ? maximumLargeBodyBytes : maximumBodyBytes
    }
    /// Longest attribute name and most attributes in one `attributes` at versions 1 to 3: what their
    /// decoders accept. From version 4 (``largeFramesVersion``), ``AttributeCodec/maxNameBytes`` and
    /// ``AttributeCodec/maxCount``.
    public static let legacyMaximumAttributeNameBytes = 32
    public static let legacyMaximumAttributes = 128
    /// True if a connection at `version` can carry `attributes`: always from version 4; below it, only
    /// names of at most 32 bytes and at most 128 of them.
    public static func carries(_ attributes: Attributes, version: UInt16?) -> Bool {
        guard (version ?? 0) < largeFramesVersion else { return true }
        return attributes.count <= legacyMaximumAttributes && attributes.keys.allSatisfy { $0.utf8.count <= legacyMaximumAttributeNameBytes }
    }
    /// Largest passcode or secret field (1 MiB: kubeconfigs, PEM chains, GnuPG exports). At versions 1
    /// to 3 the 256 KiB frame bounds it lower.
    public static let maximumSecretBytes = 1 << 20
    /// Length of a persistent reference.
    public static let persistentRefBytes = 16
    /// Longest signature blob KEY_SIGNATURE carries (an SSH signature blob of a 16384-bit RSA key is
    /// about 2 KiB).
    public static let maximumSignatureBytes = 8192
    /// Body bytes of an ITEMS frame before its first item: type, request id, u32 n.
    public static let itemsHeaderBytes = 9
    /// Body bytes of an ITEMS_PAGE frame before its first item: type, request id, u64 next cursor, u32 n.
    public static let itemsPageHeaderBytes = 17
    /// ITEMS_PAGE_SKIPPING's fixed part: ITEMS_PAGE's and a u32 unreadable count.
    public static let itemsPageSkippingHeaderBytes = 21
    /// Bytes of a CHECK_REPORT body before its first finding (type, request id, checked, skipped, count).
    public static let checkReportHeaderBytes = 17
    /// Bytes of a CHECK_REPORT_PAGE body before its first finding (CHECK_REPORT's and the cursor).
    public static let checkReportPageHeaderBytes = 25
    /// Encoded size of one check finding (reference blob, reason, flag, detail as a short string).
    public static func encodedSize(of finding: CheckFinding) -> Int {
        4 + finding.persistentRef.count + 2 + 2 + min(finding.detail.utf8.count, Int(UInt16.max))
    }
    /// Bytes of a SYNC_CONFLICTS_REPLY body before its first conflict (type, request id, count).
    public static let syncConflictsHeaderBytes = 9
    /// Encoded size of one conflict in SYNC_CONFLICTS_REPLY (each string clamped as the encoder clamps it).
    public static func encodedSize(of d: ProtectedDirectoryStatus) -> Int {
        2 + d.path.utf8.count + 1 + 16 + 1 + 2 + d.problem.utf8.count + 2 + d.holders.reduce(0) { $0 + 6 + $1.name.utf8.count }
    }

    /// The FILES_REPLY header: the message header and the directory count.
    public static let filesReplyHeaderBytes = 9

    /// At most this many holders of one directory go in a FILES_REPLY (a decoder rejects more).
    public static let maximumFileHolders = 1024

    public static func encodedSize(of c: SyncConflictInfo) -> Int {
        [c.id, c.itemClass, c.service, c.account, c.loserDevice].reduce(0) { $0 + 2 + min($1.utf8.count, Int(UInt16.max)) } + 17
    }
    /// Encoded size of one device in SYNC_DEVICES.
    public static func encodedSize(of d: SyncDeviceInfo) -> Int {
        [d.id, d.name].reduce(0) { $0 + 2 + min($1.utf8.count, Int(UInt16.max)) } + 1
    }
    /// The most item bytes one ITEMS_PAGE can carry on a connection at `version`: a single item whose
    /// encoding is larger than this can never be sent on it (errSecAllocate), however the search is paged.
    public static func maximumItemBytesPerPage(version: UInt16?) -> Int { maximumBodyBytes(version: version) - itemsPageHeaderBytes }

    /// Bytes `item` takes inside an ITEMS or ITEMS_PAGE payload (class, present flags and the parts
    /// it carries), so a sender can fill a frame up to ``maximumBodyBytes`` and never beyond.
    public static func encodedSize(of item: ItemResult) -> Int {
        2 + (item.data.map { 4 + $0.count } ?? 0) + (item.attributes.map { AttributeCodec.encodedSize($0) } ?? 0)
            + (item.persistentRef.map { 4 + $0.count } ?? 0)
    }

    /// A frame header announcing a body length outside ``minimumBodyBytes``...``maximumBodyBytes``:
    /// a framing error (the connection is closed).
    public struct BadLength: Error, Equatable, Sendable {
        /// The length the header announced.
        public let length: Int
        /// Makes the error.
        public init(length: Int) { self.length = length }
    }

    /// Size of a frame header: a big-endian u32 body length.
    public static let headerBytes = 4

    /// The body length a frame header announces (big-endian u32), checked against
    /// ``minimumBodyBytes``...`maximum` (the connection's: ``maximumBodyBytes(version:)``). The one
    /// parse of a frame header, for both the agent's and the client's frame readers. `header` must
    /// hold exactly ``headerBytes`` bytes.
    public static func bodyLength(header: UnsafeRawBufferPointer, maximum: Int = maximumBodyBytes) -> Result<Int, BadLength> {
        precondition(header.count == headerBytes, "a frame header is 4 bytes")
        let length = Int(header.reduce(UInt32(0)) { $0 << 8 | UInt32($1) })
        guard length >= minimumBodyBytes, length <= maximum else { return .failure(BadLength(length: length)) }
        return .success(length)
    }

    /// The request id of a frame body (bytes 1...4), if the body is long enough.
    public static func requestID(ofBody body: UnsafeRawBufferPointer) -> UInt32? {
        guard body.count >= minimumBodyBytes else { return nil }
        return body[1..<5].reduce(0) { $0 << 8 | UInt32($1) }
    }
}

/// Message type codes (first byte of a frame body). Never renumbered.
public enum MessageType: UInt8, Sendable {
    case hello = 0x01, status = 0x02, unlock = 0x03, lock = 0x04, setPasscode = 0x05
    case add = 0x06, copyMatching = 0x07, update = 0x08, delete = 0x09, subscribe = 0x0A
    case copyMatchingPage = 0x0B, whoami = 0x0C, authorize = 0x0D
    case authOptions = 0x0E, authResponse = 0x0F, laEvaluate = 0x10, laCanEvaluate = 0x11, bio = 0x12, passcodeSync = 0x13, removePasscode = 0x14, escrow = 0x15, backup = 0x16
    case check = 0x17, checkPage = 0x18, keyCreate = 0x19, delegate = 0x1A, protections = 0x1B, promptUnlock = 0x1C
    case portalSecret = 0x1D
    case syncSetup = 0x1E, syncCircle = 0x1F, syncStatus = 0x20, syncConflicts = 0x21
    case promptRead = 0x22, subscribeEvents = 0x23, files = 0x24
    case prompter = 0x25, counters = 0x26, keySign = 0x27, session = 0x28, noteAccess = 0x29
    case ok = 0x80, helloReply = 0x81, statusReply = 0x82, items = 0x87, count = 0x88, itemsPage = 0x89, whoamiReply = 0x8A
    case authNeeded = 0x8B, authFeedback = 0x8C, laResult = 0x8D, bioStatus = 0x8E, escrowSecret = 0x8F, backupSummary = 0x90
    case authFeedbackKind = 0x91
    case checkReport = 0x92, itemsPageSkipping = 0x93, checkReportPage = 0x94, protectionsReply = 0x95
    case portalSecretReply = 0x97
    case syncCode = 0x98, syncDevices = 0x99, syncStatusReply = 0x9A, syncConflictsReply = 0x9B, filesReply = 0x9C
    case prompterReply = 0x9D, countersReply = 0x9E, keySignature = 0x9F
    case event = 0xC0, error = 0xFF
}

/// A message that could not be decoded: always errSecParam on the wire.
public struct ProtocolError: Error, Equatable, Sendable, CustomStringConvertible {
    /// What was wrong (never quotes payload bytes).
    public let description: String
    /// Makes an error.
    public init(_ description: String) { self.description = description }
    init(_ e: DecodeError) { description = e.reason }
    /// The error as the agent reports it.
    public var secError: SecError { .param("malformed message: \(description)") }
}

/// Which parts of an item a reply carries (kSecReturnData / Attributes / PersistentRef).
public struct ReturnFlags: OptionSet, Sendable, Hashable {
    public let rawValue: UInt8
    public init(rawValue: UInt8) { self.rawValue = rawValue }
    /// The secret.
    public static let data = ReturnFlags(rawValue: 1)
    /// The attributes.
    public static let attributes = ReturnFlags(rawValue: 2)
    /// The persistent reference.
    public static let persistentRef = ReturnFlags(rawValue: 4)
    /// Every defined bit of an item's `present` flags, and of a query's return flags but ``skipUnreadable``.
    public static let all: ReturnFlags = [.data, .attributes, .persistentRef]
    /// In a COPY_MATCHING_PAGE query only: skip items that fail authentication and count them
    /// (the reply is then ITEMS_PAGE_SKIPPING).
    public static let skipUnreadable = ReturnFlags(rawValue: 8)
    /// In a COPY_MATCHING or COPY_MATCHING_PAGE query: name the matches whose class key is locked
    /// away by their persistent reference; in an item's `present` flags: this is such a match.
    public static let locked = ReturnFlags(rawValue: 16)
    /// In a COPY_MATCHING or COPY_MATCHING_PAGE query (version 3): tell, for each match, whether
    /// reading its secret now would need the person; in an item's `present` flags: it would (an access
    /// control that neither what the connection holds nor a grant of its process satisfies).
    public static let needsAuthentication = ReturnFlags(rawValue: 32)
}

/// Item class codes on the wire: 0 any (queries only), 1 genp, 2 inet, 3 keys, 4 cert.
enum ItemClassCode {
    static let order: [ItemClass] = [.genericPassword, .internetPassword, .key, .certificate]
    static func encode(_ c: ItemClass?) -> UInt8 { c.map { UInt8(order.firstIndex(of: $0)! + 1) } ?? 0 }
    static func decode(_ b: UInt8, allowAny: Bool) throws(ProtocolError) -> ItemClass? {
        if b == 0 {
            guard allowAny else { throw ProtocolError("item class 0 (any) is only allowed in queries") }
            return nil
        }
        guard Int(b) <= order.count else { throw ProtocolError("unknown item class") }
        return order[Int(b) - 1]
    }
}

/// Builds one frame with its length prefix, reserving the exact size first so an array holding a
/// secret never reallocates (which would leave copies behind).
struct FrameBuilder {
    var w: ByteWriter

    init(type: MessageType, requestID: UInt32, payloadCapacity: Int) {
        w = ByteWriter(capacity: 9 + payloadCapacity)
        w.u32(0) // patched in `finish`
        w.u8(type.rawValue)
        w.u32(requestID)
    }

    mutating func secret(_ s: SecureBytes) {
        w.u32(UInt32(s.count))
        s.withUnsafeBytes { w.raw($0) }
    }

    /// A frame with no payload.
    static func empty(_ type: MessageType, requestID: UInt32) -> [UInt8] {
        var f = FrameBuilder(type: type, requestID: requestID, payloadCapacity: 0)
        return f.finish()
    }

    /// Patches the length prefix in place and hands over the one buffer (no copy of a secret).
    mutating func finish() -> [UInt8] {
        w.patchU32(at: 0, UInt32(w.bytes.count - 4))
        return w.take()
    }
}

/// Reading helpers over a frame body held in secure memory.
struct BodyReader {
    let raw: UnsafeRawBufferPointer
    private(set) var offset: Int

    init(_ payload: UnsafeRawBufferPointer) {
        raw = payload
        offset = 0
    }

    var remaining: Int { raw.count - offset }

    mutating func bytes(_ n: Int, _ what: @autoclosure () -> String) throws(ProtocolError) -> UnsafeRawBufferPointer {
        guard n >= 0, remaining >= n else { throw ProtocolError("truncated \(what())") }
        defer { offset += n }
        return UnsafeRawBufferPointer(rebasing: raw[offset..<offset + n])
    }

    mutating func u8(_ what: @autoclosure () -> String) throws(ProtocolError) -> UInt8 { try bytes(1, what())[0] }
    mutating func u16(_ what: @autoclosure () -> String) throws(ProtocolError) -> UInt16 { try bytes(2, what()).reduce(0) { $0 << 8 | UInt16($1) } }
    mutating func u32(_ what: @autoclosure () -> String) throws(ProtocolError) -> UInt32 { try bytes(4, what()).reduce(0) { $0 << 8 | UInt32($1) } }
    mutating func u64(_ what: @autoclosure () -> String) throws(ProtocolError) -> UInt64 { try bytes(8, what()).reduce(0) { $0 << 8 | UInt64($1) } }

    /// A u32-length-prefixed field copied straight into secure memory.
    mutating func secret(_ what: @autoclosure () -> String) throws(ProtocolError) -> SecureBytes {
        let n = Int(try u32("\(what()) length"))
        guard n <= WireFormat.maximumSecretBytes else { throw ProtocolError("\(what()) too long (the limit is \(WireFormat.maximumSecretBytes) bytes)") }
        return SecureBytes(copying: try bytes(n, what()))
    }

    /// A u32-length-prefixed public field.
    mutating func blob(max: Int, _ what: @autoclosure () -> String) throws(ProtocolError) -> [UInt8] {
        let n = Int(try u32("\(what()) length"))
        guard n <= max else { throw ProtocolError("\(what()) too long (the limit is \(max) bytes)") }
        return Array(try bytes(n, what()))
    }

    mutating func sstr(_ what: @autoclosure () -> String) throws(ProtocolError) -> String {
        let n = Int(try u16("\(what()) length"))
        guard let s = String(validUTF8: try bytes(n, what()).assumingMemoryBound(to: UInt8.self)) else {
            throw ProtocolError("\(what()) is not valid UTF-8")
        }
        return s
    }

    /// Attributes in the canonical encoding (delegates to ``AttributeCodec``). Only the attribute
    /// section is copied out: a secret that follows it in the frame stays in secure memory.
    mutating func attributes(_ what: @autoclosure () -> String) throws(ProtocolError) -> Attributes {
        var probe = self
        let count = Int(try probe.u16("\(what()) count"))
        guard count <= AttributeCodec.maxCount else { throw ProtocolError("\(what()): too many attributes (the limit is \(AttributeCodec.maxCount))") }
        for _ in 0..<count {
            _ = try probe.bytes(Int(try probe.u16("attribute name length")), "attribute name")
            switch try probe.u8("value tag") {
            case 1, 3: _ = try probe.bytes(Int(try probe.u32("value length")), "value")
            case 2, 5: _ = try probe.bytes(8, "value")
            case 4: _ = try probe.bytes(1, "value")
            default: throw ProtocolError("\(what()): unknown value tag")
            }
        }
        var reader = ByteReader(Array(UnsafeRawBufferPointer(rebasing: raw[offset..<probe.offset])))
        do {
            let a = try AttributeCodec.decodeAttributes(from: &reader)
            try reader.expectEnd(what())
            offset = probe.offset
            return a
        } catch {
            throw ProtocolError("\(what()): \(error.reason)")
        }
    }

    func expectEnd(_ what: String) throws(ProtocolError) {
        guard remaining == 0 else { throw ProtocolError("trailing bytes after \(what)") }
    }
}

/// The text rules of the sync messages (WireProtocol.md, Sync).
public enum SyncText {
    /// A remote: 1 to 4096 bytes, no control characters (C0, DEL).
    public static func isRemote(_ s: String) -> Bool { isText(s, max: 4096) }
    /// A device name, pairing code or device id: 1 to 64 bytes, no control characters.
    public static func isName(_ s: String) -> Bool { isText(s, max: 64) }

    static func isText(_ s: String, max: Int) -> Bool {
        !s.isEmpty && s.utf8.count <= max && s.utf8.allSatisfy { $0 >= 0x20 && $0 != 0x7F }
    }
}

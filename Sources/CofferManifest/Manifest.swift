import CofferCrypto
public import CofferModel

/// A signed app manifest, format version 1 or 2 (see the ManifestFormat article): which executable an
/// app is, which keychain access groups it may use, and (version 2) which entitlements it has.
///
/// A `Manifest` only comes from ``parse(_:)-([UInt8])`` or ``sign(app:executable:executableSHA256:accessGroups:entitlements:secretKey:)``,
/// so every value is valid and has exactly one encoding: `try Manifest.parse(x).encoded() == x`.
/// Parsing does not check the signature: call ``verify(trusting:)`` before believing anything in it.
public struct Manifest: Equatable, Sendable {
    /// Largest manifest accepted (16 KiB), checked before anything else. No valid manifest comes close
    /// (the longest possible one is 13,713 bytes): the limit bounds what a hostile file costs to parse.
    public static let maximumBytes = 16384
    /// Most `access-group` lines (64).
    public static let maximumAccessGroups = 64
    /// Longest app identifier or access group (128 bytes).
    public static let maximumNameBytes = 128
    /// Longest executable path (4096 bytes).
    public static let maximumPathBytes = 4096
    /// The first line of every version-1 manifest.
    public static let header = "coffer-manifest 1"
    /// The first line of every version-2 manifest (version 1 plus `entitlement` lines).
    public static let header2 = "coffer-manifest 2"

    /// The format version: 1, or 2 (which carries ``entitlements``): 2 exactly when there are entitlements.
    public let version: Int
    /// The entitlements the manifest grants, in manifest order, no duplicates: empty in version 1, at
    /// least one in version 2.
    public let entitlements: [ManifestEntitlement]

    /// The app identifier (reverse DNS by convention, e.g. `com.example.mail`).
    public let app: String
    /// The absolute, canonical path of the executable, as `readlink /proc/PID/exe` shows it.
    public let executable: String
    /// SHA-256 of the executable file's contents (32 bytes).
    public let executableSHA256: [UInt8]
    /// The access groups the app may use, in manifest order, at least one, no duplicates.
    public let accessGroups: [String]
    /// The key that signed the manifest (the `signed-by` line).
    public let signer: SignerKey
    /// The Ed25519 signature (64 bytes) over ``signedBytes``.
    public let signature: [UInt8]
    /// Every byte before the `signature: ` line, exactly as received: what the signature covers.
    let signedBytes: [UInt8]

    /// The group new items go to when the app names none (the first `access-group`, as on Apple platforms).
    public var defaultAccessGroup: String { accessGroups[0] }

    /// Two manifests are equal when their encodings are: byte equality, not `String` equality (which
    /// would equate canonically equivalent but different paths).
    public static func == (lhs: Manifest, rhs: Manifest) -> Bool {
        lhs.encoded() == rhs.encoded() && lhs.signedBytes == rhs.signedBytes
    }

    /// The canonical encoding: the only byte sequence that parses to this manifest.
    public func encoded() -> [UInt8] {
        var out = Manifest.unsignedText(version: version, app: app, executable: executable, executableSHA256: executableSHA256,
                                        accessGroups: accessGroups, entitlements: entitlements, signer: signer.bytes)
        out += Array("\(ManifestField.signature.rawValue): \(Hex.encode(signature))\n".utf8)
        return out
    }

    /// Lines 1 to `signed-by`, each with its LF: the bytes a signer signs.
    static func unsignedText(version: Int, app: String, executable: String, executableSHA256: [UInt8],
                             accessGroups: [String], entitlements: [ManifestEntitlement], signer: [UInt8]) -> [UInt8] {
        var text = "\(version == 2 ? header2 : header)\n"
        text += "\(ManifestField.app.rawValue): \(app)\n"
        text += "\(ManifestField.executable.rawValue): \(executable)\n"
        text += "\(ManifestField.executableSHA256.rawValue): \(Hex.encode(executableSHA256))\n"
        for g in accessGroups { text += "\(ManifestField.accessGroup.rawValue): \(g)\n" }
        for e in entitlements { text += "\(ManifestField.entitlement.rawValue): \(e.rawValue)\n" }
        text += "\(ManifestField.signedBy.rawValue): \(Hex.encode(signer))\n"
        return Array(text.utf8)
    }
}

/// An Ed25519 public key that signs manifests (32 bytes). Administrators list the keys they trust.
public struct SignerKey: Hashable, Sendable, CustomStringConvertible {
    /// The 32 key bytes.
    public let bytes: [UInt8]

    /// A key from its 32 bytes; nil for any other length.
    public init?(_ bytes: [UInt8]) {
        guard bytes.count == Ed25519.publicKeyBytes else { return nil }
        self.bytes = bytes
    }

    /// A key from 64 lowercase hex digits (the `signed-by` form); nil for anything else.
    public init?(hex: String) {
        guard let b = Hex.decodeLowercase(Array(hex.utf8)[...], byteCount: Ed25519.publicKeyBytes) else { return nil }
        bytes = b
    }

    /// The 64 lowercase hex digits, as a `signed-by` line shows them.
    public var description: String { Hex.encode(bytes) }
}

/// The fields of a version-1 manifest, in the order they must appear; the raw value is the field name.
public enum ManifestField: String, Sendable, CaseIterable {
    case app
    case executable
    case executableSHA256 = "executable-sha256"
    case accessGroup = "access-group"
    /// Version 2 only: zero or more, after the access groups.
    case entitlement
    case signedBy = "signed-by"
    case signature
}

/// An entitlement a version-2 manifest can grant (the value of an `entitlement` line).
public enum ManifestEntitlement: String, Sendable, CaseIterable {
    /// The app may send DELEGATE (WireProtocol.md, Delegated identity): hand the agent another live
    /// process of the same user, whose identity its connection then takes. For front ends that
    /// serve other processes (the Secret Service bridge), never for an ordinary app.
    case delegateIdentity = "delegate-identity"
    /// The app may send PORTAL_SECRET (WireProtocol.md, Portal secrets): read, creating it on first
    /// use, the desktop portal's per-app secret of a Flatpak app it names, in that app's
    /// `flatpak:APP_ID` group, and nothing else of that group. For the portal's secret backend
    /// (`coffer-portal-secret`) only.
    case portalSecret = "portal-secret"
}

/// Why a manifest was refused. Stable: the agent and tools match on these cases, and the spec's
/// test vectors name them. Messages name a line and a field, never a value.
public enum ManifestError: Error, Equatable, Sendable, CustomStringConvertible {
    /// The input is larger than ``Manifest/maximumBytes``; nothing else was looked at.
    case tooLarge(bytes: Int)
    /// Line `line` (1-based) breaks a format rule.
    case malformed(line: Int, ManifestProblem)
    /// The manifest is well formed but its `signed-by` key is not one the caller trusts.
    case untrustedSigner
    /// The signer is trusted but the signature does not verify: the manifest was altered.
    case badSignature
    /// The executable could not be opened, examined or read (`errno`).
    case executableUnreadable(errno: Int32)
    /// The executable is not a regular file.
    case executableNotRegularFile
    /// The executable is larger than ``ExecutableHash/maximumBytes``.
    case executableTooLarge
    /// The executable's size, modification or change time moved while it was being hashed.
    case executableChanged

    /// What went wrong, for people: a line number and a field name at most.
    public var description: String {
        switch self {
        case .tooLarge(let n): "manifest too large (\(n) bytes; at most \(Manifest.maximumBytes))"
        case .malformed(let line, let p): "manifest line \(line): \(p)"
        case .untrustedSigner: "manifest signed by a key that is not trusted"
        case .badSignature: "manifest signature does not verify"
        case .executableUnreadable(let e): "executable could not be read (errno \(e))"
        case .executableNotRegularFile: "executable is not a regular file"
        case .executableTooLarge: "executable larger than \(ExecutableHash.maximumBytes) bytes"
        case .executableChanged: "executable changed while it was being hashed"
        }
    }

    /// The error as a keychain result: errSecDecode for a malformed or badly signed manifest,
    /// errSecMissingEntitlement for an untrusted signer, errSecIO / errSecAllocate for the executable.
    public var secError: SecError {
        switch self {
        case .tooLarge, .malformed, .badSignature: SecError(.decode, description)
        case .untrustedSigner: SecError(.missingEntitlement, description)
        case .executableUnreadable, .executableNotRegularFile, .executableChanged: SecError(.io, description)
        case .executableTooLarge: SecError(.allocate, description)
        }
    }
}

/// The rule a malformed line breaks. ``code`` is the stable name the spec's vectors use.
public enum ManifestProblem: Equatable, Sendable, CustomStringConvertible {
    /// Line 1 is not `coffer-manifest 1` (and not another version number either).
    case badHeader
    /// Line 1 is `coffer-manifest N` for a version other than 1 and 2.
    case unsupportedVersion
    /// The line (the last one) does not end with LF.
    case missingNewline
    /// The line is empty.
    case emptyLine
    /// The line contains a carriage return.
    case carriageReturn
    /// The line contains a control character (C0 other than LF, DEL, C1) or a bidirectional formatting character.
    case controlCharacter
    /// The line is not valid UTF-8.
    case notUTF8
    /// The line ends with a space.
    case trailingSpace
    /// The line is not the field that must come here.
    case expectedField(ManifestField)
    /// The manifest ends where this field must come.
    case missingField(ManifestField)
    /// The field name is not followed by `: ` and a value that does not start with a space.
    case badSeparator(ManifestField)
    /// The field's value breaks its rule (name syntax, path shape, hex length or case).
    case badValue(ManifestField)
    /// An access group is listed twice.
    case duplicateAccessGroup
    /// A 65th `access-group` line.
    case tooManyAccessGroups
    /// An entitlement is listed twice.
    case duplicateEntitlement
    /// Something follows the signature line.
    case trailingData

    /// The stable name used in the spec's test vectors, e.g. `bad-value executable`.
    public var code: String {
        switch self {
        case .badHeader: "bad-header"
        case .unsupportedVersion: "unsupported-version"
        case .missingNewline: "missing-newline"
        case .emptyLine: "empty-line"
        case .carriageReturn: "carriage-return"
        case .controlCharacter: "control-character"
        case .notUTF8: "not-utf8"
        case .trailingSpace: "trailing-space"
        case .expectedField(let f): "expected-field \(f.rawValue)"
        case .missingField(let f): "missing-field \(f.rawValue)"
        case .badSeparator(let f): "bad-separator \(f.rawValue)"
        case .badValue(let f): "bad-value \(f.rawValue)"
        case .duplicateAccessGroup: "duplicate-access-group"
        case .tooManyAccessGroups: "too-many-access-groups"
        case .duplicateEntitlement: "duplicate-entitlement"
        case .trailingData: "trailing-data"
        }
    }

    /// What is wrong, for people.
    public var description: String {
        switch self {
        case .badHeader: "the first line must be exactly \"\(Manifest.header)\""
        case .unsupportedVersion: "unsupported manifest version (this parser reads versions 1 and 2)"
        case .missingNewline: "the last line does not end with a newline (LF)"
        case .emptyLine: "empty line"
        case .carriageReturn: "carriage return in the line (lines end with LF only)"
        case .controlCharacter: "control or bidirectional formatting character in the line"
        case .notUTF8: "the line is not valid UTF-8"
        case .trailingSpace: "the line ends with a space"
        case .expectedField(.signedBy): "expected access-group, entitlement (version 2) or signed-by"
        case .expectedField(let f): "expected \(f.rawValue)"
        case .missingField(let f): "the manifest ends where \(f.rawValue) must come"
        case .badSeparator(let f): "\(f.rawValue) must be followed by a colon, one space and the value"
        case .badValue(let f):
            switch f {
            case .app, .accessGroup:
                "\(f.rawValue) must be 1 to 128 of A-Z a-z 0-9 . _ - and start with a letter or digit"
            case .executable:
                "executable must be an absolute path of at most \(Manifest.maximumPathBytes) bytes with no empty, \".\" or \"..\" components"
            case .executableSHA256, .signedBy: "\(f.rawValue) must be 64 lowercase hex digits"
            case .signature: "signature must be 128 lowercase hex digits"
            case .entitlement: "entitlement must be one of: \(ManifestEntitlement.allCases.map(\.rawValue).joined(separator: ", "))"
            }
        case .duplicateAccessGroup: "access-group listed twice"
        case .tooManyAccessGroups: "more than \(Manifest.maximumAccessGroups) access-group lines"
        case .duplicateEntitlement: "entitlement listed twice"
        case .trailingData: "data after the signature line"
        }
    }
}

// MARK: - Parsing

extension Manifest {
    /// Parses a manifest, refusing anything but the one canonical form. Does not verify the signature.
    public static func parse(_ input: [UInt8]) throws(ManifestError) -> Manifest {
        guard input.count <= maximumBytes else { throw .tooLarge(bytes: input.count) }
        var lines = LineReader(input)

        guard !lines.atEnd else { throw .malformed(line: 1, .badHeader) }
        let first = try lines.next()
        let version: Int
        if first.elementsEqual(header.utf8) {
            version = 1
        } else if first.elementsEqual(header2.utf8) {
            version = 2
        } else {
            throw .malformed(line: 1, headerProblem(first))
        }

        let app = try lines.value(of: .app)
        guard Syntax.isName(app) else { throw lines.problem(.badValue(.app)) }
        let executable = try lines.value(of: .executable)
        guard Syntax.isPath(executable) else { throw lines.problem(.badValue(.executable)) }
        let digestHex = try lines.value(of: .executableSHA256)
        guard let digest = Hex.decodeLowercase(digestHex, byteCount: SHA256.digestBytes) else {
            throw lines.problem(.badValue(.executableSHA256))
        }

        var groups: [String] = []
        var seen: Set<String> = []
        let firstGroup = try lines.value(of: .accessGroup)
        guard Syntax.isAccessGroup(firstGroup) else { throw lines.problem(.badValue(.accessGroup)) }
        groups.append(String(decoding: firstGroup, as: UTF8.self))
        seen.insert(groups[0])
        var entitlements: [ManifestEntitlement] = []
        let signerHex: ArraySlice<UInt8>
        while true {
            let line = try lines.next(expecting: .signedBy)
            if version == 2, LineReader.key(of: line, is: .entitlement) {
                let v = try lines.value(in: line, of: .entitlement)
                guard let e = ManifestEntitlement(rawValue: String(decoding: v, as: UTF8.self)) else {
                    throw lines.problem(.badValue(.entitlement))
                }
                guard !entitlements.contains(e) else { throw lines.problem(.duplicateEntitlement) }
                entitlements.append(e)
                continue
            }
            if entitlements.isEmpty, LineReader.key(of: line, is: .accessGroup) {
                guard groups.count < maximumAccessGroups else { throw lines.problem(.tooManyAccessGroups) }
                let v = try lines.value(in: line, of: .accessGroup)
                guard Syntax.isAccessGroup(v) else { throw lines.problem(.badValue(.accessGroup)) }
                let g = String(decoding: v, as: UTF8.self)
                guard seen.insert(g).inserted else { throw lines.problem(.duplicateAccessGroup) }
                groups.append(g)
                continue
            }
            // Version 2 exists for its entitlements: one without any would mean what version 1 says
            // (two encodings of one manifest), so it has at least one.
            if version == 2, entitlements.isEmpty { throw lines.problem(.expectedField(.entitlement)) }
            guard LineReader.key(of: line, is: .signedBy) else { throw lines.problem(.expectedField(.signedBy)) }
            signerHex = try lines.value(in: line, of: .signedBy)
            break
        }
        guard let signer = Hex.decodeLowercase(signerHex, byteCount: Ed25519.publicKeyBytes) else {
            throw lines.problem(.badValue(.signedBy))
        }
        let signedEnd = lines.offset
        let signatureHex = try lines.value(of: .signature)
        guard let signature = Hex.decodeLowercase(signatureHex, byteCount: Ed25519.signatureBytes) else {
            throw lines.problem(.badValue(.signature))
        }
        guard lines.atEnd else { throw .malformed(line: lines.number + 1, .trailingData) }

        return Manifest(version: version, entitlements: entitlements, app: String(decoding: app, as: UTF8.self),
                        executable: String(decoding: executable, as: UTF8.self),
                        executableSHA256: digest, accessGroups: groups,
                        signer: SignerKey(signer)!, signature: signature,
                        signedBytes: Array(input[0..<signedEnd]))
    }

    /// Parses a manifest in borrowed memory (see ``parse(_:)-([UInt8])``); the size is checked before anything is copied.
    public static func parse(_ input: UnsafeRawBufferPointer) throws(ManifestError) -> Manifest {
        guard input.count <= maximumBytes else { throw .tooLarge(bytes: input.count) }
        return try parse(Array(input))
    }

    /// `coffer-manifest` followed by a version number other than 1 and 2 is a version this code does not read.
    private static func headerProblem(_ line: ArraySlice<UInt8>) -> ManifestProblem {
        let prefix = Array("coffer-manifest ".utf8)
        guard line.count > prefix.count, line.starts(with: prefix),
              line.dropFirst(prefix.count).allSatisfy({ $0 >= 0x30 && $0 <= 0x39 }) else { return .badHeader }
        return .unsupportedVersion
    }

    /// The problem (line-level checks, then the value's rule) with `value` as field `field`, or nil.
    /// Signing uses it so that no value can smuggle in a line of its own.
    static func problem(with value: String, as field: ManifestField) -> ManifestProblem? {
        let line = Array("\(field.rawValue): \(value)".utf8)
        if let p = LineReader.lineProblem(line[...]) { return p }
        let v = line[(field.rawValue.utf8.count + 2)...]
        switch field {
        case .app: return Syntax.isName(v) ? nil : .badValue(field)
        case .accessGroup: return Syntax.isAccessGroup(v) ? nil : .badValue(field)
        case .executable: return Syntax.isPath(v) ? nil : .badValue(field)
        case .executableSHA256, .signedBy: return Hex.decodeLowercase(v, byteCount: 32) != nil ? nil : .badValue(field)
        case .signature: return Hex.decodeLowercase(v, byteCount: 64) != nil ? nil : .badValue(field)
        case .entitlement: return ManifestEntitlement(rawValue: String(decoding: v, as: UTF8.self)) != nil ? nil : .badValue(field)
        }
    }
}

/// Walks the input line by line, applying the line-level rules, and remembers the line number.
struct LineReader {
    let bytes: [UInt8]
    /// Offset of the next unread byte.
    private(set) var offset = 0
    /// Number of the last line read (1-based; 0 before the first).
    private(set) var number = 0

    init(_ input: [UInt8]) { bytes = input }

    var atEnd: Bool { offset == bytes.count }

    /// A malformed-line error for the last line read.
    func problem(_ p: ManifestProblem) -> ManifestError { .malformed(line: number, p) }

    /// The next line without its LF, after the line-level checks; at the end, `missing-field expected`.
    mutating func next(expecting expected: ManifestField? = nil) throws(ManifestError) -> ArraySlice<UInt8> {
        if atEnd, let expected { throw .malformed(line: number + 1, .missingField(expected)) }
        guard let lf = bytes[offset...].firstIndex(of: 0x0A) else {
            throw .malformed(line: number + 1, .missingNewline)
        }
        let line = bytes[offset..<lf]
        number += 1
        offset = lf + 1
        if let p = Self.lineProblem(line) { throw problem(p) }
        return line
    }

    /// The value of the next line, which must be field `field`.
    mutating func value(of field: ManifestField) throws(ManifestError) -> ArraySlice<UInt8> {
        let line = try next(expecting: field)
        guard Self.key(of: line, is: field) else { throw problem(.expectedField(field)) }
        return try value(in: line, of: field)
    }

    /// The value after `field: ` in `line`, whose key is `field`: exactly one space, then a value
    /// that does not start with a space.
    func value(in line: ArraySlice<UInt8>, of field: ManifestField) throws(ManifestError) -> ArraySlice<UInt8> {
        let k = line.startIndex + field.rawValue.utf8.count
        guard line.endIndex >= k + 3, line[k] == 0x3A, line[k + 1] == 0x20, line[k + 2] != 0x20 else {
            throw problem(.badSeparator(field))
        }
        return line[(k + 2)...]
    }

    /// True if the line's key (everything before its first colon, or the whole line) is `field`.
    static func key(of line: ArraySlice<UInt8>, is field: ManifestField) -> Bool {
        let name = field.rawValue.utf8
        guard line.starts(with: name) else { return false }
        let k = line.startIndex + name.count
        return k == line.endIndex || line[k] == 0x3A
    }

    /// The first line-level rule `line` (without its LF) breaks, in the spec's order, or nil.
    static func lineProblem(_ line: ArraySlice<UInt8>) -> ManifestProblem? {
        if line.isEmpty { return .emptyLine }
        if line.contains(0x0D) { return .carriageReturn }
        if line.contains(where: { $0 < 0x20 || $0 == 0x7F }) { return .controlCharacter }
        if line.contains(where: { $0 >= 0x80 }) {
            guard let text = String(validating: line, as: UTF8.self) else { return .notUTF8 }
            if text.unicodeScalars.contains(where: Syntax.isForbiddenScalar) { return .controlCharacter }
        }
        if line.last == 0x20 { return .trailingSpace }
        return nil
    }
}

/// The value rules of the format.
enum Syntax {
    /// `[A-Za-z0-9][A-Za-z0-9._-]{0,127}`: app identifiers and access groups.
    static func isName(_ v: ArraySlice<UInt8>) -> Bool {
        guard let first = v.first, v.count <= Manifest.maximumNameBytes, isAlphanumeric(first) else { return false }
        return v.allSatisfy { isAlphanumeric($0) || $0 == 0x2E || $0 == 0x5F || $0 == 0x2D }
    }

    /// A name, and not the reserved `coffer.default`: items of that group are taken for ones stored
    /// before access groups and moved to `unsigned` at every unlock, out of the app's reach.
    static func isAccessGroup(_ v: ArraySlice<UInt8>) -> Bool {
        isName(v) && !v.elementsEqual("coffer.default".utf8)
    }

    /// An absolute path of at most 4096 bytes whose every component is non-empty and not `.` or `..`
    /// (so no `//`, no trailing `/`, no `/./` or `/../`). Characters were checked line-wide.
    static func isPath(_ v: ArraySlice<UInt8>) -> Bool {
        guard v.first == 0x2F, v.count <= Manifest.maximumPathBytes else { return false }
        return v.dropFirst().split(separator: 0x2F, omittingEmptySubsequences: false).allSatisfy { c in
            !c.isEmpty && !c.elementsEqual([0x2E]) && !c.elementsEqual([0x2E, 0x2E])
        }
    }

    static func isAlphanumeric(_ b: UInt8) -> Bool {
        (b >= 0x30 && b <= 0x39) || (b >= 0x41 && b <= 0x5A) || (b >= 0x61 && b <= 0x7A)
    }

    /// C1 controls, and the bidirectional formatting characters that can make a path display as
    /// something it is not (ALM, LRM, RLM, LRE…RLO, LRI…PDI).
    static func isForbiddenScalar(_ s: Unicode.Scalar) -> Bool {
        switch s.value {
        case 0x80...0x9F, 0x061C, 0x200E, 0x200F, 0x202A...0x202E, 0x2066...0x2069: true
        default: false
        }
    }
}


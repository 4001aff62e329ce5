#if os(Linux)
// SecCertificate: an X.509 certificate, parsed by OpenSSL's libcrypto through the CSecurityX509.h wall in COpenSSL (the
// keychain stores certificates as items of class `cert`, their DER bytes as the data).
public import Foundation
import COpenSSL
import CofferModel
import CofferSSHKeys

/// An X.509 certificate, as Apple's SecCertificate: made from its DER bytes, immutable; two are equal when
/// their DER bytes are.
public final class SecCertificate: @unchecked Sendable, Hashable, CustomStringConvertible {
    // @unchecked Sendable: immutable.
    /// The certificate's DER bytes, as given.
    let der: [UInt8]
    /// 1, 2 or 3 (kSecAttrCertificateType holds it, as CSSM_CERT_X_509v1…v3).
    let version: Int
    /// The subject and issuer Names' content, normalized as Apple's keychain stores them (kSecAttrSubject,
    /// kSecAttrIssuer): PrintableString values in upper case with their blanks collapsed.
    let normalizedSubject: [UInt8]
    let normalizedIssuer: [UInt8]
    /// The serial number's INTEGER content (SecCertificateCopySerialNumberData, kSecAttrSerialNumber).
    let serialNumber: [UInt8]
    /// The subject key identifier (kSecAttrSubjectKeyID), if the certificate has one.
    let subjectKeyID: [UInt8]?
    /// SHA-1 of the public key's bits (kSecAttrPublicKeyHash).
    let publicKeyHash: [UInt8]
    /// The subject's attributes in order: what kind each is and its text (nil for a value that is not a string).
    let subject: [(kind: Int32, text: String?)]
    /// The subject alternative name's rfc822Name and dNSName entries.
    let alternativeEmails: [String]
    let alternativeDNSNames: [String]
    /// The public key, for the algorithms a SecKey holds here (P-256, P-384, P-521, Ed25519).
    let publicKey: SSHPublicKey?

    /// Parses `der`: nil unless it is exactly one DER-encoded X.509 certificate.
    init?(der: [UInt8]) {
        guard let c = der.withUnsafeBufferPointer({ csx_parse($0.baseAddress, $0.count) }) else { return nil }
        defer { csx_free(c) }
        func bytes(_ b: csx_bytes) -> [UInt8] {
            guard let p = b.ptr, b.len > 0 else { return [] }
            return Array(UnsafeBufferPointer(start: p, count: b.len))
        }
        func texts(_ list: UnsafeMutablePointer<csx_bytes>?, _ count: Int) -> [String] {
            guard let list else { return [] }
            return (0..<count).map { String(decoding: bytes(list[$0]), as: UTF8.self) }
        }
        let r = c.pointee
        self.der = der
        version = Int(r.version)
        normalizedSubject = bytes(r.normalized_subject)
        normalizedIssuer = bytes(r.normalized_issuer)
        serialNumber = bytes(r.serial)
        subjectKeyID = r.has_subject_key_id != 0 ? bytes(r.subject_key_id) : nil
        publicKeyHash = withUnsafeBytes(of: r.public_key_sha1) { Array($0) }
        subject = r.subject.map { list in
            (0..<r.subject_count).map { i in
                (kind: list[i].kind, text: list[i].has_text != 0 ? String(decoding: bytes(list[i].utf8), as: UTF8.self) : nil)
            }
        } ?? []
        alternativeEmails = texts(r.san_emails, r.san_email_count)
        alternativeDNSNames = texts(r.san_dns, r.san_dns_count)
        let key = bytes(r.public_key)
        let candidate: SSHPublicKey? = switch r.key_kind {
        case CSX_KEY_P256: .ecdsa(curve: .p256, q: key)
        case CSX_KEY_P384: .ecdsa(curve: .p384, q: key)
        case CSX_KEY_P521: .ecdsa(curve: .p521, q: key)
        case CSX_KEY_ED25519: .ed25519(key)
        default: nil
        }
        publicKey = candidate.flatMap { k in (try? k.validate()).map { k } }
    }

    /// Apple's subject summary (SecCertificateCopySubjectSummary): the most telling kind of the subject's
    /// attributes — its common names, else its organizational units, else its organizations, else any other
    /// text attribute — several of that kind joined with ", " (last first, as Apple's); a common name
    /// followed by the subject's descriptions in parentheses; with no text in the subject at all, the first
    /// email address (subject alternative name), else its first DNS name.
    var subjectSummary: String? {
        var rank = 0, summary: String? = nil, description: String? = nil
        for entry in subject {
            guard let text = entry.text else { continue }
            let r: Int
            switch entry.kind {
            case CSX_ENTRY_COMMON_NAME: r = 4
            case CSX_ENTRY_ORGANIZATIONAL_UNIT: r = 3
            case CSX_ENTRY_ORGANIZATION: r = 2
            case CSX_ENTRY_DESCRIPTION:
                description = description.map { "\(text), \($0)" } ?? text
                r = 1
            default: r = 1
            }
            guard r >= rank else { continue }
            summary = r == rank ? summary.map { "\(text), \($0)" } ?? text : text
            rank = r
        }
        if rank == 4, let description, let s = summary { summary = "\(s) (\(description))" }
        return summary ?? emailAddresses.first ?? dnsNames.first
    }

    /// The subject's common names, in order.
    var commonNames: [String] { subject.compactMap { $0.kind == CSX_ENTRY_COMMON_NAME ? $0.text : nil } }

    /// The email addresses (SecCertificateCopyEmailAddresses): the subject alternative name's, then the
    /// subject's emailAddress attributes.
    var emailAddresses: [String] {
        alternativeEmails + subject.compactMap { $0.kind == CSX_ENTRY_EMAIL_ADDRESS ? $0.text : nil }
    }

    /// The DNS names: the subject alternative name's that look like DNS names, else the common names that do.
    var dnsNames: [String] {
        let fromSAN = alternativeDNSNames.filter(Self.isDNSName)
        return fromSAN.isEmpty ? commonNames.filter(Self.isDNSName) : fromSAN
    }

    /// RFC 1035's preferred name syntax as Apple checks it: labels of letters, digits, `*` and `_`, with
    /// inner `-`, at most 63 bytes each and 255 in all, the last one with a letter.
    static func isDNSName(_ name: String) -> Bool {
        let bytes = Array(name.utf8)
        guard !bytes.isEmpty, bytes.count <= 255 else { return false }
        let labels = bytes.split(separator: UInt8(ascii: "."), omittingEmptySubsequences: false)
        for label in labels {
            guard !label.isEmpty, label.count <= 63, label.first != UInt8(ascii: "-"), label.last != UInt8(ascii: "-") else { return false }
            for c in label where !(isLetter(c) || (c >= 0x30 && c <= 0x39) || c == UInt8(ascii: "-") || c == UInt8(ascii: "_")) { return false }
        }
        return labels.last!.contains(where: isLetter)
    }

    private static func isLetter(_ c: UInt8) -> Bool { (c | 0x20) >= 0x61 && (c | 0x20) <= 0x7A || c == UInt8(ascii: "*") }

    /// The attributes SecItemAdd gives a certificate item made from it (Apple's SecCertificate attribute
    /// dictionary): its type (the X.509 version), DER encoding, normalized subject and issuer, serial
    /// number, subject key identifier, public key hash, and the subject summary as its label.
    var itemAttributes: Attributes {
        var a: Attributes = ["ctyp": .integer(Int64(version)), "cenc": .integer(3), "subj": .data(normalizedSubject),
                             "issr": .data(normalizedIssuer), "slnr": .data(serialNumber), "pkhh": .data(publicKeyHash)]
        if let subjectKeyID { a["skid"] = .data(subjectKeyID) }
        if let subjectSummary { a["labl"] = .string(subjectSummary) }
        return a
    }

    /// What identifies its item in a search (the class's primary key, as Apple's query from a reference).
    var searchAttributes: Attributes {
        ["ctyp": .integer(Int64(version)), "issr": .data(normalizedIssuer), "slnr": .data(serialNumber)]
    }

    public static func == (a: SecCertificate, b: SecCertificate) -> Bool { a.der == b.der }
    public func hash(into h: inout Hasher) { h.combine(der) }

    public var description: String { "<cert s: \(subjectSummary ?? "(none)")>" }
}

/// The type id of SecCertificate (CFGetTypeID of one).
public func SecCertificateGetTypeID() -> CFTypeID { TypeIDs.certificate }

/// A certificate from its DER bytes; nil unless `data` is exactly one well-formed DER X.509 certificate (a PEM
/// text, a chain or trailing bytes are not). `allocator` is ignored.
public func SecCertificateCreateWithData(_ allocator: CFAllocator?, _ data: CFData) -> SecCertificate? {
    SecCertificate(der: [UInt8](data as Data))
}

/// The certificate's DER bytes.
public func SecCertificateCopyData(_ certificate: SecCertificate) -> CFData {
    Data(certificate.der) as CFData
}

/// A short name for people (Apple's rule): the subject's common name, else its organizational unit,
/// organization or another text attribute, else the first email address or DNS name; nil with none of them.
public func SecCertificateCopySubjectSummary(_ certificate: SecCertificate) -> CFString? {
    certificate.subjectSummary.map { $0 as CFString }
}

/// The subject's common name (the last, if it has several, as Apple's); errSecInternal if it has none.
public func SecCertificateCopyCommonName(_ certificate: SecCertificate, _ commonName: UnsafeMutablePointer<CFString?>) -> OSStatus {
    guard let name = certificate.commonNames.last else { return errSecInternal }
    commonName.pointee = name as CFString
    return errSecSuccess
}

/// The email addresses: the subject alternative name's rfc822Names, then the subject's emailAddress
/// attributes (an empty array when there are none); errSecSuccess.
public func SecCertificateCopyEmailAddresses(_ certificate: SecCertificate, _ emailAddresses: UnsafeMutablePointer<CFArray?>) -> OSStatus {
    emailAddresses.pointee = certificate.emailAddresses as NSArray
    return errSecSuccess
}

/// The serial number: its INTEGER content bytes (big-endian two's complement, with the leading zero a
/// positive number whose top bit is set keeps).
public func SecCertificateCopySerialNumberData(_ certificate: SecCertificate, _ error: UnsafeMutablePointer<Unmanaged<CFError>?>?) -> CFData? {
    Data(certificate.serialNumber) as CFData
}

/// The certificate's public key as a SecKey, for the algorithms SecKey holds here (ECDSA P-256, P-384 and
/// P-521, and Ed25519); nil for others (RSA among them).
public func SecCertificateCopyKey(_ certificate: SecCertificate) -> SecKey? {
    certificate.publicKey.map { SecKey(.publicKey($0)) }
}
#endif

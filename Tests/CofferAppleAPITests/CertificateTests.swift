import CofferTestSupport
import Foundation
import Security
import Testing

/// A certificate `openssl req -x509` makes, with its private key beside it (PEM) for signing with OpenSSL.
struct TestCertificate {
    enum Kind: String, Sendable, CaseIterable { case p256, ed25519, rsa }
    let der: Data
    let keyFile: String
    let dir: TemporaryDirectory

    /// A self-signed certificate of `kind` with subject `subject` (openssl's `/A=v/B=w` form) and, if given,
    /// the subjectAltName extension `alternativeNames` (`DNS:…,email:…`).
    init(_ kind: Kind, subject: String, alternativeNames: String? = nil) throws {
        dir = TemporaryDirectory("coffer-cert")
        keyFile = dir.file("key.pem")
        let key: [String] = switch kind {
        case .p256: ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"]
        case .ed25519: ["-newkey", "ed25519"]
        case .rsa: ["-newkey", "rsa:2048"]
        }
        let r = runProcess(Self.openssl, ["req", "-x509"] + key + ["-nodes", "-keyout", keyFile, "-subj", subject, "-days", "2",
                                                                   "-outform", "DER", "-out", dir.file("cert.der")]
                           + (alternativeNames.map { ["-addext", "subjectAltName=\($0)"] } ?? []))
        guard r.status == 0 else { throw TestAgent.SetupError(text: "openssl req: \(r)") }
        der = try Data(contentsOf: URL(fileURLWithPath: dir.file("cert.der")))
    }

    static let openssl = ["/usr/bin/openssl", "/bin/openssl"].first { FileManager.default.isExecutableFile(atPath: $0) } ?? "/usr/bin/openssl"

    /// `openssl x509 ARGS` on this certificate: its output.
    func x509(_ args: [String]) -> String {
        runProcess(Self.openssl, ["x509", "-inform", "DER", "-in", dir.file("cert.der"), "-noout"] + args).stdout
    }

    /// The serial number as openssl prints it (hex digits, upper case).
    var serialHex: String {
        x509(["-serial"]).trimmingCharacters(in: .whitespacesAndNewlines).replacingOccurrences(of: "serial=", with: "")
    }

    /// OpenSSL's signature of `message` with the certificate's private key: ECDSA over SHA-256 (DER), or Ed25519.
    func sign(_ message: Data, ed25519: Bool) throws -> Data {
        let input = dir.file("message"), output = dir.file("signature")
        try message.write(to: URL(fileURLWithPath: input))
        let args = ed25519 ? ["pkeyutl", "-sign", "-inkey", keyFile, "-rawin", "-in", input, "-out", output]
            : ["dgst", "-sha256", "-sign", keyFile, "-out", output, input]
        let r = runProcess(Self.openssl, args)
        guard r.status == 0 else { throw TestAgent.SetupError(text: "openssl sign: \(r)") }
        return try Data(contentsOf: URL(fileURLWithPath: output))
    }
}

func hex(_ d: Data) -> String { d.map { String(format: "%02X", $0) }.joined() }

extension AppleSecurityAPITests {
    // MARK: SecCertificate (issue #46)

    /// SecCertificateCreateWithData takes exactly one DER certificate, and the functions read it as Apple's do:
    /// the common name as the summary, the serial number openssl prints, the DER bytes back unchanged.
    @Test(arguments: TestCertificate.Kind.allCases)
    func aCertificateFromItsDERBytes(kind: TestCertificate.Kind) throws {
        let name = "\(kind.rawValue)-\(UUID().uuidString.prefix(8)).example.com"
        let made = try TestCertificate(kind, subject: "/C=us/O=Example  Org/CN=\(name)")
        let cert = try #require(SecCertificateCreateWithData(nil, made.der as CFData))
        #expect(SecCertificateCopyData(cert) as Data == made.der)
        #expect(SecCertificateCopySubjectSummary(cert) as String? == name)
        var cn: CFString?
        #expect(SecCertificateCopyCommonName(cert, &cn) == errSecSuccess)
        #expect(cn as String? == name)
        var error: Unmanaged<CFError>?
        let serial = try #require(SecCertificateCopySerialNumberData(cert, &error) as Data?)
        #expect(error == nil)
        // The INTEGER's content: openssl prints the magnitude, without the zero a high top bit needs.
        #expect(hex(serial.first == 0 && serial.count > 1 ? serial.dropFirst() : serial) == made.serialHex)
        #expect(CFGetTypeID(cert) == SecCertificateGetTypeID())
        #expect(CFGetTypeID(cert) != SecKeyGetTypeID())
        #expect(SecCertificateCreateWithData(kCFAllocatorDefault, made.der as CFData) == cert, "equal when the DER bytes are")
    }

    @Test func anythingButOneDERCertificateIsNil() throws {
        let made = try TestCertificate(.p256, subject: "/CN=malformed")
        let der = made.der
        let pem = runProcess(TestCertificate.openssl, ["x509", "-inform", "DER", "-in", made.dir.file("cert.der")]).stdout
        let cases: [(String, Data)] = [
            ("empty", Data()),
            ("garbage", Data((0..<200).map { UInt8(truncatingIfNeeded: $0 &* 37) })),
            ("truncated", der.prefix(der.count - 1)),
            ("a trailing byte", der + [0]),
            ("two certificates", der + der),
            ("PEM text", Data(pem.utf8)),
            ("a flipped length byte", { var d = der; d[1] ^= 0x01; return d }()),
            ("a SEQUENCE that is no certificate", Data([0x30, 0x03, 0x02, 0x01, 0x01])),
            ("a private key", (try? Data(contentsOf: URL(fileURLWithPath: made.keyFile))) ?? Data([1])),
        ]
        for (what, bytes) in cases {
            #expect(SecCertificateCreateWithData(nil, bytes as CFData) == nil, "\(what)")
        }
    }

    /// The public key comes out as a SecKey that verifies the signatures OpenSSL makes with the certificate's
    /// private key (P-256, Ed25519); RSA has no SecKey here, so nil.
    @Test(arguments: TestCertificate.Kind.allCases)
    func theCertificatesKeyVerifiesItsOwnersSignature(kind: TestCertificate.Kind) throws {
        let made = try TestCertificate(kind, subject: "/CN=key-\(kind.rawValue)")
        let cert = try #require(SecCertificateCreateWithData(nil, made.der as CFData))
        guard kind != .rsa else {
            #expect(SecCertificateCopyKey(cert) == nil)
            return
        }
        let key = try #require(SecCertificateCopyKey(cert))
        let attributes = try #require(SecKeyCopyAttributes(key) as? [String: Any])
        #expect(attributes[kSecAttrKeyClass as String] as? Int == 0, "a public key")
        let message = Data("signed by the certificate's owner".utf8)
        let algorithm: SecKeyAlgorithm = kind == .ed25519 ? .ed25519SignatureMessage : .ecdsaSignatureMessageX962SHA256
        let signature = try made.sign(message, ed25519: kind == .ed25519)
        #expect(SecKeyVerifySignature(key, algorithm, message as CFData, signature as CFData, nil))
        #expect(!SecKeyVerifySignature(key, algorithm, Data("something else".utf8) as CFData, signature as CFData, nil))
        #expect((SecKeyCopyExternalRepresentation(key, nil) as Data?)?.count == (kind == .ed25519 ? 32 : 65))
    }

    /// Apple's summary rule beyond the common name: several common names joined last first, the last one the
    /// common name; the organizational unit over the organization; an email address when the subject has no text.
    @Test func theSubjectSummaryFollowsApplesOrder() throws {
        let two = try #require(SecCertificateCreateWithData(nil, try TestCertificate(.p256, subject: "/CN=first/CN=second").der as CFData))
        #expect(SecCertificateCopySubjectSummary(two) as String? == "second, first")
        var cn: CFString?
        #expect(SecCertificateCopyCommonName(two, &cn) == errSecSuccess)
        #expect(cn as String? == "second", "Apple's SecCertificateCopyCommonName gives the last")

        let org = try #require(SecCertificateCreateWithData(nil, try TestCertificate(.p256, subject: "/O=The Org/OU=The Unit/C=DE").der as CFData))
        #expect(SecCertificateCopySubjectSummary(org) as String? == "The Unit")
        cn = "left over" as CFString
        #expect(SecCertificateCopyCommonName(org, &cn) == errSecInternal, "no common name")

        let mail = try #require(SecCertificateCreateWithData(nil, try TestCertificate(.ed25519, subject: "/",
            alternativeNames: "email:someone@example.com,DNS:host.example.com").der as CFData))
        #expect(SecCertificateCopySubjectSummary(mail) as String? == "someone@example.com")
        var emails: CFArray?
        #expect(SecCertificateCopyEmailAddresses(mail, &emails) == errSecSuccess)
        #expect(emails as? [String] == ["someone@example.com"])
        let host = try #require(SecCertificateCreateWithData(nil, try TestCertificate(.p256, subject: "/", alternativeNames: "DNS:host.example.com").der as CFData))
        #expect(SecCertificateCopySubjectSummary(host) as String? == "host.example.com")
    }

    /// SecItemAdd with kSecValueRef stores a certificate item with Apple's attributes; kSecReturnRef gives the
    /// certificate back, alone, in an array and in a dictionary beside the attributes; the same certificate
    /// again is a duplicate, another one is not; kSecValueRef in a delete names just that certificate.
    @Test func aCertificateIsAnItemWithApplesAttributes() throws {
        let name = "item-\(UUID().uuidString.prefix(8))"
        let made = try TestCertificate(.p256, subject: "/C=us/O=Example  Org/CN=\(name)")
        let cert = try #require(SecCertificateCreateWithData(nil, made.der as CFData))
        var added: CFTypeRef?
        let add: [String: Any] = [kSecClass as String: kSecClassCertificate, kSecValueRef as String: cert,
                                  kSecReturnRef as String: true]
        #expect(SecItemAdd(add as CFDictionary, &added) == errSecSuccess)
        #expect(added as? SecCertificate == cert)
        #expect(SecItemAdd(add as CFDictionary, nil) == errSecDuplicateItem)

        var found: CFTypeRef?
        let byLabel: [String: Any] = [kSecClass as String: kSecClassCertificate, kSecAttrLabel as String: name]
        var attributesQuery = byLabel
        attributesQuery[kSecReturnAttributes as String] = true
        #expect(SecItemCopyMatching(attributesQuery as CFDictionary, &found) == errSecSuccess)
        let a = try #require(found as? [String: Any])
        #expect(a[kSecAttrLabel as String] as? String == name, "the label defaults to the subject summary")
        #expect(a[kSecAttrCertificateType as String] as? Int == 3, "X.509 v3")
        #expect(a[kSecAttrCertificateEncoding as String] as? Int == 3, "DER")
        var error: Unmanaged<CFError>?
        #expect(a[kSecAttrSerialNumber as String] as? Data == SecCertificateCopySerialNumberData(cert, &error) as Data?)
        let subject = try #require(a[kSecAttrSubject as String] as? Data)
        #expect(a[kSecAttrIssuer as String] as? Data == subject, "self-signed")
        // The Name's content, normalized as Apple's: the PrintableString country in upper case, the UTF8String
        // organization as it is.
        #expect(subject.range(of: Data([0x13, 0x02]) + Data("US".utf8)) != nil)
        #expect(subject.range(of: Data("Example  Org".utf8)) != nil)
        #expect(subject.range(of: Data("us".utf8)) == nil)
        #expect(subject.first == 0x31, "the content of the Name: its first RDN's SET, no outer SEQUENCE")
        #expect((a[kSecAttrPublicKeyHash as String] as? Data)?.count == 20)
        #expect((a[kSecAttrSubjectKeyID as String] as? Data)?.isEmpty == false, "openssl req adds a subject key identifier")
        #expect(a[kSecValueData as String] == nil)

        var refQuery = byLabel
        refQuery[kSecReturnRef as String] = true
        #expect(SecItemCopyMatching(refQuery as CFDictionary, &found) == errSecSuccess)
        #expect(found as? SecCertificate == cert)
        #expect(CFGetTypeID(found) == SecCertificateGetTypeID())
        refQuery[kSecMatchLimit as String] = kSecMatchLimitAll
        #expect(SecItemCopyMatching(refQuery as CFDictionary, &found) == errSecSuccess)
        #expect(found as? [SecCertificate] == [cert])
        refQuery[kSecReturnAttributes as String] = true
        #expect(SecItemCopyMatching(refQuery as CFDictionary, &found) == errSecSuccess)
        let rows = try #require(found as? [[String: Any]])
        #expect(rows.count == 1)
        #expect(rows.first?[kSecValueRef as String] as? SecCertificate == cert)
        #expect(rows.first?[kSecAttrLabel as String] as? String == name)
        #expect(rows.first?[kSecValueData as String] == nil, "the data was not asked for")
        // kSecReturnData gives the DER bytes, as for an item added with kSecValueData.
        var dataQuery = byLabel
        dataQuery[kSecReturnData as String] = true
        #expect(SecItemCopyMatching(dataQuery as CFDictionary, &found) == errSecSuccess)
        #expect(found as? Data == made.der)

        // Another certificate of the same subject is another item (its serial number differs).
        let other = try #require(SecCertificateCreateWithData(nil, try TestCertificate(.rsa, subject: "/CN=\(name)").der as CFData))
        #expect(SecItemAdd([kSecValueRef as String: other] as CFDictionary, nil) == errSecSuccess, "the class comes from the reference")
        var both: CFTypeRef?
        let all: [String: Any] = [kSecClass as String: kSecClassCertificate, kSecAttrLabel as String: name,
                                  kSecReturnRef as String: true, kSecMatchLimit as String: kSecMatchLimitAll]
        #expect(SecItemCopyMatching(all as CFDictionary, &both) == errSecSuccess)
        #expect(Set(both as? [SecCertificate] ?? []) == [cert, other])
        // A delete naming one certificate by reference leaves the other.
        #expect(SecItemDelete([kSecValueRef as String: cert] as CFDictionary) == errSecSuccess)
        #expect(SecItemCopyMatching(all as CFDictionary, &both) == errSecSuccess)
        #expect(both as? [SecCertificate] == [other])
        #expect(SecItemDelete([kSecClass as String: kSecClassCertificate, kSecValueRef as String: other] as CFDictionary) == errSecSuccess)
        #expect(SecItemCopyMatching(all as CFDictionary, &both) == errSecItemNotFound)
        // A reference of the wrong class for kSecClass is a parameter error.
        #expect(SecItemAdd([kSecClass as String: kSecClassGenericPassword, kSecValueRef as String: cert] as CFDictionary, nil) == errSecParam)
    }

    /// A certificate item added with kSecValueData (as Apple's, its attributes are the caller's) still comes back
    /// as a SecCertificate; one whose data is not a certificate gives no reference, as on Apple platforms.
    @Test func aCertificateAddedAsDataComesBackAsAReference() throws {
        let label = "as-data-\(UUID().uuidString.prefix(8))"
        let made = try TestCertificate(.ed25519, subject: "/CN=\(label)")
        let add: [String: Any] = [kSecClass as String: kSecClassCertificate, kSecValueData as String: made.der, kSecAttrLabel as String: label,
                                  kSecAttrSerialNumber as String: Data([1]), kSecAttrIssuer as String: Data(label.utf8)]
        #expect(SecItemAdd(add as CFDictionary, nil) == errSecSuccess)
        let junk: [String: Any] = [kSecClass as String: kSecClassCertificate, kSecValueData as String: Data("not a certificate".utf8),
                                   kSecAttrLabel as String: label, kSecAttrSerialNumber as String: Data([2]), kSecAttrIssuer as String: Data(label.utf8)]
        #expect(SecItemAdd(junk as CFDictionary, nil) == errSecSuccess)
        var found: CFTypeRef?
        let q: [String: Any] = [kSecClass as String: kSecClassCertificate, kSecAttrLabel as String: label, kSecReturnRef as String: true,
                                kSecMatchLimit as String: kSecMatchLimitAll]
        #expect(SecItemCopyMatching(q as CFDictionary, &found) == errSecSuccess)
        let certs = try #require(found as? [SecCertificate])
        #expect(certs.map { SecCertificateCopyData($0) as Data } == [made.der])
    }
}

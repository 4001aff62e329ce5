public import CofferCrypto
import CofferModel

extension Manifest {
    /// Signs a manifest with an Ed25519 secret key (64 bytes, libsodium layout); `signed-by` is the
    /// key's public half. Every value is checked by the parser's own rules first (an invalid one
    /// throws `.malformed` with the line it would have had), so no value can add a line of its own.
    /// Ed25519 is deterministic: the same fields and key always give the same bytes. A manifest
    /// without `entitlements` is written in version 1 (every agent reads it), one with them in version 2.
    public static func sign(app: String, executable: String, executableSHA256: [UInt8], accessGroups: [String],
                            entitlements: [ManifestEntitlement] = [], secretKey: SecureBytes) throws(ManifestError) -> Manifest {
        let signer = Ed25519.publicKey(secretKey: secretKey)
        var fields: [(ManifestField, String)] = [(.app, app), (.executable, executable),
                                                 (.executableSHA256, Hex.encode(executableSHA256))]
        fields += accessGroups.map { (.accessGroup, $0) }
        for (i, (field, value)) in fields.enumerated() {
            if let p = problem(with: value, as: field) { throw .malformed(line: i + 2, p) }
        }
        var text = unsignedText(version: entitlements.isEmpty ? 1 : 2, app: app, executable: executable, executableSHA256: executableSHA256,
                                accessGroups: accessGroups, entitlements: entitlements, signer: signer)
        let signature = Ed25519.sign(text, secretKey: secretKey)
        text += Array("\(ManifestField.signature.rawValue): \(Hex.encode(signature))\n".utf8)
        // The parser has the last word (group count, duplicates, size), so signing and parsing cannot disagree.
        return try parse(text)
    }

    /// Checks that the manifest was signed by one of `trustedKeys` and that the signature covers its
    /// bytes. The signer is checked first: an untrusted key is `.untrustedSigner` whatever its
    /// signature; a trusted key with a wrong signature is `.badSignature`.
    public func verify(trusting trustedKeys: Set<SignerKey>) throws(ManifestError) {
        guard trustedKeys.contains(signer) else { throw .untrustedSigner }
        guard Ed25519.verify(signature: signature, message: signedBytes, publicKey: signer.bytes) else {
            throw .badSignature
        }
    }
}

package import CofferCrypto
package import CofferModel
package import CofferSSHAgentProtocol
import CofferSSHKeys

/// SSH keys as keychain items (class `keys`, issue #27): what the agent writes into an item for a key
/// it generated or imported, and how it reads the key back to sign. The item's secret is the key's
/// stored form (``CofferSSHAgentProtocol/SSHPrivateKey/encodeStored()``); its attributes are Apple's
/// SecKey attributes (``KeyItem``): `kcls` private, `type`, `bsiz`, `klbl` (the SHA-256 of the public
/// key blob: the key's SSH fingerprint), `extr` false, `sign` true, and Coffer's `pubk` (the public
/// key blob, so listing a key opens no secret).
package enum SSHKeyItems {
    /// The algorithm a KEY_CREATE's `type` and `bsiz` name: Ed25519 (2100; `bsiz` 256 or none), ECDSA
    /// (73; `bsiz` 256, 384 or 521, default 256), RSA (42; `bsiz` 2048 to 8192 in steps of 16, default 3072).
    static func algorithm(_ attributes: Attributes) throws(SecError) -> SSHKeyAlgorithm {
        guard case .integer(let t)? = attributes["type"], let type = KeyItem.KeyType(rawValue: t) else {
            throw .param("a key to generate needs its type: ed25519 (2100), ECDSA (73) or RSA (42)")
        }
        var bits: Int64? = nil
        if case .integer(let b)? = attributes["bsiz"] { bits = b }
        switch (type, bits) {
        case (.ed25519, nil), (.ed25519, 256?): return .ed25519
        case (.ecSECPrimeRandom, nil), (.ecSECPrimeRandom, 256?): return .ecdsaP256
        case (.ecSECPrimeRandom, 384?): return .ecdsaP384
        case (.ecSECPrimeRandom, 521?): return .ecdsaP521
        case (.rsa, nil): return .rsa(bits: 3072)
        case (.rsa, let b?) where b >= Int64(SSHKeyAlgorithm.rsaMinimumBits) && b <= Int64(SSHKeyAlgorithm.rsaMaximumGeneratedBits) && b % 16 == 0:
            return .rsa(bits: Int(b))
        case (.rsa, _):
            throw .param("an RSA key has \(SSHKeyAlgorithm.rsaMinimumBits) to \(SSHKeyAlgorithm.rsaMaximumGeneratedBits) bits, a multiple of 16")
        default:
            throw .param("this key type has no such size (Ed25519: 256; ECDSA: 256, 384 or 521)")
        }
    }

    /// A new key of the algorithm `attributes` name, as the item to add. Generated here, in the agent.
    package static func generated(_ attributes: Attributes) throws(SecError) -> NewItem {
        let algorithm = try algorithm(attributes)
        let key: SSHPrivateKey
        do {
            key = try SSHPrivateKey.generate(algorithm)
        } catch {
            throw SecError(.internalComponent, "generating the \(algorithm) key failed: \(error)")
        }
        var given = attributes
        given["type"] = nil
        given["bsiz"] = nil
        return try item(key.wireKey, attributes: given)
    }

    /// The item for a key given in the ssh-agent wire form (an import), checked to form a key of a
    /// supported type (an RSA key below 2048 bits is refused).
    package static func imported(wire: SecureBytes, attributes: Attributes) throws(SecError) -> NewItem {
        let key: SSHWirePrivateKey
        do {
            key = try SSHWirePrivateKey(wire: wire)
            try key.validate()
            _ = try key.cryptoKey()
        } catch {
            throw .param("the key to import is not a usable SSH private key: \(error)")
        }
        return try item(key, attributes: attributes)
    }

    /// The item holding `key`, with the caller's `attributes` (label, tag, group, class, access
    /// control) and the agent's own.
    private static func item(_ key: SSHWirePrivateKey, attributes: Attributes) throws(SecError) -> NewItem {
        if let name = attributes.keys.sorted().first(where: { KeyItem.agentSet.contains($0) }) {
            throw .param("attribute '\(name)' of a key is set by the agent")
        }
        let publicKey = key.publicKey
        let blob = publicKey.blob
        let (type, bits): (KeyItem.KeyType, Int) = switch publicKey {
        case .ed25519: (.ed25519, 256)
        case .ecdsa(let curve, _): (.ecSECPrimeRandom, curve == .nistp256 ? 256 : curve == .nistp384 ? 384 : 521)
        case .rsa: (.rsa, Self.rsaBits(publicKey.cryptoKey.algorithm))
        }
        var attrs = attributes
        attrs["kcls"] = .integer(KeyItem.KeyClass.private.rawValue)
        attrs["type"] = .integer(type.rawValue)
        attrs["bsiz"] = .integer(Int64(bits))
        attrs["klbl"] = .data(SHA256.hash(blob))
        attrs[KeyItem.publicKeyAttribute] = .data(blob)
        attrs[KeyItem.extractableAttribute] = .bool(false)
        attrs["perm"] = .bool(true)
        attrs["sign"] = .bool(true)
        attrs["sens"] = .bool(true)
        return NewItem(itemClass: .key, attributes: attrs, secret: key.encodeStored())
    }

    private static func rsaBits(_ algorithm: SSHKeyAlgorithm) -> Int {
        if case .rsa(let bits) = algorithm { return bits }
        return 0
    }

    /// The public key an item's attributes carry (nil: not an SSH key this agent made).
    package static func publicKey(_ attributes: Attributes) -> SSHWirePublicKey? {
        guard attributes["kcls"] == .integer(KeyItem.KeyClass.private.rawValue),
              case .data(let blob)? = attributes[KeyItem.publicKeyAttribute] else { return nil }
        return try? SSHWirePublicKey(blob: blob)
    }

    /// The query that finds the key item with public key `blob`.
    package static func query(blob: [UInt8]) -> ItemQuery {
        ItemQuery(itemClass: .key, attributes: ["kcls": .integer(KeyItem.KeyClass.private.rawValue), "klbl": .data(SHA256.hash(blob))])
    }

    /// `data` signed by a key item's private half (its secret and attributes, lent by the core for this one
    /// use), in the SSH signature blob's form; `flags` are ssh-agent's signature flags (RSA's hash).
    package static func sign(stored: SecureBytes, attributes: Attributes, data: [UInt8], flags: UInt32,
                     publicKey: SSHWirePublicKey) throws(SecError) -> SSHWireSignature {
        let key = try signingKey(stored: stored, attributes: attributes)
        let hash = SSHRSASignatureAlgorithm(signFlags: flags).cryptoHash
        do {
            guard let s = SSHWireSignature(try key.sign(data: data, hash: hash, allowSHA1: true), by: publicKey) else {
                throw SecError(.internalComponent, "the signature does not match the key")
            }
            return s
        } catch let e as SecError {
            throw e
        } catch {
            throw SecError(.internalComponent, "signing failed: \(error)")
        }
    }

    /// The signing key in a key item's secret, checked to be the key its attributes name (a row whose
    /// public half was altered signs nothing).
    static func signingKey(stored: SecureBytes, attributes: Attributes) throws(SecError) -> SSHPrivateKey {
        do {
            let key = try SSHWirePrivateKey.decodeStored(stored)
            guard attributes[KeyItem.publicKeyAttribute] == .data(key.publicKey.blob) else {
                throw SecError.decode("the key item's public half does not match its private half")
            }
            return try key.cryptoKey()
        } catch let e as SecError {
            throw e
        } catch {
            throw .decode("the key item does not hold a usable SSH key: \(error)")
        }
    }
}

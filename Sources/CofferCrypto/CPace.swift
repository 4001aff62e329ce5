import CSodium

/// CPace, the balanced password-authenticated key exchange of draft-irtf-cfrg-cpace (the suite
/// CPACE-RISTR255-SHA512: libsodium's ristretto255 group and SHA-512), in its initiator-responder
/// form, with the draft's explicit key confirmation (section "Key confirmation"): HMAC-SHA-512 under
/// `mac_key = SHA-512("CPaceMac" ‖ sid ‖ ISK)` over each party's own `lv_cat(Y, AD)`.
///
/// Two parties who share a short code (the PRS) and agree on a channel identifier (CI) and a session
/// id (sid) each send one group element; each gets the same 64-byte intermediate session key (ISK) if
/// and only if they used the same code. Someone who sees or replaces the messages learns nothing of
/// the code offline: an active attacker tests one guess per run. Only libsodium's primitives are used
/// (`crypto_core_ristretto255_from_hash`, `crypto_scalarmult_ristretto255`,
/// `crypto_core_ristretto255_scalar_random`, `crypto_hash_sha512`, `crypto_auth_hmacsha512`); this
/// file composes them as the draft specifies, and `CPaceTests` checks the draft's own vectors.
public enum CPace {
    /// G_Ristretto255.DSI.
    static let dsi = Array("CPaceRistretto255".utf8)
    /// Size of a message (an encoded group element) and of a scalar.
    public static let elementBytes = Int(crypto_core_ristretto255_BYTES)
    public static let scalarBytes = Int(crypto_core_ristretto255_SCALARBYTES)
    /// Size of the intermediate session key and of a confirmation tag.
    public static let iskBytes = Int(crypto_hash_sha512_BYTES)
    public static let tagBytes = Int(crypto_auth_hmacsha512_BYTES)
    /// SHA-512's input block size (H.s_in_bytes).
    static let hashBlockBytes = 128

    /// The draft's prepend_len: the length as LEB128, then the bytes.
    public static func prependLength(_ count: Int) -> [UInt8] {
        var out: [UInt8] = [], n = count
        repeat {
            var byte = UInt8(n & 0x7f)
            n >>= 7
            if n > 0 { byte |= 0x80 }
            out.append(byte)
        } while n > 0
        return out
    }

    /// The draft's lv_cat: each part with its length prepended.
    public static func lvCat(_ parts: [[UInt8]]) -> [UInt8] {
        parts.reduce(into: [UInt8]()) { $0 += prependLength($1.count) + $1 }
    }

    /// A piece of a hash input: public bytes, or secret ones already in secure memory.
    enum Piece {
        case plain([UInt8])
        case secret(SecureBytes)
    }

    /// `pieces` one after another, in secure memory (some of them are secret): the one place the
    /// generator string, the ISK's input and the MAC key's input are put together.
    static func joined(_ pieces: [Piece]) -> SecureBytes {
        let total = pieces.reduce(0) { n, p in
            switch p { case .plain(let b): n + b.count; case .secret(let s): n + s.count }
        }
        let out = SecureBytes(count: total)
        unsafe out.withUnsafeMutableBytes { o in
            var at = 0
            func put(_ b: UnsafeRawBufferPointer) {
                guard b.count > 0 else { return }
                unsafe (o.baseAddress! + at).copyMemory(from: b.baseAddress!, byteCount: b.count)
                at += b.count
            }
            for piece in pieces {
                switch piece {
                case .plain(let b): unsafe b.withUnsafeBytes { unsafe put($0) }
                case .secret(let s): unsafe s.withUnsafeBytes { unsafe put($0) }
                }
            }
        }
        return out
    }

    /// The draft's generator_string(DSI, PRS, CI, sid, 128), in secure memory (it holds the code).
    static func generatorString(prs: SecureBytes, ci: [UInt8], sid: [UInt8]) -> SecureBytes {
        let prsPrefix = prependLength(prs.count), dsiPart = prependLength(dsi.count) + dsi
        let zpad = max(0, hashBlockBytes - 1 - (prsPrefix.count + prs.count) - dsiPart.count)
        let tail = prependLength(zpad) + [UInt8](repeating: 0, count: zpad) + lvCat([ci, sid])
        return joined([.plain(dsiPart), .plain(prsPrefix), .secret(prs), .plain(tail)])
    }

    /// SHA-512 of `bytes`, in secure memory.
    static func sha512(_ bytes: SecureBytes) -> SecureBytes {
        let out = SecureBytes(count: iskBytes)
        unsafe out.withUnsafeMutableBytes { o in
            unsafe bytes.withUnsafeBytes { b in
                _ = unsafe crypto_hash_sha512(o.baseAddress!.assumingMemoryBound(to: UInt8.self),
                                              b.baseAddress?.assumingMemoryBound(to: UInt8.self), UInt64(b.count))
            }
        }
        return out
    }

    /// The generator for (`prs`, `ci`, `sid`): calculate_generator, encoded (32 bytes).
    public static func generator(prs: SecureBytes, ci: [UInt8], sid: [UInt8]) -> SecureBytes {
        let hash = sha512(generatorString(prs: prs, ci: ci, sid: sid))
        let g = SecureBytes(count: elementBytes)
        unsafe g.withUnsafeMutableBytes { o in
            unsafe hash.withUnsafeBytes { h in
                _ = unsafe crypto_core_ristretto255_from_hash(o.baseAddress!.assumingMemoryBound(to: UInt8.self),
                                                              h.baseAddress!.assumingMemoryBound(to: UInt8.self))
            }
        }
        hash.wipe()
        return g
    }

    /// A fresh secret scalar (uniform in 1 … order − 1).
    public static func randomScalar() -> SecureBytes {
        let y = SecureBytes(count: scalarBytes)
        unsafe y.withUnsafeMutableBytes { unsafe crypto_core_ristretto255_scalar_random($0.baseAddress!.assumingMemoryBound(to: UInt8.self)) }
        return y
    }

    /// `scalar` · `element` encoded; nil if `element` does not decode or the result is the identity
    /// (the draft's scalar_mult_vfy returning G.I: the run MUST be aborted).
    static func multiply(_ scalar: SecureBytes, _ element: UnsafeRawBufferPointer) -> SecureBytes? {
        guard element.count == elementBytes else { return nil }
        let out = SecureBytes(count: elementBytes)
        let rc = unsafe out.withUnsafeMutableBytes { o in
            unsafe scalar.withUnsafeBytes { s in
                unsafe crypto_scalarmult_ristretto255(o.baseAddress!.assumingMemoryBound(to: UInt8.self),
                                                      s.baseAddress!.assumingMemoryBound(to: UInt8.self),
                                                      element.baseAddress!.assumingMemoryBound(to: UInt8.self))
            }
        }
        guard rc == 0 else { out.wipe(); return nil }
        return out
    }

    /// One party's side of a run: its secret scalar and the message it sends.
    public struct Party: Sendable {
        public let scalar: SecureBytes
        public let message: [UInt8]
        public init(scalar: SecureBytes, message: [UInt8]) {
            self.scalar = scalar
            self.message = message
        }
    }

    /// Starts a run: a scalar (fresh unless given, for vectors) and the message Y = y · g.
    public static func start(prs: SecureBytes, ci: [UInt8], sid: [UInt8], scalar: SecureBytes? = nil) -> Party {
        let g = generator(prs: prs, ci: ci, sid: sid)
        defer { g.wipe() }
        let y = scalar ?? randomScalar()
        // y · g: g comes from from_hash and is never the identity; y is never 0.
        let point = unsafe g.withUnsafeBytes { unsafe multiply(y, $0) }!
        let message = unsafe point.withUnsafeBytes { unsafe Array($0) }
        return Party(scalar: y, message: message)
    }

    /// The intermediate session key of an initiator-responder run:
    /// SHA-512(lv_cat(DSI ‖ "_ISK", sid, K) ‖ lv_cat(Ya, ADa) ‖ lv_cat(Yb, ADb)), K = own scalar · the
    /// peer's message. nil if the peer's message is invalid (abort).
    public static func sessionKey(own: Party, peerMessage: [UInt8], sid: [UInt8], ya: [UInt8], ada: [UInt8], yb: [UInt8], adb: [UInt8]) -> SecureBytes? {
        guard let k = unsafe peerMessage.withUnsafeBytes({ unsafe multiply(own.scalar, $0) }) else { return nil }
        defer { k.wipe() }
        let head = lvCat([dsi + Array("_ISK".utf8), sid])
        let transcript = lvCat([ya, ada]) + lvCat([yb, adb])
        let input = joined([.plain(head), .plain(prependLength(elementBytes)), .secret(k), .plain(transcript)])
        defer { input.wipe() }
        return sha512(input)
    }

    /// A party's key-confirmation tag: HMAC-SHA-512 under SHA-512("CPaceMac" ‖ sid ‖ ISK) over
    /// lv_cat(its message, its associated data).
    public static func confirmationTag(isk: SecureBytes, sid: [UInt8], message: [UInt8], ad: [UInt8]) -> [UInt8] {
        let keyInput = joined([.plain(Array("CPaceMac".utf8) + sid), .secret(isk)])
        let macKey = sha512(keyInput)
        keyInput.wipe()
        defer { macKey.wipe() }
        let body = lvCat([message, ad])
        var tag = [UInt8](repeating: 0, count: tagBytes)
        var state = crypto_auth_hmacsha512_state()
        unsafe macKey.withUnsafeBytes { k in
            _ = unsafe crypto_auth_hmacsha512_init(&state, k.baseAddress!.assumingMemoryBound(to: UInt8.self), k.count)
        }
        _ = unsafe crypto_auth_hmacsha512_update(&state, body, UInt64(body.count))
        _ = unsafe crypto_auth_hmacsha512_final(&state, &tag)
        unsafe sodium_memzero(&state, MemoryLayout<crypto_auth_hmacsha512_state>.size)
        return tag
    }

    /// Compares two tags in constant time.
    public static func tagsEqual(_ a: [UInt8], _ b: [UInt8]) -> Bool {
        guard a.count == b.count, a.count > 0 else { return false }
        return unsafe sodium_memcmp(a, b, a.count) == 0
    }
}

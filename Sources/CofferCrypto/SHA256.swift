import CSodium

/// SHA-256 (`crypto_hash_sha256`): the digest `sha256sum` prints, for pinning executables in
/// signed manifests. Public data only; nothing here is keyed or secret.
public enum SHA256 {
    /// Digest size in bytes (32).
    public static let digestBytes = Int(crypto_hash_sha256_BYTES)

    /// The SHA-256 digest of `bytes` in one call.
    public static func hash(_ bytes: UnsafeRawBufferPointer) -> [UInt8] {
        var h = Hasher()
        unsafe h.update(bytes)
        return h.finalize()
    }

    /// The SHA-256 digest of `bytes` in one call.
    public static func hash(_ bytes: [UInt8]) -> [UInt8] {
        unsafe bytes.withUnsafeBytes { unsafe hash($0) }
    }

    /// Incremental SHA-256 (`crypto_hash_sha256_init` / `_update` / `_final`), for hashing a file
    /// in chunks without holding it in memory.
    public struct Hasher: Sendable {
        private var state = crypto_hash_sha256_state()

        /// A hasher over no bytes yet.
        public init() {
            Sodium.ensureInitialized()
            _ = unsafe crypto_hash_sha256_init(&state)
        }

        /// Feeds `bytes` to the hash.
        public mutating func update(_ bytes: UnsafeRawBufferPointer) {
            guard let base = bytes.baseAddress, bytes.count > 0 else { return }
            _ = unsafe crypto_hash_sha256_update(&state, base.assumingMemoryBound(to: UInt8.self), UInt64(bytes.count))
        }

        /// The digest of everything fed so far. The hasher must not be used afterwards.
        public consuming func finalize() -> [UInt8] {
            var out = [UInt8](repeating: 0, count: SHA256.digestBytes)
            _ = unsafe crypto_hash_sha256_final(&state, &out)
            return out
        }
    }
}

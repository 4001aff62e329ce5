import CofferCrypto
import CofferSSHAgentProtocol
import CofferSSHKeys
import CofferSystem

/// The keys added with `ssh-add`, shared by every ssh-agent connection of the agent, with OpenSSH
/// ssh-agent's semantics: in memory only (they vanish at `ssh-add -D` and when the agent exits), an
/// optional lifetime, and LOCK / UNLOCK with a passphrase.
///
/// Secret key parts live in ``SecureBytes`` inside ``CofferSSHKeys/SSHPrivateKey`` (wiped when a key
/// goes); a FIDO key's handle in ``CofferSSHAgentProtocol/SSHSecurityKeyPrivateKey`` likewise. The lock passphrase is never kept: only its keyed BLAKE2b hash under a random key made at
/// LOCK, compared in constant time (`sodium_memcmp`) at UNLOCK.
package final class SSHAgentKeyStore: Sendable {
    /// One key added with ADD_IDENTITY / ADD_ID_CONSTRAINED.
    package struct Key: Sendable {
        /// What signs: a private key in the agent's memory, or an authenticator through its middleware.
        enum Signer: Sendable {
            /// The private key (wiped when the key goes) and its public half.
            case software(SSHPrivateKey, SSHWirePublicKey)
            /// A FIDO key: its key handle, and the middleware's resolved path (the `sk-provider@openssh.com` constraint).
            case securityKey(SSHSecurityKeyPrivateKey, middleware: String)
        }

        let signer: Signer
        /// The public key blob (how clients name the key: a certificate's, for a certificate key).
        let blob: [UInt8]
        let comment: String
        /// Monotonic seconds at which the key goes (nil: kept until removed or the agent exits).
        let expiresAt: Double?
        /// `ssh-add -c`: each signature asks the person.
        var confirm = false
        /// `ssh-add -h`: the hops the key may be used on (empty: anywhere).
        var destinations: [SSHDestinationConstraint] = []

        /// The fingerprint of the key that signs (a certificate key's: its certified key's).
        package var fingerprint: String {
            switch signer {
            case .software(_, let publicKey): publicKey.fingerprint
            case .securityKey(let key, _): key.publicKey.fingerprint
            }
        }

        /// The signing key's type name (`ssh-ed25519`, `sk-ssh-ed25519@openssh.com`, …).
        var keyType: String {
            switch signer {
            case .software(_, let publicKey): publicKey.keyType
            case .securityKey(let key, _): key.publicKey.keyType
            }
        }

        /// The key as the signature policy sees it.
        var signing: SSHSigningKey {
            SSHSigningKey(blob: blob, fingerprint: fingerprint, keyType: keyType, comment: comment, confirm: confirm,
                          destinations: destinations)
        }
    }

    /// A lock's passphrase, as a keyed hash: `hash = BLAKE2b(key: salt, passphrase)`.
    private struct PassphraseHash: Sendable {
        let salt: SecureBytes
        let hash: SecureBytes

        init(_ passphrase: SecureBytes) {
            salt = SecureBytes.random(count: 32)
            hash = Self.hash(passphrase, salt: salt)
        }

        func matches(_ passphrase: SecureBytes) -> Bool { Self.hash(passphrase, salt: salt).constantTimeEquals(hash) }

        private static func hash(_ passphrase: SecureBytes, salt: SecureBytes) -> SecureBytes {
            salt.withUnsafeBytes { s in passphrase.withUnsafeBytes { p in KeyedHash.deriveKey(key: s, rawParts: [p]) } }
        }
    }

    private struct State: Sendable {
        var keys: [Key] = []
        var lock: PassphraseHash? = nil
    }

    private let state = Protected(State())

    /// What an add did, or why it was refused.
    enum AddOutcome: Equatable {
        case added
        /// A key with this blob was there: its comment and lifetime were replaced (as OpenSSH does).
        case replaced
        case locked
        /// The store holds ``maximumKeys`` already.
        case full
    }

    /// Most keys the store holds: each one's secret takes locked memory the keychain needs too.
    static let maximumKeys = 256

    package init() {}

    /// Adds `key` (or replaces the one with the same public key).
    func add(_ key: Key) -> AddOutcome {
        state.withLock { s in
            guard s.lock == nil else { return .locked }
            if let i = s.keys.firstIndex(where: { $0.blob == key.blob }) {
                s.keys[i] = key
                return .replaced
            }
            guard s.keys.count < Self.maximumKeys else { return .full }
            s.keys.append(key)
            return .added
        }
    }

    /// The keys, for IDENTITIES_ANSWER: none while locked.
    func identities(now: Double = Threads.monotonicSeconds()) -> [Key] {
        state.withLock { s in s.lock == nil ? s.keys.filter { !$0.expired(now) } : [] }
    }

    /// The key with `blob`, unless the store is locked or it expired.
    func key(blob: [UInt8], now: Double = Threads.monotonicSeconds()) -> Key? {
        state.withLock { s in s.lock == nil ? s.keys.first { $0.blob == blob && !$0.expired(now) } : nil }
    }

    /// Removes the key with `blob`; nil if locked or there is none.
    func remove(blob: [UInt8]) -> Key? {
        state.withLock { s in
            guard s.lock == nil, let i = s.keys.firstIndex(where: { $0.blob == blob }) else { return nil }
            return s.keys.remove(at: i)
        }
    }

    /// Removes every key; the number removed, nil if locked.
    func removeAll() -> Int? {
        state.withLock { s in
            guard s.lock == nil else { return nil }
            defer { s.keys.removeAll() }
            return s.keys.count
        }
    }

    /// Locks with `passphrase`; false if already locked.
    func lock(passphrase: SecureBytes) -> Bool {
        state.withLock { s in
            guard s.lock == nil else { return false }
            s.lock = PassphraseHash(passphrase)
            return true
        }
    }

    /// What an UNLOCK did.
    enum UnlockOutcome: Equatable {
        case unlocked
        case notLocked
        /// A wrong passphrase: the `failures`-th in a row, answered after `failures` × ``unlockDelayStep``.
        case wrongPassphrase(failures: Int)
    }

    /// Each wrong passphrase in a row delays its answer by this much more (OpenSSH: 0.1 s steps up to 10 s).
    static let unlockDelayStep = 0.1
    static let maximumCountedUnlockFailures = 100
    /// Wrong passphrases in a row. Held across the delay, so that unlock attempts run one at a time:
    /// guessing over many connections at once is no faster than over one.
    private let unlockFailures = Protected(0)

    /// Unlocks if `passphrase` is the lock's. A wrong one waits before it answers, longer with each
    /// failure in a row, as OpenSSH's ssh-agent does.
    func unlock(passphrase: SecureBytes) -> UnlockOutcome {
        unlockFailures.withLock { failures in
            let outcome: UnlockOutcome? = state.withLock { s in
                guard let lock = s.lock else { return .notLocked }
                guard lock.matches(passphrase) else { return nil }
                s.lock = nil
                return .unlocked
            }
            if let outcome {
                if outcome == .unlocked { failures = 0 }
                return outcome
            }
            failures = min(failures + 1, Self.maximumCountedUnlockFailures)
            Threads.sleep(seconds: Double(failures) * Self.unlockDelayStep)
            return .wrongPassphrase(failures: failures)
        }
    }

    /// Forgets every key and the lock, locked or not (at shutdown).
    package func clear() { state.withLock { $0 = State() } }

    var isLocked: Bool { state.withLock { $0.lock != nil } }

    /// Drops the keys whose lifetime is over (their secrets are wiped as they are freed); returns them.
    @discardableResult
    package func expire(now: Double = Threads.monotonicSeconds()) -> [Key] {
        state.withLock { s in
            let gone = s.keys.filter { $0.expired(now) }
            if !gone.isEmpty { s.keys.removeAll { $0.expired(now) } }
            return gone
        }
    }
}

extension SSHAgentKeyStore.Key {
    func expired(_ now: Double) -> Bool { expiresAt.map { now >= $0 } ?? false }
}

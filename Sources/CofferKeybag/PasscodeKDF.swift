import CofferCrypto
import CofferModel
import Glibc

/// Argon2id cost parameters, stored in the keybag so unlock uses what passcode-set chose.
public struct KDFParameters: Sendable, Equatable {
    /// Passes over memory (Argon2 `t`).
    public var opsLimit: UInt64
    /// Memory in bytes (Argon2 `m`).
    public var memLimit: UInt64

    /// Makes parameters.
    public init(opsLimit: UInt64, memLimit: UInt64) {
        self.opsLimit = opsLimit
        self.memLimit = memLimit
    }

    /// The floor Coffer accepts when reading a keybag (libsodium's INTERACTIVE memory, one pass).
    public static let floorMemory: UInt64 = 64 << 20
}

/// How passcode-set picks Argon2id parameters.
public enum KDFPolicy: Sendable {
    /// Measure this machine: at least `memoryBytes` and enough passes to take at least `minimumMillis`
    /// per derivation (Apple calibrates its passcode derivation to about 80 ms per attempt).
    case calibrated(minimumMillis: Double = 80, memoryBytes: UInt64 = KDFParameters.floorMemory)
    /// Exactly these parameters (tests that exercise other behaviour, or a stronger site policy).
    case fixed(KDFParameters)

    /// The default: at least 80 ms and 64 MiB on this machine.
    public static let standard = KDFPolicy.calibrated()
}

/// The passcode key: Argon2id(passcode, salt) tangled with the device key by keyed BLAKE2b, so the
/// derivation can only run where the device key is.
enum PasscodeKDF {
    static let label = Array("coffer passcode key v1".utf8)

    static func derive(passcode: SecureBytes, salt: [UInt8], parameters p: KDFParameters,
                       deviceKey: SecureBytes) throws(SecError) -> SecureBytes {
        try derive(passcode: passcode, salt: salt, parameters: p, deviceKey: deviceKey, binding: nil).key
    }

    static let tpmAuthLabel = Array("coffer tpm passcode auth v1".utf8)
    static let tpmInputLabel = Array("coffer tpm passcode v1".utf8)
    static let tpmLabel = Array("coffer passcode key v2 tpm".utf8)

    /// The passcode key, bound to a source's counted key when `binding` is given (a TPM device key):
    /// A = Argon2id(passcode, salt); auth seed = BLAKE2b(key: device key, "coffer tpm passcode auth v1" ‖ A);
    /// H = the counted key's HMAC of "coffer tpm passcode v1" ‖ salt under that authorization (a wrong
    /// passcode is refused and counted by the TPM); key = BLAKE2b(key: device key, "coffer passcode key v2 tpm" ‖ A ‖ H).
    /// `binding.blob` nil: a new passcode, for which a new counted key is created (its blob returned).
    /// Without `binding`: BLAKE2b(key: device key, "coffer passcode key v1" ‖ A), as before issue #28.
    static func derive(passcode: SecureBytes, salt: [UInt8], parameters p: KDFParameters, deviceKey: SecureBytes,
                       binding: (source: DeviceKeySource, blob: [UInt8]?)?) throws(SecError) -> (key: SecureBytes, tpmKey: [UInt8]?) {
        let stretched = try stretch(passcode: passcode, salt: salt, parameters: p)
        guard let binding else {
            return (unsafe deviceKey.withUnsafeBytes { dk in
                unsafe stretched.withUnsafeBytes { s in
                    // By pointer: the Argon2id output never leaves secure memory (it is wiped when `stretched` goes).
                    unsafe Self.label.withUnsafeBytes { l in unsafe KeyedHash.deriveKey(key: dk, rawParts: [l, s]) }
                }
            }, nil)
        }
        let auth = unsafe deviceKey.withUnsafeBytes { dk in
            unsafe stretched.withUnsafeBytes { s in unsafe Self.tpmAuthLabel.withUnsafeBytes { l in unsafe KeyedHash.deriveKey(key: dk, rawParts: [l, s]) } }
        }
        var blob: [UInt8]
        if let given = binding.blob { blob = given } else { blob = try binding.source.createPasscodeKey(authorization: auth) }
        let h = try binding.source.passcodeHMAC(blob: blob, input: Self.tpmInputLabel + salt, authorization: auth)
        let key = unsafe deviceKey.withUnsafeBytes { dk in
            unsafe stretched.withUnsafeBytes { s in
                unsafe h.withUnsafeBytes { hb in unsafe Self.tpmLabel.withUnsafeBytes { l in unsafe KeyedHash.deriveKey(key: dk, rawParts: [l, s, hb]) } }
            }
        }
        return (key, blob)
    }

    /// Argon2id(passcode, salt) in secure memory.
    private static func stretch(passcode: SecureBytes, salt: [UInt8], parameters p: KDFParameters) throws(SecError) -> SecureBytes {
        guard passcode.count > 0 else { throw .param("the passcode is empty") }
        let stretched: SecureBytes
        do {
            stretched = unsafe try passcode.withUnsafeBytes { pw throws(CryptoError) in
                unsafe try Argon2id.deriveKey(password: pw, salt: salt, opsLimit: p.opsLimit, memLimit: Int(p.memLimit))
            }
        } catch {
            throw SecError(.allocate, "passcode key derivation failed (Argon2id could not get \(p.memLimit >> 20) MiB)")
        }
        return stretched
    }

    /// Resolves a policy to parameters, timing real derivations on this machine when calibrating.
    static func parameters(for policy: KDFPolicy) throws(SecError) -> KDFParameters {
        switch policy {
        case .fixed(let p): return p
        case .calibrated(let minimumMillis, let memory):
            let probe = SecureBytes.random(count: 16)
            let salt = Random.bytes(Argon2id.saltBytes)
            var ops: UInt64 = 2
            for _ in 0..<8 {
                // This thread's CPU time, not wall time: time spent waiting for a busy CPU must not make
                // the calibration too weak for the same machine when idle. The fastest of three runs.
                var elapsed = Double.infinity
                for _ in 0..<3 {
                    let t0 = threadCPUMillis()
                    do {
                        _ = unsafe try probe.withUnsafeBytes { pw throws(CryptoError) in
                            unsafe try Argon2id.deriveKey(password: pw, salt: salt, opsLimit: ops, memLimit: Int(memory))
                        }
                    } catch {
                        throw SecError(.allocate, "cannot calibrate Argon2id with \(memory >> 20) MiB")
                    }
                    elapsed = Swift.min(elapsed, threadCPUMillis() - t0)
                }
                if elapsed >= minimumMillis { return KDFParameters(opsLimit: ops, memLimit: memory) }
                // Scale passes by the shortfall (with 10% headroom), at least one more pass.
                let scaled = UInt64((Double(ops) * minimumMillis * 1.1 / Swift.max(elapsed, 0.1)).rounded(.up))
                ops = Swift.max(ops + 1, Swift.min(scaled, ops * 8))
            }
            return KDFParameters(opsLimit: ops, memLimit: memory)
        }
    }

    /// CPU time consumed by the calling thread, in milliseconds.
    static func threadCPUMillis() -> Double {
        var ts = timespec()
        unsafe clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts)
        return Double(ts.tv_sec) * 1000 + Double(ts.tv_nsec) / 1_000_000
    }
}

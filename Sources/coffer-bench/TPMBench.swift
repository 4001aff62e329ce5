import CofferCrypto
import CofferKeybag
import CofferKeychain
import CofferModel
import Glibc

/// `coffer-bench tpm TCTI [RUNS]` (issue #28): an unlock of a keychain whose device key is in the TPM
/// at TCTI (Argon2id, then the TPM's HMAC of the passcode-authorized key, then the keybag) beside the
/// same unlock with the file device key (Argon2id and the keybag only), both with the standard
/// calibrated Argon2id (≥ 80 ms, 64 MiB) and the same parameters, each a fresh keychain view per run
/// (what an agent restart does). Median and slowest of RUNS (default 7). The target: TPM ≤ file + 50 ms.
func benchTPM(tcti: String, runs: Int) throws {
    let passcode = secret("bench passcode")
    let fileDir = makeTempDir(), tpmDir = makeTempDir()
    defer { _ = system("rm -rf '\(fileDir)' '\(tpmDir)'") }
    // As the agent has it: one source, its connection kept.
    let source = TPMDeviceKey(path: tpmDir + "/" + Keychain.FileNames.tpmDeviceKey, tcti: tcti, keepsConnection: true)
    let tpmKey = { source }
    let file = try Keychain(directory: fileDir, lockingStateDirectory: false)
    try file.setPasscode(current: nil, new: passcode, kdf: .standard)
    let params = try file.kdfParameters.orThrow()
    let tpm = try Keychain(directory: tpmDir, deviceKey: tpmKey(), lockingStateDirectory: false)
    try tpm.setPasscode(current: nil, new: passcode, kdf: .fixed(params))
    func measure(_ open: () throws -> Keychain) throws -> [UInt64] {
        var out: [UInt64] = []
        for _ in 0..<runs {
            let kc = try open()
            let t0 = nowNanos()
            try kc.unlock(passcode: passcode)
            out.append(nowNanos() - t0)
        }
        return out
    }
    let fileTimes = try measure { try Keychain(directory: fileDir, lockingStateDirectory: false) }
    let tpmTimes = try measure { try Keychain(directory: tpmDir, deviceKey: tpmKey(), lockingStateDirectory: false) }
    func ms(_ xs: [UInt64], _ p: Double) -> String { String(format1: percentile(xs, p) / 1000) }
    print("| unlock (Argon2id t=\(params.opsLimit), \(params.memLimit >> 20) MiB) | median (ms) | slowest (ms) |")
    print("|---|---:|---:|")
    print("| file device key (Argon2id only) | \(ms(fileTimes, 0.5)) | \(ms(fileTimes, 1)) |")
    print("| TPM device key at \(tcti) | \(ms(tpmTimes, 0.5)) | \(ms(tpmTimes, 1)) |")
    print("| TPM − file | \(String(format1: (percentile(tpmTimes, 0.5) - percentile(fileTimes, 0.5)) / 1000)) | |")
}

extension Optional {
    /// The value, or errSecInternalComponent.
    func orThrow() throws -> Wrapped {
        guard let v = self else { throw SecError(.internalComponent, "a value is missing") }
        return v
    }
}

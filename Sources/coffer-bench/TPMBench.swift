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
/// Then, unless ITEMS is 0 (`coffer-bench tpm TCTI RUNS ITEMS`, default 0): a `get` of one item
/// among ITEMS (the target: unchanged, ≤ 1.05×) and a passcode change at ITEMS items (every
/// non-Always item re-sealed), each beside the file device key on the same disk.
func benchTPM(tcti: String, runs: Int, items: Int = 0) throws {
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
    guard items > 0 else { return }
    // The same items in both, nine in ten in passcode classes (re-sealed at a change), as `rekey` has them.
    let classes = ["ak", "ck", "aku", "cku", "ak", "ck", "akpu", "ak", "ck", "dk"]
    for kc in [file, tpm] {
        try kc.unlock(passcode: passcode)
        var i = 0
        while i < items {
            try kc.add(contentsOf: (i..<min(items, i + 5000)).map { k in
                NewItem(itemClass: .genericPassword,
                        attributes: ["svce": .string("service-\(k % 97)"), "acct": .string("account-\(k)"),
                                     "pdmn": .string(classes[k % classes.count])],
                        secret: secret("password-\(k)"))
            }, scope: .unrestricted)
            i += 5000
        }
        kc.checkpoint()
    }
    // get: alternating, so both see the same moment of the machine.
    var fileGets: [UInt64] = [], tpmGets: [UInt64] = []
    for r in 0..<2000 {
        let q = ItemQuery(itemClass: .genericPassword,
                          attributes: ["svce": .string("service-\((r * 7) % items % 97)"), "acct": .string("account-\((r * 7) % items)")],
                          returnData: true)
        for (kc, out) in [(file, 0), (tpm, 1)] {
            let t0 = nowNanos()
            _ = try kc.copyMatching(q, scope: .unrestricted)
            if out == 0 { fileGets.append(nowNanos() - t0) } else { tpmGets.append(nowNanos() - t0) }
        }
    }
    var changes: [UInt64] = []
    for kc in [file, tpm] {
        let t0 = nowNanos()
        try kc.setPasscode(current: passcode, new: secret("bench passcode 2"), kdf: .fixed(params))
        changes.append(nowNanos() - t0)
    }
    let getRatio = percentile(tpmGets, 0.5) / max(percentile(fileGets, 0.5), 1)
    print("")
    print("| at \(grouped(items)) items | file device key | TPM device key | ratio |")
    print("|---|---:|---:|---:|")
    print("| get, median of 2,000 (µs) | \(String(format1: percentile(fileGets, 0.5))) | \(String(format1: percentile(tpmGets, 0.5))) | \(fixed(getRatio, 2))× |")
    print("| passcode change (ms) | \(changes[0] / 1_000_000) | \(changes[1] / 1_000_000) | \(fixed(Double(changes[1]) / Double(max(changes[0], 1)), 2))× |")
}

extension Optional {
    /// The value, or errSecInternalComponent.
    func orThrow() throws -> Wrapped {
        guard let v = self else { throw SecError(.internalComponent, "a value is missing") }
        return v
    }
}

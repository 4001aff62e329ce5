import CofferCrypto
import CofferKeybag
import CofferKeychain
import CofferModel
import Glibc

/// What rollback detection costs (issue #28): the median item add and update with the rollback
/// records kept (the keyed set hash in each write's transaction; NV increments batched by the default
/// 60 s interval, so none during the run) beside the same keychain without detection, and the worst
/// case, an NV increment after every write (`rollback-interval` 0). The three keychains take turns
/// sample by sample, so a disk whose fsync time swings (a shared VM) weighs on all of them alike.
/// Then the first unlock after an open (the check scans every row) with and without. `tcti` reaches
/// the TPM holding the counters (a swtpm: `swtpm socket --tpm2 --server type=tcp,port=2321 --ctrl
/// type=tcp,port=2322 --tpmstate dir=DIR --flags not-need-init,startup-clear`).
func benchRollback(tcti: String, sizes: [Int]) throws {
    print("| items | add without (µs) | add with (µs) | ratio | update without (µs) | update with (µs) | ratio "
          + "| add, NV increment per write (µs) | first unlock without (ms) | first unlock with (ms) |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    let kdf = KDFPolicy.fixed(KDFParameters(opsLimit: 1, memLimit: KDFParameters.floorMemory))
    let passcode = "bench passcode"
    for n in sizes {
        // One counter per keychain (its own NV index); swtpm's state is the bench's own.
        let counters: [(any RollbackCounter)?] = [nil, TPMRollbackCounter(tcti: tcti, index: 0x0100_C100 + UInt32(n % 0xFF)),
                                                  TPMRollbackCounter(tcti: tcti, index: 0x0100_C200 + UInt32(n % 0xFF))]
        let intervals = [60, Keychain.defaultRollbackInterval, 0]
        let dirs = counters.map { _ in makeTempDir() }
        defer { for d in dirs { _ = system("rm -rf '\(d)'") } }
        var adds = [[UInt64]](repeating: [], count: 3), updates = adds, unlocks = adds
        do {
            let kcs = try (0..<3).map { k in
                try Keychain(directory: dirs[k], rollbackCounter: counters[k], rollbackInterval: intervals[k], lockingStateDirectory: false)
            }
            for kc in kcs {
                try kc.setPasscode(current: nil, new: secret(passcode), kdf: kdf)
                var i = 0
                while i < n {
                    let batch = (i..<min(n, i + 5000)).map(item)
                    try kc.add(contentsOf: batch, scope: .unrestricted)
                    i += batch.count
                }
            }
            for s in 0..<500 {
                for (k, kc) in kcs.enumerated() {
                    let t0 = nowNanos()
                    try kc.add(item(n + s), scope: .unrestricted)
                    adds[k].append(nowNanos() - t0)
                }
            }
            for s in 0..<500 {
                let q = ItemQuery(itemClass: .genericPassword, attributes: ["svce": .string("service-\(s % 97)"), "acct": .string("account-\(s)")])
                for (k, kc) in kcs.enumerated() where k < 2 {
                    let t0 = nowNanos()
                    try kc.update(q, ItemChanges(secret: secret("new-\(s)")), scope: .unrestricted)
                    updates[k].append(nowNanos() - t0)
                }
            }
            for kc in kcs { kc.lock(); kc.checkpoint() }
        }
        // The first unlock of a fresh open (an agent start): Argon2id at the minimal parameters above,
        // plus, with detection, the check's scan of every row.
        for _ in 0..<5 {
            for k in 0..<2 {
                let kc = try Keychain(directory: dirs[k], rollbackCounter: counters[k], lockingStateDirectory: false)
                let t0 = nowNanos()
                try kc.unlock(passcode: secret(passcode))
                unlocks[k].append(nowNanos() - t0)
                kc.lock()
            }
        }
        func f(_ x: Double) -> String { String(Int(x.rounded())) }
        func r(_ a: Double, _ b: Double) -> String { String(Double(Int(b / a * 100)) / 100) + "×" }
        let a = adds.map { percentile($0, 0.5) }, u = updates.prefix(2).map { percentile($0, 0.5) }, l = unlocks.prefix(2).map { percentile($0, 0.5) / 1000 }
        print("| \(n) | \(f(a[0])) | \(f(a[1])) | \(r(a[0], a[1])) | \(f(u[0])) | \(f(u[1])) | \(r(u[0], u[1])) | \(f(a[2])) | \(f(l[0])) | \(f(l[1])) |")
    }
}

import CofferCrypto
import CofferKeybag
import CofferKeychain
import CofferModel
import Glibc

/// What rollback detection costs an item write (issue #28): the median add and update with the
/// rollback records kept (the keyed set hash in each write's transaction; NV increments batched by the
/// default 60 s interval, so none during the run) beside the same keychain without detection, and
/// the worst case, an NV increment after every write (`rollback-interval` 0). `tcti` reaches the TPM
/// holding the counter (a swtpm: `swtpm socket --tpm2 --server type=tcp,port=2321 --ctrl
/// type=tcp,port=2322 --tpmstate dir=DIR --flags not-need-init,startup-clear`).
func benchRollback(tcti: String, sizes: [Int]) throws {
    print("| items | add without (µs) | add with (µs) | ratio | update without (µs) | update with (µs) | ratio | add, NV increment per write (µs) |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    let kdf = KDFPolicy.fixed(KDFParameters(opsLimit: 1, memLimit: KDFParameters.floorMemory))
    for n in sizes {
        func measure(_ counter: (any RollbackCounter)?, interval: Double) throws -> (add: Double, update: Double) {
            let dir = makeTempDir()
            defer { _ = system("rm -rf '\(dir)'") }
            let kc = try Keychain(directory: dir, rollbackCounter: counter, rollbackInterval: interval)
            try kc.setPasscode(current: nil, new: secret("bench passcode"), kdf: kdf)
            var i = 0
            while i < n {
                let batch = (i..<min(n, i + 5000)).map(item)
                try kc.add(contentsOf: batch, scope: .unrestricted)
                i += batch.count
            }
            let samples = 500
            var adds: [UInt64] = [], updates: [UInt64] = []
            for s in 0..<samples {
                let t0 = nowNanos()
                try kc.add(item(n + s), scope: .unrestricted)
                adds.append(nowNanos() - t0)
            }
            for s in 0..<samples {
                let q = ItemQuery(itemClass: .genericPassword, attributes: ["svce": .string("service-\(s % 97)"), "acct": .string("account-\(s)")])
                let t0 = nowNanos()
                try kc.update(q, ItemChanges(secret: secret("new-\(s)")), scope: .unrestricted)
                updates.append(nowNanos() - t0)
            }
            return (percentile(adds, 0.5), percentile(updates, 0.5))
        }
        // Each run anchors to its own NV index (one counter per keychain), removed nowhere: swtpm's state is the bench's.
        let without = try measure(nil, interval: 60)
        let with = try measure(TPMRollbackCounter(tcti: tcti, index: 0x0100_C100 + UInt32(n % 0xFF)), interval: Keychain.defaultRollbackInterval)
        let eager = try measure(TPMRollbackCounter(tcti: tcti, index: 0x0100_C200 + UInt32(n % 0xFF)), interval: 0)
        func f(_ x: Double) -> String { String(Int(x.rounded())) }
        func r(_ a: Double, _ b: Double) -> String { String(Double(Int(b / a * 100)) / 100) + "×" }
        print("| \(n) | \(f(without.add)) | \(f(with.add)) | \(r(without.add, with.add)) | \(f(without.update)) | \(f(with.update)) | \(r(without.update, with.update)) | \(f(eager.add)) |")
    }
}

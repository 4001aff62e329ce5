// coffer-bench: benchmarks (not timed tests). Prints Markdown tables.
//
//   coffer-bench keychain [SIZE ...]                 library: median add and copyMatching(svce+acct) per size
//   coffer-bench rekey [SIZE ...]                    library: passcode change (rekey: every non-Always item
//                                                    re-sealed) per keychain size (default 1k, 100k)
//   coffer-bench agent BIN_DIR [SIZE ...]            agent per keychain size (default 1k, 100k, 1M): unlock vs
//                                                    Argon2id, round trip, throughput at 1/4/16/64 clients,
//                                                    CLI process time, cold start, RSS, locked memory
//                                                    (BIN_DIR holds cofferd and coffer)
//   coffer-bench rollback TCTI [SIZE ...]           an item write with rollback detection (the counter in the TPM at
//                                                    TCTI, e.g. a swtpm) vs without, per keychain size (default 1k, 100k)
//   coffer-bench backup [SIZE ...]                   backup create and restore at each size (issue #16)
//   coffer-bench access-control BIN_DIR              what access control costs (issue #14): a protected read inside
//                                                    its reuse window vs a plain read; an evaluation through the plugin host
//   coffer-bench identity BIN_DIR                    what identifying callers costs (issue #13): a signed caller vs
//                                                    `identify-callers = no` (get on a persistent connection, new
//                                                    connection), SHA-256 of a 50 MiB executable cold and cached
//                                                    (BIN_DIR holds cofferd and coffer)
//   coffer-bench ssh BIN_DIR                         cofferd's ssh-agent socket beside OpenSSH's ssh-agent on the same
//                                                    100 Ed25519 keys (issue #27): SIGN_REQUEST round trip, `ssh-add -l`,
//                                                    `ssh -T` to an sshd it starts on 127.0.0.1 (BIN_DIR holds cofferd)
//   coffer-bench tpm TCTI [RUNS]                     unlock with the device key in the TPM at TCTI vs the file key
//                                                    (Argon2id only), same calibrated parameters (issue #28)
//   coffer-bench codec [N] [RUNS]                    a search returning N items' attributes (issue #26's bulk read)
//                                                    split: keychain, reply frame, its decode, the attribute codec
//   coffer-bench fill STATE_DIR N                    adds items svc{i%97}/acct{i}/secret-{i}, i = 1…N, to the
//                                                    stopped agent's keychain (passcode on stdin, if one is set)
//   coffer-bench apple-api BIN_DIR [SIZE ...]        Apple's SecItemCopyMatching (the Security module) vs the native
//                                                    client on a persistent connection per size (default 1k, 10k), and
//                                                    the first call of a process of each (issue #46)
//   coffer-bench apple-api-agent BIN_DIR ITEMS       an agent with ITEMS items for the next two, until stdin ends
//   coffer-bench apple-api-loop apple|native|native-sync SOCKET ITEMS N
//                                                    N lookups of one path (for callgrind: instructions per call)
//   coffer-bench apple-api-unlock SOCKET             unlocks that agent again (restarted under a profiler)
//   coffer-bench stress BIN_DIR load [CLIENTS] [OPS] | hostile [FRAMES] | crash [TRIALS]
//                                                    reliability runs against a real agent
//
// Prints a Markdown table. Build in release: swift build -c release --product coffer-bench.
import CofferCLISupport
import CofferCrypto
import CofferKeybag
import CofferKeychain
import CofferModel
import CofferSystem
import Glibc

func nowNanos() -> UInt64 {
    var ts = timespec()
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return UInt64(ts.tv_sec) * 1_000_000_000 + UInt64(ts.tv_nsec)
}

func percentile(_ xs: [UInt64], _ p: Double) -> Double {
    let s = xs.sorted()
    return Double(s[min(s.count - 1, Int(Double(s.count) * p))]) / 1000
}

func secret(_ s: String) -> SecureBytes { Array(s.utf8).withUnsafeBytes { SecureBytes(copying: $0) } }

func makeTempDir() -> String {
    var template = Array("/tmp/coffer-bench-XXXXXX".utf8CString)
    return template.withUnsafeMutableBufferPointer { String(cString: mkdtemp($0.baseAddress!)!) }
}

func item(_ i: Int) -> NewItem {
    NewItem(itemClass: .genericPassword,
            attributes: ["svce": .string("service-\(i % 97)"), "acct": .string("account-\(i)"), "labl": .string("item \(i)")],
            secret: secret("password-\(i)"))
}

func benchKeychain(sizes: [Int]) throws {
    print("| items | add median (µs) | add p99 (µs) | copyMatching svce+acct median (µs) | p99 (µs) |")
    print("|---:|---:|---:|---:|---:|")
    for n in sizes {
        let dir = makeTempDir()
        defer { _ = system("rm -rf '\(dir)'") }
        let kc = try Keychain(directory: dir)
        var i = 0
        while i < n {
            let batch = (i..<min(n, i + 5000)).map(item)
            try kc.add(contentsOf: batch, scope: .unrestricted)
            i += batch.count
        }
        let samples = 1000
        var adds: [UInt64] = [], gets: [UInt64] = []
        for s in 0..<samples {
            let it = item(n + s)
            let t0 = nowNanos()
            try kc.add(it, scope: .unrestricted)
            adds.append(nowNanos() - t0)
        }
        var rng = SystemRandomNumberGenerator()
        for _ in 0..<samples {
            let k = Int.random(in: 0..<n, using: &rng)
            let q = ItemQuery(itemClass: .genericPassword,
                              attributes: ["svce": .string("service-\(k % 97)"), "acct": .string("account-\(k)")], returnData: true)
            let t0 = nowNanos()
            let r = try kc.copyMatching(q, scope: .unrestricted)
            gets.append(nowNanos() - t0)
            precondition(r.count == 1)
        }
        func f(_ x: Double) -> String { String(Int(x.rounded())) }
        print("| \(n) | \(f(percentile(adds, 0.5))) | \(f(percentile(adds, 0.99))) | \(f(percentile(gets, 0.5))) | \(f(percentile(gets, 0.99))) |")
    }
}

/// The cost of a passcode change: a rekey that re-seals every non-Always item in one transaction.
/// Argon2id runs at fixed minimal parameters (1 pass, 64 MiB) and is timed apart, so the table shows
/// what the item count adds; a real change adds two calibrated derivations (≥ 80 ms each).
func benchRekey(sizes: [Int]) throws {
    print("| items | passcode change (ms) | of which Argon2id ×2 (ms) | re-seal per item (µs) | unlock after (ms) |")
    print("|---:|---:|---:|---:|---:|")
    let kdf = KDFPolicy.fixed(KDFParameters(opsLimit: 1, memLimit: KDFParameters.floorMemory))
    for n in sizes {
        let dir = makeTempDir()
        defer { _ = system("rm -rf '\(dir)'") }
        let kc = try Keychain(directory: dir)
        try kc.setPasscode(current: nil, new: secret("old passcode"), kdf: kdf)
        // Nine in ten items in passcode classes (re-sealed), one in ten Always (left alone).
        let classes = ["ak", "ck", "aku", "cku", "ak", "ck", "akpu", "ak", "ck", "dk"]
        var i = 0
        while i < n {
            let batch = (i..<min(n, i + 5000)).map { k in
                NewItem(itemClass: .genericPassword,
                        attributes: ["svce": .string("service-\(k % 97)"), "acct": .string("account-\(k)"), "labl": .string("item \(k)"),
                                     "pdmn": .string(classes[k % classes.count])],
                        secret: secret("password-\(k)"))
            }
            try kc.add(contentsOf: batch, scope: .unrestricted)
            i += batch.count
        }
        kc.checkpoint()
        let k0 = nowNanos()
        // One derivation with the keybag's parameters (a second, read-only view of the same files).
        _ = try Keybag.openOrCreate(directory: dir, deviceKey: FileDeviceKey(path: dir + "/" + Keychain.FileNames.deviceKey))
            .derivePasscodeKey(secret("old passcode"))
        let argon = Double(nowNanos() - k0) / 1e6 * 2
        let t0 = nowNanos()
        try kc.setPasscode(current: secret("old passcode"), new: secret("new passcode"), kdf: kdf)
        let change = Double(nowNanos() - t0) / 1e6
        let reopened = try Keychain(directory: dir, lockingStateDirectory: false)   // a second view beside kc, in this process
        let u0 = nowNanos()
        try reopened.unlock(passcode: secret("new passcode"))
        let unlock = Double(nowNanos() - u0) / 1e6
        let q = ItemQuery(itemClass: .genericPassword, attributes: ["svce": .string("service-\((n - 1) % 97)"), "acct": .string("account-\(n - 1)")],
                          returnData: true)
        let found = try reopened.copyMatching(q, scope: .unrestricted).count
        precondition(found == 1)
        let resealed = n - n / 10
        func f(_ x: Double) -> String { String(Int(x.rounded())) }
        print("| \(n) | \(f(change)) | \(f(argon)) | \(String(format1: (change - argon) * 1000 / Double(max(resealed, 1)))) | \(f(unlock)) |")
    }
}

extension String {
    /// One decimal place (``CofferCLISupport/DecimalText/fixed(_:_:)``: `-5.4`, never `-5.-4`).
    init(format1 x: Double) { self = DecimalText.fixed(x, 1) }
}

/// Fills a stopped agent's keychain through the library in transactions of 5,000 items (contrib/bench/peers.sh:
/// an agent add is one fsync'd transaction, so 100,000 adds through the agent would take minutes).
/// The items go in the group `coffer add` from an unsigned caller puts them in (`unsigned`): filled
/// in the library's default group (the pre-access-group `coffer.default`), the agent's first unlock
/// migrated every item, and the peers table measured that one-off migration's heap in the agent's RSS
/// (29.7 MiB at 10,000 items instead of 14.4) rather than the steady state a user's agent is in.
/// `item` makes item k (from 1); by default the peers' item (service svc(k % 97), account acct(k)).
func fill(stateDirectory: String, items: Int, item: (Int) -> NewItem = peersItem) throws {
    let kc = try Keychain(directory: stateDirectory, lockingStateDirectory: true)
    if kc.status.passcodeSet {
        var line: [UInt8] = []
        var byte: UInt8 = 0
        while read(0, &byte, 1) == 1 && byte != 0x0A { line.append(byte) }
        try kc.unlock(passcode: SecureBytes(consuming: &line))
    }
    var i = 1
    while i <= items {
        let batch = (i...min(items, i + 4999)).map(item)
        try kc.add(contentsOf: batch, scope: .unrestricted)
        i += batch.count
    }
    kc.checkpoint()
}

/// The item every peer stores in contrib/bench/peers.sh: service svc(k % 97), account acct(k), secret secret-k.
func peersItem(_ k: Int) -> NewItem {
    NewItem(itemClass: .genericPassword, attributes: ["svce": .string("svc\(k % 97)"), "acct": .string("acct\(k)"),
                                                       "agrp": .string("unsigned")],
            secret: secret("secret-\(k)"))
}

let args = Array(CommandLine.arguments.dropFirst())
do {
    try run(args)
} catch {
    StandardStreams.printError("coffer-bench: \(error)")
    exit(1)
}

func run(_ args: [String]) throws {
    switch args.first {
    case "keychain":
        let sizes = args.dropFirst().compactMap { Int($0) }
        try benchKeychain(sizes: sizes.isEmpty ? [1000, 100_000] : sizes)
    case "rollback" where args.count >= 2:
        let sizes = args.dropFirst(2).compactMap { Int($0) }
        try benchRollback(tcti: args[1], sizes: sizes.isEmpty ? [1000, 100_000] : sizes)
    case "backup":
        let sizes = args.dropFirst().compactMap { Int($0) }
        try benchBackup(sizes: sizes.isEmpty ? [1000, 100_000] : sizes)
    case "rekey":
        let sizes = args.dropFirst().compactMap { Int($0) }
        try benchRekey(sizes: sizes.isEmpty ? [1000, 100_000] : sizes)
    case "stress" where args.count >= 3:
        let s = Stress(cofferd: args[1] + "/cofferd")
        let n = args.count > 3 ? Int(args[3]) : nil
        print("| measure | value |")
        print("|---|---:|")
        switch args[2] {
        case "load": try s.load(clients: n ?? 64, ops: args.count > 4 ? Int(args[4]) ?? 10_000 : 10_000)
        case "hostile": try s.hostile(frames: n ?? 10_000)
        case "crash": try s.crash(trials: n ?? 100)
        default: print("unknown stress run \(args[2])"); exit(2)
        }
    case "stress-frames" where args.count == 3:
        // The hostile side of `stress BIN_DIR hostile`, run by it as an unsigned copy of this binary.
        try Stress.sendHostileFrames(socket: args[1], frames: Int(args[2]) ?? 0)
    case "fill" where args.count == 3:
        guard let n = Int(args[2]) else { print("fill: N must be a number"); exit(2) }
        try fill(stateDirectory: args[1], items: n)
    case "fill-secret-service" where args.count == 3:
        guard let n = Int(args[2]) else { print("fill-secret-service: N must be a number"); exit(2) }
        try fill(stateDirectory: args[1], items: n, item: secretServiceItem)
    case "agent" where args.count >= 2:
        let sizes = args.dropFirst(2).compactMap { Int($0) }
        try AgentBench(binDir: args[1], sizes: sizes.isEmpty ? [1000, 100_000, 1_000_000] : sizes).run()
    case "identity" where args.count == 2:
        try IdentityBench(binDir: args[1]).run()
    case "connection" where args.count == 2:
        try ConnectionBench(binDir: args[1]).run()
    case "access-control" where args.count == 2:
        try AccessControlBench(binDir: args[1]).run()
    case "ssh" where args.count == 2:
        try SSHBench(binDir: args[1]).run()
    case "sync":
        try SyncBench(items: args.count > 1 ? Int(args[1]) ?? 10_000 : 10_000).run()
    case "tpm" where args.count >= 2:
        try benchTPM(tcti: args[1], runs: args.count > 2 ? Int(args[2]) ?? 7 : 7, items: args.count > 3 ? Int(args[3]) ?? 0 : 0)
    case "codec":
        try benchCodec(items: args.count > 1 ? Int(args[1]) ?? 1000 : 1000, runs: args.count > 2 ? Int(args[2]) ?? 51 : 51)
    case "identity-probe" where args.count == 2:
        try identityProbe(socket: args[1])
    case "apple-api" where args.count >= 2:
        try AppleAPIBench(binDir: args[1], sizes: args.count > 2 ? args.dropFirst(2).compactMap { Int($0) } : [1000, 10_000]).run()
    case "apple-api-probe" where args.count == 4:
        try appleAPIProbe(mode: args[1], socket: args[2], key: Int(args[3]) ?? 1)
    case "apple-api-agent" where args.count == 3:
        try appleAPIAgent(binDir: args[1], items: Int(args[2]) ?? 1000)
    case "apple-api-unlock" where args.count == 2:
        try appleAPIUnlock(socket: args[1])
    case "apple-api-loop" where args.count == 5:
        try appleAPILoop(mode: args[1], socket: args[2], items: Int(args[3]) ?? 1000, count: Int(args[4]) ?? 1000)
    default:
        print("usage: coffer-bench keychain [SIZE ...] | rekey [SIZE ...] | agent BIN_DIR [SIZE ...] | identity BIN_DIR | apple-api BIN_DIR [SIZE ...] | connection BIN_DIR | access-control BIN_DIR | ssh BIN_DIR | backup [SIZE ...] | sync [N] | codec [N] [RUNS] | tpm TCTI [RUNS] [ITEMS] | fill STATE_DIR N | fill-secret-service STATE_DIR N | stress BIN_DIR load|hostile|crash [N] [OPS]")
        exit(2)
    }
}

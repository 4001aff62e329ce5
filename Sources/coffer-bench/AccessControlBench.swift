import CofferClient
import CofferCrypto
import CofferKeychain
import CofferModel
import CofferProtocol
import CofferSystem
import Glibc

/// What access control costs (issue #14's benchmark), against one real `cofferd` with its plugin host:
/// a read of an item with an access control inside the connection's reuse window, against a read of a
/// plain item of the same size (alternating, same connection); and an evaluation that needs no person
/// (the Test plugin as the biometric sensor answers at once): the plugin-host round trip, seen from a
/// client (LA_EVALUATE: AUTH_NEEDED, the host's evaluation, LA_RESULT) and against a STATUS round trip.
struct AccessControlBench {
    let binDir: String

    /// Answers nothing: the sensor (the Test plugin) answers for the person.
    final class Nobody: AuthenticationDelegate {
        func begin(_ request: AuthenticationRequest) -> Bool { true }
        var inputDescriptor: Int32 { -1 }
        func inputReady() -> AuthenticationAnswer? { nil }
        func feedback(_ text: String, kind: AuthFeedbackKind?) {}
        func end() {}
    }

    func run() throws {
        let tools = AgentBench(binDir: binDir, sizes: [])
        let agent = AgentBench.AgentDirectory(path: makeTempDir())
        defer { _ = system("pkill -TERM -f -- '--state-dir \(agent.state)'; rm -rf '\(agent.path)'") }
        try tools.writePAMStack(agent.pam, passdb: agent.path + "/passdb")
        let plugins = agent.path + "/plugins"
        guard mkdir(plugins, 0o755) == 0 else { throw SecError(.io, "mkdir plugins") }
        let so = "libCofferPluginTest.so"
        guard system("install -m 0644 '\(binDir)/\(so)' '\(plugins)/'") == 0 else { throw SecError(.io, "no \(so) in \(binDir)") }
        let config = agent.path + "/cofferd.conf"
        try tools.writeFile(config, "biometry = test\nplugin-dir = \(plugins)\nplugin-host = \(binDir)/coffer-plugin-host\n")

        // 1,000 plain items, one plain and one user-presence item of the same size, a calibrated passcode.
        try Files.makePrivateDirectory(agent.state)
        do {
            let kc = try Keychain(directory: agent.state, lockingStateDirectory: true)
            try kc.setPasscode(current: nil, new: secret(AgentBench.passcode))
            try kc.add(contentsOf: (0..<1000).map(item), scope: .unrestricted)
            for (service, rule) in [("plain", nil), ("guarded", AccessControl(parsing: "user-presence"))] {
                var attrs: Attributes = ["svce": .string(service), "acct": .string("bench"), "pdmn": .string("aku"), "agrp": .string("unsigned")]
                if let rule { attrs[AccessControl.attributeName] = .data(rule.encoded()) }
                try kc.add(NewItem(itemClass: .genericPassword, attributes: attrs, secret: secret("s3cret-of-the-same-size")), scope: .unrestricted)
            }
            kc.checkpoint()
        }
        sync()
        guard tools.spawn(binDir + "/cofferd", agent.arguments + ["--config", config]) == 0 else { throw SecError(.io, "cofferd did not start") }
        let c = try AgentConnection(path: agent.socket)
        c.authenticationDelegate = Nobody()
        try c.unlock(passcode: secret(AgentBench.passcode))
        try c.setAuthenticationOptions(AuthenticationOptions(passcode: secret(AgentBench.passcode)))
        try c.bio(.enroll, name: "bench")
        // Reuse for the rest of the run: the first read authenticates (the sensor), the others reuse it.
        try c.setAuthenticationOptions(AuthenticationOptions(reuseSeconds: AuthenticationOptions.maximumReuseSeconds))
        let plain = ItemQuery(itemClass: .genericPassword, attributes: ["svce": .string("plain"), "acct": .string("bench")], returnData: true)
        let guarded = ItemQuery(itemClass: .genericPassword, attributes: ["svce": .string("guarded"), "acct": .string("bench")], returnData: true)
        guard try c.copyMatching(guarded).first?.data != nil else { throw SecError(.internalComponent, "the guarded item did not open") }

        progress("access-control bench: reads inside the reuse window")
        var reads: ([UInt64], [UInt64]) = ([], [])
        for block in 0..<210 {
            for (q, isGuarded) in [(guarded, true), (plain, false)] {
                for _ in 0..<100 {
                    let t0 = nowNanos()
                    _ = try c.copyMatching(q)
                    let dt = nowNanos() - t0
                    if block >= 10 { if isGuarded { reads.0.append(dt) } else { reads.1.append(dt) } }
                }
            }
        }
        progress("access-control bench: evaluations that need no person")
        let bare = try AgentConnection(path: agent.socket)
        bare.authenticationDelegate = Nobody()
        var evals: ([UInt64], [UInt64]) = ([], [])
        for i in 0..<1100 {
            var t0 = nowNanos()
            let r = try bare.evaluate(.deviceOwnerAuthenticationWithBiometrics, reason: "benchmark")
            let e = nowNanos() - t0
            guard r.error == nil else { throw SecError(.internalComponent, "evaluation failed: \(r.message)") }
            t0 = nowNanos()
            _ = try bare.status()
            let s = nowNanos() - t0
            if i >= 100 { evals.0.append(e); evals.1.append(s) }
        }

        let g50 = percentile(reads.0, 0.5), p50 = percentile(reads.1, 0.5)
        let e50 = percentile(evals.0, 0.5), s50 = percentile(evals.1, 0.5)
        print("""
            | measure | access control | plain | ratio / difference | target |
            |---|---:|---:|---:|---|
            | `get`, persistent connection, inside the reuse window: median (20,000 each) | \(tools.us(g50)) | \(tools.us(p50)) | \(fixed(g50 / p50, 2))× | ≤ 1.2×: \(g50 <= 1.2 * p50 ? "PASS" : "FAIL") |
            | `get`: p99 | \(tools.us(percentile(reads.0, 0.99))) | \(tools.us(percentile(reads.1, 0.99))) | | |
            | evaluation that needs no person (LA_EVALUATE → plugin host → LA_RESULT) vs STATUS: median (1,000) | \(tools.us(e50)) | \(tools.us(s50)) | +\(tools.us(e50 - s50)) | measured |
            | evaluation: p99 | \(tools.us(percentile(evals.0, 0.99))) | \(tools.us(percentile(evals.1, 0.99))) | | |
            """)
    }
}

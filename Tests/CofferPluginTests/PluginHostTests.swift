import CofferCrypto
import CofferPluginClient
import CofferPluginProtocol
import Foundation
import Testing

/// The real `coffer-plugin-host` process, started by the agent's client, loading plugins by dlopen.
@Suite(.enabled(if: PluginBinaries.available, "coffer-plugin-host and the plugin libraries are not built"), .serialized)
struct PluginHostTests {
    @Test func theCTestPluginLoadsAndEvaluates() throws {
        let box = try PluginSandbox()
        let host = try box.start()
        defer { host.shutdown() }
        #expect(Set(host.plugins.map(\.name)) == ["test", "biometric-emulator"])
        #expect(host.refused.isEmpty)
        let test = try #require(host.plugins.first { $0.name == "test" })
        #expect(test.kind == 1 && test.capabilities == 1 && test.domainState == nil)

        let feedback = LockedList()
        let ok = try host.evaluate(plugin: "test", reason: "read mail password", app: "mail", timeout: 5) { feedback.append($0) }
        #expect(ok.code == .success)
        #expect(feedback.items == ["test plugin: evaluating"]) // FEEDBACK arrives before RESULT

        #expect(try host.control(plugin: "test", command: "fail") == (0, "ok"))
        #expect(try host.evaluate(plugin: "test", reason: "r", app: "a", timeout: 5).code == .authenticationFailed)
        _ = try host.control(plugin: "test", command: "code", arguments: ["-3"])
        #expect(try host.evaluate(plugin: "test", reason: "r", app: "a", timeout: 5).code == .userFallback)
        // A code outside LAError's set is never passed on as-is.
        _ = try host.control(plugin: "test", command: "code", arguments: ["7"])
        #expect(try host.evaluate(plugin: "test", reason: "r", app: "a", timeout: 5).code == .authenticationFailed)
        #expect(try host.control(plugin: "test", command: "bogus").code == 2)
        #expect(throws: PluginHostError.unknownPlugin("nope")) { try host.evaluate(plugin: "nope", reason: "r", app: "a", timeout: 1) }
        #expect(host.starts == 1)
        #expect(box.log.contains("loaded \(box.pluginDir)/test.so as plugin test"))
        #expect(box.log.contains("plugin test [info]: test plugin ready"))
    }

    @Test(.enabled(if: PluginBinaries.haveCC, "no C compiler"))
    func badPluginsAreRefusedWithALogLineAndTheOthersStillLoad() throws {
        let box = try PluginSandbox()
        try box.write((0..<4096).map { _ in UInt8.random(in: 0...255) }, as: "x.so")
        try box.compile("int something(void) { return 1; }\n", as: "nosym.so")
        try box.compile("""
            #include <coffer/coffer_plugin.h>
            static const struct coffer_plugin_v1 t = { .abi_version = 2, .struct_size = sizeof t, .name = "future" };
            const struct coffer_plugin_v1 *coffer_plugin_entry(void) { return &t; }
            """, as: "wrongabi.so")
        try box.compile("""
            #include <coffer/coffer_plugin.h>
            static const struct coffer_plugin_v1 t = { .abi_version = 1, .struct_size = 16, .name = "small" };
            const struct coffer_plugin_v1 *coffer_plugin_entry(void) { return &t; }
            """, as: "small.so")
        try box.install(PluginBinaries.testPlugin, as: "writable.so", mode: 0o666)
        symlink(box.pluginDir + "/test.so", box.pluginDir + "/link.so")
        try box.install(PluginBinaries.testPlugin, as: "again.so") // a second plugin named "test"

        let host = try box.start()
        defer { host.shutdown() }
        #expect(Set(host.plugins.map(\.name)) == ["test", "biometric-emulator"])
        var reasons: [String: String] = [:]
        for r in host.refused { reasons[URL(fileURLWithPath: r.file).lastPathComponent] = r.reason }
        #expect(reasons["x.so"]?.hasPrefix("dlopen failed:") == true)
        #expect(reasons["nosym.so"] == "no coffer_plugin_entry symbol (not a Coffer plugin)")
        #expect(reasons["wrongabi.so"] == "ABI version 2, this host speaks 1")
        #expect(reasons["small.so"]?.hasPrefix("table size 16 is smaller") == true)
        #expect(reasons["writable.so"] == "file is world-writable (mode 0666)")
        #expect(reasons["link.so"] == "is a symbolic link")
        #expect(reasons["again.so"] == "a plugin named test is already loaded" || reasons["test.so"] == "a plugin named test is already loaded")
        // Each refusal is one log line naming the file and the reason.
        for (file, reason) in reasons {
            #expect(box.log.contains("coffer-plugin-host: refused \(box.pluginDir)/\(file): \(reason)"), "no log line for \(file)")
        }
        #expect(try host.evaluate(plugin: "test", reason: "r", app: "a", timeout: 5).code == .success)
    }

    @Test(arguments: [0o777, 0o775] as [mode_t])
    func aPluginDirectoryWritableByOthersIsRefused(mode: mode_t) throws {
        let box = try PluginSandbox()
        chmod(box.pluginDir, mode)
        let host = try box.start()
        defer { host.shutdown() }
        #expect(host.plugins.isEmpty)
        let who = mode & 0o002 != 0 ? "world" : "group"
        #expect(host.refused == [RefusedPlugin(file: box.pluginDir, reason: "plugin directory is \(who)-writable (mode 0\(String(mode, radix: 8)))")])
        #expect(box.log.contains("refused \(box.pluginDir): plugin directory is \(who)-writable"))
    }

    /// A system directory (`--system-dir`) trusts root's files only: a plugin another user owns is
    /// refused there, while the same file in the user's own directory is judged by the usual rules.
    @Test(.enabled(if: getuid() == 0, "needs root to give a file to another user"))
    func aSystemDirectoryTrustsOnlyRootsPlugins() throws {
        let box = try PluginSandbox()
        chown(box.pluginDir + "/test.so", 65534, 65534)
        var config = box.configuration()
        config.systemPluginDirectories = [box.pluginDir]
        config.pluginDirectories = []
        let host = try PluginHost(config)
        defer { host.shutdown() }
        #expect(host.plugins.map(\.name) == ["biometric-emulator"], "\(host.refused)")
        #expect(host.refused.count == 1 && host.refused[0].file.hasSuffix("/test.so") && host.refused[0].reason.contains("65534"),
                "\(host.refused)")
    }

    @Test func aCrashMidEvaluationFailsThatEvaluationAndTheHostRestarts() throws {
        let box = try PluginSandbox()
        let host = try box.start()
        defer { host.shutdown() }
        let firstPID = try #require(host.pid)
        _ = try host.control(plugin: "test", command: "crash")
        #expect(throws: PluginHostError.hostCrashed) { try host.evaluate(plugin: "test", reason: "r", app: "a", timeout: 5) }
        #expect(PluginHostError.hostCrashed.laCode == .systemCancel)
        #expect(try host.evaluate(plugin: "test", reason: "r", app: "a", timeout: 5).code == .success)
        #expect(host.starts == 2)
        #expect(host.pid != firstPID)
    }

    @Test func aHangTimesOutAndTheHostIsKilledAndRestarted() throws {
        let box = try PluginSandbox()
        let host = try box.start(grace: 0.5)
        defer { host.shutdown() }
        let firstPID = try #require(host.pid)
        _ = try host.control(plugin: "test", command: "wedge") // ignores its deadline and cancel()
        let start = Date()
        #expect(throws: PluginHostError.timedOut) { try host.evaluate(plugin: "test", reason: "r", app: "a", timeout: 0.3) }
        #expect(Date().timeIntervalSince(start) < 5)
        #expect(PluginHostError.timedOut.laCode == .systemCancel)
        #expect(kill(firstPID, 0) != 0 || eventually { kill(firstPID, 0) != 0 }, "the hung host was not killed")
        #expect(try host.evaluate(plugin: "test", reason: "r", app: "a", timeout: 5).code == .success)
        #expect(host.starts == 2)
    }

    @Test(arguments: [(CancelReason.user, LACode.userCancel), (.system, .systemCancel)])
    func cancelEndsAWaitingEvaluation(reason: CancelReason, expected: LACode) throws {
        let box = try PluginSandbox()
        let host = try box.start()
        defer { host.shutdown() }
        _ = try host.control(plugin: "test", command: "hang")
        let ticket = host.makeTicket()
        let pending = Background { Result { try host.evaluate(plugin: "test", reason: "r", app: "a", timeout: 20, ticket: ticket) } }
        #expect(eventually { (try? host.control(plugin: "test", command: "status").text.contains("waiting: yes")) == true })
        host.cancel(ticket, reason: reason)
        let result = try #require(pending.join())
        #expect(try result.get().code == expected)
        #expect(host.starts == 1) // a cancel needs no restart
    }

    /// A cancel that comes after the ticket is made but before its evaluation is sent (the agent's
    /// request answered by the passcode while the thread that starts the sensor has not run yet) ends
    /// that evaluation at once, unsent: it never waits in the plugin for a touch that would then be
    /// taken from the next request's evaluation (outside client's check, GAPS.md 4).
    @Test(arguments: [(CancelReason.user, LACode.userCancel), (.system, .systemCancel)])
    func aCancelBeforeTheEvaluationIsSentEndsItUnsent(reason: CancelReason, expected: LACode) throws {
        let box = try PluginSandbox()
        let host = try box.start()
        defer { host.shutdown() }
        _ = try host.control(plugin: "test", command: "hang")
        let ticket = host.makeTicket()
        host.cancel(ticket, reason: reason)
        let trips = host.roundTrips
        let start = Date()
        #expect(try host.evaluate(plugin: "test", reason: "r", app: "a", timeout: 20, ticket: ticket).code == expected)
        #expect(Date().timeIntervalSince(start) < 5, "the evaluation was sent and waited")
        #expect(host.roundTrips == trips, "nothing went to the host")
        #expect(try !host.control(plugin: "test", command: "status").text.contains("waiting: yes"), "the plugin waits for a touch")
        // The next evaluation is not touched by the old cancel.
        let next = host.makeTicket()
        let pending = Background { Result { try host.evaluate(plugin: "test", reason: "r", app: "a", timeout: 20, ticket: next) } }
        #expect(eventually { (try? host.control(plugin: "test", command: "status").text.contains("waiting: yes")) == true })
        host.cancel(next, reason: .system)
        #expect(try pending.join()?.get().code == .systemCancel)
    }

    @Test func oneHangingPluginDoesNotBlockAnother() throws {
        let box = try PluginSandbox()
        let host = try box.start()
        defer { host.shutdown() }
        _ = try host.control(plugin: "test", command: "hang")
        let ticket = host.makeTicket()
        let pending = Background { Result { try host.evaluate(plugin: "test", reason: "r", app: "a", timeout: 20, ticket: ticket) } }
        #expect(eventually { (try? host.control(plugin: "test", command: "status").text.contains("waiting: yes")) == true })
        #expect(try host.evaluate(plugin: "biometric-emulator", reason: "r", app: "a", timeout: 5).code == .biometryNotEnrolled)
        host.cancel(ticket, reason: .system)
        #expect(try pending.join()?.get().code == .systemCancel)
    }

    @Test func theHostIsNotDumpable() throws {
        let box = try PluginSandbox()
        let host = try box.start()
        defer { host.shutdown() }
        let pid = try #require(host.pid)
        // A non-dumpable process's /proc entries belong to root, and it has no core limit.
        let limits = try String(contentsOfFile: "/proc/\(pid)/limits", encoding: .utf8)
        let core = try #require(limits.split(separator: "\n").first { $0.hasPrefix("Max core file size") })
        #expect(core.split(separator: " ", omittingEmptySubsequences: true).dropFirst(4).first == "0")
    }
}

final class LockedList: @unchecked Sendable {
    private let lock = NSLock()
    private var list: [String] = []
    func append(_ s: String) { lock.withLock { list.append(s) } }
    var items: [String] { lock.withLock { list } }
}

import CofferPluginClient
import CofferPluginProtocol
import CofferTestSupport
import Foundation
import Testing

/// Where `swift build` put the host and the plugin libraries (beside this test runner).
enum PluginBinaries {
    static let directory: String = {
        if let exe = try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe") {
            let dir = URL(fileURLWithPath: exe).deletingLastPathComponent().path
            if FileManager.default.isExecutableFile(atPath: dir + "/coffer-plugin-host") { return dir }
        }
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        for config in ["debug", "release"] {
            let dir = root.appendingPathComponent(".build/\(config)").path
            if FileManager.default.isExecutableFile(atPath: dir + "/coffer-plugin-host") { return dir }
        }
        return root.appendingPathComponent(".build/debug").path
    }()
    static var host: String { directory + "/coffer-plugin-host" }
    static var testPlugin: String { directory + "/libCofferPluginTest.so" }
    static var emulator: String { directory + "/libCofferPluginBiometricEmulator.so" }
    static var packageRoot: String {
        URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent().path
    }
    static var available: Bool {
        FileManager.default.isExecutableFile(atPath: host) && FileManager.default.fileExists(atPath: testPlugin)
            && FileManager.default.fileExists(atPath: emulator)
    }
    static var haveCC: Bool { FileManager.default.isExecutableFile(atPath: "/usr/bin/cc") }
}

/// A private plugin directory (0755) holding copies of the built plugins (0644), a state directory
/// and a log file, and the real host started on them.
final class PluginSandbox: @unchecked Sendable {
    let dir = TemporaryDirectory("coffer-plugins")
    var pluginDir: String { dir.file("plugins") }
    var stateDir: String { dir.file("state") }
    var logFile: String { dir.file("host.log") }

    init(plugins: [String: String] = ["test.so": PluginBinaries.testPlugin, "bio.so": PluginBinaries.emulator]) throws {
        try FileManager.default.createDirectory(atPath: pluginDir, withIntermediateDirectories: false)
        chmod(pluginDir, 0o755)
        for (name, source) in plugins { try install(source, as: name) }
    }

    func install(_ source: String, as name: String, mode: mode_t = 0o644) throws {
        let target = pluginDir + "/" + name
        try? FileManager.default.removeItem(atPath: target)
        try FileManager.default.copyItem(atPath: source, toPath: target)
        chmod(target, mode)
    }

    func write(_ bytes: [UInt8], as name: String, mode: mode_t = 0o644) throws {
        let target = pluginDir + "/" + name
        try Data(bytes).write(to: URL(fileURLWithPath: target))
        chmod(target, mode)
    }

    /// Compiles `source` (C, including coffer/coffer_plugin.h) into `name` in the plugin directory.
    func compile(_ source: String, as name: String) throws {
        let c = dir.file(name + ".c")
        try source.write(toFile: c, atomically: true, encoding: .utf8)
        let p = Process()
        p.executableURL = URL(fileURLWithPath: "/usr/bin/cc")
        p.arguments = ["-shared", "-fPIC", "-I", PluginBinaries.packageRoot + "/Sources/CCofferPlugin/include", "-o",
                       pluginDir + "/" + name, c]
        try p.run()
        p.waitUntilExit()
        #expect(p.terminationStatus == 0, "cc failed for \(name)")
        chmod(pluginDir + "/" + name, 0o644)
    }

    func configuration(grace: Double = 2) -> PluginHost.Configuration {
        var c = PluginHost.Configuration(executable: PluginBinaries.host, pluginDirectories: [pluginDir], stateDirectory: stateDir)
        c.logFile = logFile
        c.grace = grace
        return c
    }

    func start(grace: Double = 2) throws -> PluginHost { try PluginHost(configuration(grace: grace)) }

    var log: String { (try? String(contentsOfFile: logFile, encoding: .utf8)) ?? "" }
}

/// Runs `body` on a new thread; `join()` waits for its value.
final class Background<T: Sendable>: @unchecked Sendable {
    private let done = DispatchSemaphore(value: 0)
    private var value: T?
    init(_ body: @escaping @Sendable () -> T) {
        Thread.detachNewThread { [self] in
            value = body()
            done.signal()
        }
    }
    func join(timeout: Double = 30) -> T? {
        guard done.wait(timeout: .now() + timeout) == .success else { return nil }
        return value
    }
}

/// Retries `body` every 20 ms until it returns true or `timeout` passes.
func eventually(timeout: Double = 10, _ body: () -> Bool) -> Bool {
    let end = Date().addingTimeInterval(timeout)
    while Date() < end {
        if body() { return true }
        usleep(20_000)
    }
    return false
}

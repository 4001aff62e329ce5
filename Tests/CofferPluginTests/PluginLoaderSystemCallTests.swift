import CofferPluginHost
import CofferPluginProtocol
import CofferSystem
import Foundation
import Glibc
import Testing

/// Issue #25 (5): the plugin loader examines its directories through CofferSystem (`FileDescriptor`,
/// `Syscall`): a directory that cannot be examined is refused with the reason, never taken for one
/// that passed (an unchecked `fstat` left a zeroed `stat`: owned by root, mode 0, which passes).
@Suite(.serialized, .enabled(if: PluginSyscallFaults.available, "errno injection exists only in debug builds"))
struct PluginLoaderSystemCallTests {
    @Test func aPluginDirectoryThatCannotBeExaminedIsRefused() throws {
        #if DEBUG
        let sandbox = try PluginSandbox(plugins: [:])
        defer { SyscallFaults.clear(path: sandbox.pluginDir) }
        SyscallFaults.inject("fstat", path: sandbox.pluginDir, errno: EIO)
        let result = PluginLoader.load([(sandbox.pluginDir, false)], stateRoot: sandbox.stateDir)
        #expect(result.plugins.isEmpty)
        #expect(result.refused.map(\.file) == [sandbox.pluginDir])
        #expect(result.refused.first?.reason.hasPrefix("plugin directory cannot be examined") == true, "\(result.refused)")

        let examined = PluginLoader.load([(sandbox.pluginDir, false)], stateRoot: sandbox.stateDir)
        #expect(examined.refused.isEmpty && examined.plugins.isEmpty, "an empty private directory passes: \(examined.refused)")
        #endif
    }
}

enum PluginSyscallFaults {
    #if DEBUG
    static let available = true
    #else
    static let available = false
    #endif
}

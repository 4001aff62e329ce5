import CofferPluginClient
import CofferSSHAgentFrontEnd
import CofferSystem

extension SSHSecurityKeySigner {
    /// The agent's: the configured allow-list, and `coffer-plugin-host` where the plugin host is
    /// found (the `plugin-host` key, else beside `cofferd`), logging to `plugin-host.log` in the
    /// state directory as the plugin host does.
    convenience init(configuration: AgentConfiguration) {
        let executable = configuration.pluginHost ?? ThisProcess.executablePath().map { Files.directoryName($0) + "/coffer-plugin-host" }
        self.init(allowedProviders: configuration.sshAllowedProviders,
                  middleware: executable.map { SecurityKeyMiddleware(executable: $0, logFile: configuration.stateDirectory + "/plugin-host.log") },
                  openSSHHelper: OpenSSHSecurityKeyHelper.installed)
    }
}

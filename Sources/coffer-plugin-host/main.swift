import CofferPluginHost
import Glibc

// The plugin host: a process of its own that dlopens authenticator plugins, so that no plugin code
// runs in the agent, which holds the class keys. Started by the agent (CofferPluginClient) with the
// protocol socket on descriptor 3. `--sk-sign` makes it the helper of one FIDO signature instead: it
// loads an OpenSSH FIDO middleware, signs once and exits (the ssh-agent front end starts one per signature).
exit(PluginHostMain.run(Array(CommandLine.arguments.dropFirst())))

// coffer-secret-service-import: what `coffer import secret-service` runs (coffer-cli checks the command
// line and execs this, installed beside it). It links libsystemd's sd-bus, which coffer-cli, a static
// executable, cannot; and it is unsigned, like the libsecret apps that will read what it imports, so
// the items land in the `unsigned` group they see (SecretServiceMapping.md) unless --group says otherwise.
//
// Usage: coffer-secret-service-import [--socket PATH] [--collection NAME] [--group G] [--dry-run]
import CofferCLISupport
import CofferClient
import CofferImport
import CofferModel
import CofferSecretServiceImport
import CofferSystem
import Glibc

var socket: String?, collection: String?, group: String?, dryRun = false
var arguments = CommandLine.arguments.dropFirst()
while let a = arguments.popFirst() {
    switch a {
    case "--dry-run": dryRun = true
    case "--socket", "--collection", "--group":
        guard let v = arguments.popFirst() else { CLISupport.report(.param("\(a) needs a value")); exit(64) }
        if a == "--socket" { socket = v } else if a == "--collection" { collection = v } else { group = v }
    default:
        CLISupport.report(.param("unknown argument '\(TerminalSafeText.escaped(a))' (run it as: coffer import secret-service)"))
        exit(64)
    }
}

var status: Int32 = 0
let reported = CLISupport.reporting { () throws(SecError) in
    let c = CLISupport.connected(try AgentConnection(path: AgentConnection.socketPath(explicit: socket), clientName: "coffer import"))
    let summary = try SecretServiceImport.run(collection: collection, group: group, dryRun: dryRun, on: c)
    StandardStreams.print(summary.totals)
    status = summary.exitStatus
}
exit(reported != 0 ? reported : status)

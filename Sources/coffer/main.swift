// coffer: the command-line client of the Coffer agent, for people and shell scripts.
//
// This executable answers `coffer get` and `coffer add` in their plain forms itself (FastPath)
// and hands every other command line to `coffer-cli`, the full swift-argument-parser interface.
import Glibc

let arguments = Array(CommandLine.arguments.dropFirst())
if let status = FastPath.run(arguments) { exit(status) }
FullCLI.exec(arguments)

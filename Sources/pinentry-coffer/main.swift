// pinentry-coffer: GnuPG's pinentry with a keychain (issue #17), what pinentry-mac's "Save in
// Keychain" gives macOS users. gpg-agent runs it as its `pinentry-program`; it speaks the Assuan
// pinentry protocol on stdin and stdout, answers GETPIN from Coffer when the key's passphrase is
// stored there, and otherwise runs the real pinentry it wraps (Session, Configuration).
import CofferSystem
import Glibc

let configuration = Configuration.load(arguments: Array(CommandLine.arguments.dropFirst()))
if configuration.showHelp {
    StandardStreams.print(Configuration.help)
    exit(0)
}
if configuration.showVersion {
    StandardStreams.print("pinentry-coffer \(Session.version)")
    exit(0)
}
for w in configuration.warnings { StandardStreams.printError("pinentry-coffer: " + w) }
// gpg-agent may go away mid-conversation: a failed write then ends the loop instead of a signal.
signal(SIGPIPE, SIG_IGN)
exit(Session(config: configuration).run())

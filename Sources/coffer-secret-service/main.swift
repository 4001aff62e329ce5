import CofferSecretService
import Glibc

// The Secret Service front end (issue #26): D-Bus parsing stays in this process, never in cofferd,
// which it reaches through CofferClient with each bus sender's delegated identity.
exit(SecretServiceMain.run(Array(CommandLine.arguments.dropFirst())))

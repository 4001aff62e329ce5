import CofferSecretPortal
import Glibc

// The desktop portal's secret backend (issue #26, part 6): D-Bus stays in this process; cofferd
// keeps the per-app secrets, which it hands only to a manifest granting `portal-secret`.
exit(SecretPortalMain.run(Array(CommandLine.arguments.dropFirst())))

import ArgumentParser
import CofferCLISupport
import CofferClient
import CofferCrypto
import CofferModel
import Glibc

/// `coffer device-key migrate --to tpm`: moves the keychain's device key into the TPM (issue #28).
struct DeviceKeyCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "device-key",
        abstract: "The keychain's device key: move it into the machine's TPM 2.0.",
        subcommands: [Migrate.self])

    struct Migrate: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Move the keychain from device.key to the TPM (stop cofferd first; crash-safe: run it again after an interruption).",
            discussion: """
                Runs 'cofferd --migrate-device-key tpm' (the cofferd beside this program) on the state directory: the \
                device key is sealed by the TPM, every passcode-protected item is re-sealed under fresh keys bound to \
                the TPM, and device.key is removed once the new keybag is durable. Then set 'device-key = tpm' (and \
                'tpm-tcti') in cofferd.conf and start cofferd. There is no way back to a file key: make a backup first.
                """)

        @Option(help: "The device key to move to: tpm.") var to: String
        @Option(name: .customLong("state-dir"), help: "State directory (default $XDG_DATA_HOME/coffer).") var stateDir: String?
        @Option(help: "cofferd's configuration file (its tpm-tcti is used).") var config: String?
        @Option(name: .customLong("tpm-tcti"), help: "The TPM's TCTI (default: the configuration's, else device:/dev/tpmrm0).") var tpmTCTI: String?
        @Flag(name: .customLong("no-passcode"), help: "The keychain has no passcode (nothing is asked or read).") var noPasscode = false
        @OptionGroup var passcode: PasscodeSource

        func validate() throws {
            guard to == "tpm" else { throw ValidationError("--to: only 'tpm' (a TPM keychain moves on only through a backup)") }
            if noPasscode && passcode.isGiven { throw ValidationError("--no-passcode takes no --passcode-stdin or --passcode-fd") }
        }

        func run() throws {
            try reporting { () throws(SecError) in
                var args = ["cofferd", "--migrate-device-key", "tpm"]
                if let stateDir { args += ["--state-dir", stateDir] }
                if let config { args += ["--config", config] }
                if let tpmTCTI { args += ["--tpm-tcti", tpmTCTI] }
                // cofferd reads the passcode from its standard input: this one (--passcode-stdin), the
                // descriptor given, or a pipe holding what the person typed; never argv or the environment.
                if noPasscode {
                    let null = open("/dev/null", O_RDONLY)
                    guard null >= 0, dup2(null, 0) == 0 else { throw .io("cannot open /dev/null") }
                } else if let fd = passcode.fd {
                    guard dup2(fd, 0) == 0 else { throw .param("--passcode-fd \(fd) is not an open descriptor") }
                } else if !passcode.stdin {
                    let typed = try passcode.read()
                    var fds: [Int32] = [0, 0]
                    guard pipe(&fds) == 0 else { throw .io("cannot make a pipe: errno \(errno)") }
                    let written = typed.withUnsafeBytes { write(fds[1], $0.baseAddress, $0.count) }
                    close(fds[1])
                    guard written == typed.count, dup2(fds[0], 0) == 0 else { throw .io("cannot hand the passcode to cofferd") }
                    close(fds[0])
                }
                let cofferd = Self.cofferdPath()
                var argv: [UnsafeMutablePointer<CChar>?] = args.map { strdup($0) } + [nil]
                execv(cofferd, &argv)
                throw .notAvailable("cannot run \(cofferd): errno \(errno)")
            }
        }

        /// `cofferd` beside this program (coffer-cli and cofferd are installed together).
        static func cofferdPath() -> String {
            var buffer = [CChar](repeating: 0, count: 4096)
            let n = readlink("/proc/self/exe", &buffer, buffer.count - 1)
            guard n > 0 else { return "/usr/local/bin/cofferd" }
            let exe = String(decoding: buffer[..<n].map { UInt8(bitPattern: $0) }, as: UTF8.self)
            return String(exe[..<(exe.lastIndex(of: "/") ?? exe.startIndex)]) + "/cofferd"
        }
    }
}

import CofferTestSupport
import Foundation
import Testing

/// What the pinentry-coffer tests share: running programs, a scripted fake pinentry that logs every
/// question it is asked, and a temporary GnuPG home whose gpg-agent runs pinentry-coffer.
enum PinentryHarness {
    static var pinentryCoffer: String { Binaries.directory + "/pinentry-coffer" }

    /// gpg, gpg-agent and gpgconf from Debian's gnupg, and the built pinentry-coffer.
    static var gnupgAvailable: Bool {
        ["/usr/bin/gpg", "/usr/bin/gpg-agent", "/usr/bin/gpgconf"].allSatisfy { FileManager.default.isExecutableFile(atPath: $0) }
            && FileManager.default.isExecutableFile(atPath: pinentryCoffer)
    }

    static var built: Bool { FileManager.default.isExecutableFile(atPath: pinentryCoffer) }

    /// Runs `executable ARGS` with `stdin` and no GnuPG or pinentry settings from the runner's
    /// environment; waits at most `timeout` s.
    static func run(_ executable: String, _ args: [String], stdin: String = "", environment: [String: String] = [:],
                    timeout: Double = 60) -> CLIResult {
        runCLI(args, stdin: stdin, environment: environment, executable: executable,
               unset: ["GPG_AGENT_INFO", "COFFER_PINENTRY_WRAPPED", "COFFER_PINENTRY_SAVE", "DISPLAY"], timeout: timeout)
    }

    /// A directory `/tmp/cpg-XXXXXX` (short: gpg-agent's socket lives in it), removed at the end.
    final class ShortDirectory: @unchecked Sendable {
        let path: String
        init() {
            var template = Array("/tmp/cpg-XXXXXX".utf8CString)
            let p = template.withUnsafeMutableBufferPointer { mkdtemp($0.baseAddress!) }
            precondition(p != nil, "mkdtemp failed")
            path = String(cString: p!)
        }
        func file(_ name: String) -> String { path + "/" + name }
        deinit { try? FileManager.default.removeItem(atPath: path) }
    }

    /// A shell-script pinentry: answers GETPIN with the contents of `pin` (or, when the dialog's title
    /// is Coffer, i.e. pinentry-coffer's own passcode prompt, of `passcode`), CONFIRM with `confirm`
    /// (`ok` or anything else: cancel); `cancel` in a file answers with GnuPG's cancel error; `^^` in
    /// an answer starts another D line, as a pinentry splits a long one. Each
    /// GETPIN and CONFIRM is logged to `asked.log` (`GETPIN`, ` error` if a SETERROR came first,
    /// ` title=…`), so a test can count how often the person was asked. A CONFIRM's description
    /// (Assuan-escaped) also goes to `confirm-desc.log`; `hang` in `confirm` leaves the CONFIRM
    /// unanswered (its pid in `hung.pid`) until the pinentry is stopped, as `hang` in `pin` or
    /// `passcode` does a GETPIN.
    final class FakePinentry: @unchecked Sendable {
        let dir: ShortDirectory
        var path: String { dir.file("fake-pinentry") }
        var logPath: String { dir.file("asked.log") }

        init(in dir: ShortDirectory, pin: String = "cancel", passcode: String = "cancel", confirm: String = "ok") throws {
            self.dir = dir
            try writeExecutable("""
                #!/bin/sh
                D='\(dir.path)'
                echo "$DISPLAY" >> "$D/display.log"
                echo "OK fake pinentry"
                err=""
                title=""
                while IFS= read -r line; do
                  case "$line" in
                    SETERROR\\ ?*) err=" error";;
                    SETTITLE\\ *) title="${line#SETTITLE }";;
                    SETDESC\\ *) desc="${line#SETDESC }";;
                    RESET*) err=""; title="";;
                  esac
                  case "$line" in
                    GETPIN*)
                      echo "GETPIN$err title=$title" >> "$D/asked.log"
                      if [ "$title" = "Coffer" ]; then answer=$(cat "$D/passcode"); else answer=$(cat "$D/pin"); fi
                      err=""
                      case "$answer" in
                        cancel) echo "ERR 83886179 Operation cancelled <Pinentry>";;
                        hang) echo $$ > "$D/hung.pid"; exec sleep 600;;
                        inquire:*)
                          # Ask gpg-agent (through pinentry-coffer) for the quality of what was typed, log its answer.
                          echo "INQUIRE QUALITY ${answer#inquire:}"
                          while IFS= read -r reply; do
                            echo "inquiry reply: $reply" >> "$D/asked.log"
                            [ "$reply" = "END" ] && break
                          done
                          echo "S SOME_STATUS"; echo "D ${answer#inquire:}"; echo "OK";;
                        *) printf '%s\\n' "$answer" | sed 's/\\^\\^/\\nD /g; s/^/D /'; echo "OK";;
                      esac;;
                    CONFIRM*)
                      echo "CONFIRM title=$title" >> "$D/asked.log"
                      echo "$desc" >> "$D/confirm-desc.log"
                      err=""
                      if [ "$(cat "$D/confirm")" = "hang" ]; then echo $$ > "$D/hung.pid"; exec sleep 600; fi
                      if [ "$(cat "$D/confirm")" = "ok" ]; then echo "OK"; else echo "ERR 83886179 Operation cancelled <Pinentry>"; fi;;
                    GETINFO\\ flavor) echo "D fake"; echo "OK";;
                    BYE*) echo "OK closing connection"; exit 0;;
                    *) echo "OK";;
                  esac
                done

                """, to: path)
            try set(pin: pin, passcode: passcode, confirm: confirm)
        }

        /// The answers (already Assuan-escaped) for the next questions.
        func set(pin: String? = nil, passcode: String? = nil, confirm: String? = nil) throws {
            if let pin { try pin.write(toFile: dir.file("pin"), atomically: true, encoding: .utf8) }
            if let passcode { try passcode.write(toFile: dir.file("passcode"), atomically: true, encoding: .utf8) }
            if let confirm { try confirm.write(toFile: dir.file("confirm"), atomically: true, encoding: .utf8) }
        }

        /// The `DISPLAY` each run of this pinentry had, in order.
        func displays() -> [String] {
            ((try? String(contentsOfFile: dir.file("display.log"), encoding: .utf8)) ?? "").split(separator: "\n", omittingEmptySubsequences: false)
                .dropLast().map(String.init)
        }

        /// Waits (at most `seconds`) until a question starting with `prefix` has been asked, without
        /// forgetting any; false if none came.
        func waitForQuestion(_ prefix: String, within seconds: Double = 60) -> Bool {
            let deadline = Date().addingTimeInterval(seconds)
            while Date() < deadline {
                let text = (try? String(contentsOfFile: logPath, encoding: .utf8)) ?? ""
                if text.split(separator: "\n").contains(where: { $0.hasPrefix(prefix) }) { return true }
                usleep(20_000)
            }
            return false
        }

        /// The questions asked so far (one line each).
        var questions: [String] {
            ((try? String(contentsOfFile: logPath, encoding: .utf8)) ?? "").split(separator: "\n").map(String.init)
        }

        /// How many PINs (passcode dialogs) were asked for so far.
        var pinsAsked: Int { questions.filter { $0.hasPrefix("GETPIN") }.count }

        /// The questions asked so far (one line each), and forgets them.
        func takeQuestions() -> [String] {
            let asked = questions
            try? FileManager.default.removeItem(atPath: logPath)
            return asked
        }
    }

    /// A temporary GNUPGHOME whose gpg-agent (no passphrase cache) runs pinentry-coffer, through a
    /// wrapper script, against `agent` with the fake pinentry wrapped, and holds one
    /// passphrase-protected signing key.
    final class GnuPGHome: @unchecked Sendable {
        let dir = ShortDirectory()
        let fake: FakePinentry
        let agent: AgentProcess
        var home: String { dir.file("g") }
        var configPath: String { dir.file("pinentry.conf") }
        static let passphrase = "gpg pass 1"
        static let userID = "Coffer Test <pinentry@example.org>"
        private(set) var keygrip = ""
        var cacheID: String { "n/" + keygrip }

        init(agent: AgentProcess, save: String) throws {
            self.agent = agent
            fake = try FakePinentry(in: dir)
            mkdir(home, 0o700)
            let wrapper = dir.file("pinentry-wrapper")
            try writeExecutable("""
                #!/bin/sh
                exec '\(PinentryHarness.pinentryCoffer)' --socket '\(agent.socketPath)' --pinentry '\(fake.path)' --config '\(configPath)' "$@"

                """, to: wrapper)
            try setSave(save)
            let conf = """
                pinentry-program \(wrapper)
                log-file \(dir.file("gpg-agent.log"))
                debug-pinentry
                debug ipc

                """
            // The key is made by an agent that may cache: generation signs the new key right after
            // protecting it, with the passphrase the agent just cached. Under `max-cache-ttl 0` that
            // entry can expire in between on a loaded machine (a CI run: "signing failed: Corrupted
            // protection"); the no-cache configuration the tests need comes after, with a new agent.
            try conf.write(toFile: home + "/gpg-agent.conf", atomically: true, encoding: .utf8)
            let gen = gpg(["--batch", "--pinentry-mode", "loopback", "--passphrase-fd", "0", "--quick-gen-key", Self.userID,
                           "ed25519", "sign", "never"], stdin: Self.passphrase + "\n")
            guard gen.status == 0 else { throw Failure("gpg --quick-gen-key: \(gen)") }
            try (conf + "default-cache-ttl 0\nmax-cache-ttl 0\n").write(toFile: home + "/gpg-agent.conf", atomically: true, encoding: .utf8)
            let list = gpg(["--batch", "--with-colons", "--with-keygrip", "-K"])
            guard let grp = list.stdout.split(separator: "\n").first(where: { $0.hasPrefix("grp:") }) else {
                throw Failure("no keygrip in \(list)")
            }
            keygrip = String(grp.split(separator: ":", omittingEmptySubsequences: false)[9])
            restartAgent()
        }

        deinit { restartAgent() }

        /// `save = MODE` in pinentry.conf (read by each new pinentry-coffer).
        func setSave(_ mode: String) throws {
            try "# pinentry-coffer test\nsave = \(mode)\n".write(toFile: configPath, atomically: true, encoding: .utf8)
        }

        func gpg(_ args: [String], stdin: String = "") -> CLIResult {
            PinentryHarness.run("/usr/bin/gpg", ["--homedir", home] + args, stdin: stdin, environment: ["GNUPGHOME": home])
        }

        /// Ends gpg-agent (and with it anything it remembers); the next gpg starts a new one.
        func restartAgent() {
            _ = PinentryHarness.run("/usr/bin/gpgconf", ["--kill", "gpg-agent"], environment: ["GNUPGHOME": home])
        }

        /// Signs a line with the key (gpg-agent asks pinentry-coffer for the passphrase).
        func sign() -> CLIResult {
            restartAgent()
            // Never --output /dev/null: gpg removes its output file when signing fails (as root, /dev/null itself).
            return gpg(["--batch", "--yes", "--local-user", "pinentry@example.org", "--sign", "--output", dir.file("out.gpg")], stdin: "hello\n")
        }

        /// gpg-agent's log (its conversations with the pinentry).
        var agentLog: String { (try? String(contentsOfFile: dir.file("gpg-agent.log"), encoding: .utf8)) ?? "" }

        /// The stored passphrase, through the `coffer` CLI (nil if there is none).
        func stored() -> String? {
            let r = agent.cli(["get", "--service", "gnupg", "--account", cacheID])
            return r.status == 0 ? r.stdout : nil
        }
    }

    struct Failure: Error, CustomStringConvertible {
        let description: String
        init(_ d: String) { description = d }
    }
}

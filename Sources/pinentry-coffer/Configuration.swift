import CofferClient
import CofferSystem
import Glibc

/// What pinentry-coffer does, from (first match wins) its arguments, the environment, the
/// configuration file, and the defaults:
///
/// | setting | argument | environment | `pinentry.conf` | default |
/// |---|---|---|---|---|
/// | the pinentry it wraps | `--pinentry PROGRAM` | `COFFER_PINENTRY_WRAPPED` | `pinentry = PROGRAM` | `/usr/bin/pinentry-curses`, else `/usr/bin/pinentry-tty` |
/// | saving a typed passphrase | `--save ask\|always\|never` | `COFFER_PINENTRY_SAVE` | `save = …` | `ask` |
/// | the agent's socket | `--socket PATH` | `COFFER_SOCKET`, `XDG_RUNTIME_DIR` | — | `$XDG_RUNTIME_DIR/coffer/agent.sock` |
///
/// The file is `--config FILE`, else `$XDG_CONFIG_HOME/coffer/pinentry.conf` (`~/.config/…`):
/// `key = value` lines, `#` comments. Every other argument (gpg-agent passes `--display`,
/// `--ttyname`, `--ttytype`, `--lc-ctype`, `--lc-messages`, …) goes to the wrapped pinentry as is.
struct Configuration {
    enum Save: String {
        case ask, always, never
    }

    var wrapped: String?
    var wrappedArguments: [String] = []
    var save: Save = .ask
    var socket: String?
    var configFile: String?
    var showVersion = false
    var showHelp = false
    /// Problems to report on standard error (a bad value falls back to the default).
    var warnings: [String] = []

    static let defaultPinentries = ["/usr/bin/pinentry-curses", "/usr/bin/pinentry-tty"]

    static func load(arguments: [String]) -> Configuration {
        var c = Configuration()
        var argPinentry: String?
        var argSave: String?
        var i = 0
        let own = ["--pinentry", "--save", "--socket", "--config"]
        var arguments = arguments
        // `--option=value` spellings of this program's own options.
        arguments = arguments.flatMap { a -> [String] in
            guard let eq = a.firstIndex(of: "="), own.contains(String(a[..<eq])) else { return [a] }
            return [String(a[..<eq]), String(a[a.index(after: eq)...])]
        }
        while i < arguments.count {
            let a = arguments[i]
            let value: String? = i + 1 < arguments.count ? arguments[i + 1] : nil
            switch a {
            case "--pinentry", "--save", "--socket", "--config":
                guard let value else { c.warnings.append("\(a) needs a value"); i += 1; continue }
                switch a {
                case "--pinentry": argPinentry = value
                case "--save": argSave = value
                case "--socket": c.socket = value
                default: c.configFile = value
                }
                i += 2
            case "--version": c.showVersion = true; i += 1
            case "--help", "-h": c.showHelp = true; i += 1
            default:
                c.wrappedArguments.append(a)
                i += 1
            }
        }
        let env = ThisProcess.environment(["COFFER_PINENTRY_WRAPPED", "COFFER_PINENTRY_SAVE", "XDG_CONFIG_HOME", "HOME"])
        let file = c.configFile ?? Self.defaultConfigFile(env)
        let fileSettings = file.map { Self.readConfig($0, explicit: c.configFile != nil, warnings: &c.warnings) } ?? [:]

        c.wrapped = argPinentry ?? env["COFFER_PINENTRY_WRAPPED"].flatMap { $0.isEmpty ? nil : $0 } ?? fileSettings["pinentry"]
            ?? Self.defaultPinentries.first { access($0, X_OK) == 0 }
        if let w = c.wrapped, !w.hasPrefix("/") {
            c.warnings.append("the wrapped pinentry must be an absolute path")
            c.wrapped = nil
        }
        if let w = c.wrapped, Self.isThisProgram(w) {
            // (/usr/bin/pinentry pointing here through alternatives, say): each copy would start the
            // next at the first GETPIN it cannot answer, without end.
            c.warnings.append("the wrapped pinentry \(w) is pinentry-coffer itself: set pinentry = a real pinentry (pinentry-curses, pinentry-gnome3)")
            c.wrapped = nil
        }
        if let s = argSave ?? env["COFFER_PINENTRY_SAVE"].flatMap({ $0.isEmpty ? nil : $0 }) ?? fileSettings["save"] {
            if let v = Save(rawValue: s) { c.save = v } else { c.warnings.append("save must be ask, always or never") }
        }
        return c
    }

    /// True if `path` resolves (through every symbolic link) to the file this process runs.
    static func isThisProgram(_ path: String) -> Bool {
        guard let target = realpath(path, nil) else { return false }
        defer { free(target) }
        guard let me = realpath("/proc/self/exe", nil) else { return false }
        defer { free(me) }
        var a = stat(), b = stat()
        guard stat(target, &a) == 0, stat(me, &b) == 0 else { return strcmp(target, me) == 0 }
        return a.st_dev == b.st_dev && a.st_ino == b.st_ino
    }

    static func defaultConfigFile(_ env: [String: String]) -> String? {
        if let x = env["XDG_CONFIG_HOME"], x.hasPrefix("/") { return x + "/coffer/pinentry.conf" }
        if let h = env["HOME"], h.hasPrefix("/") { return h + "/.config/coffer/pinentry.conf" }
        return nil
    }

    /// `key = value` lines; unknown keys are reported. A missing default file is no error.
    static func readConfig(_ path: String, explicit: Bool, warnings: inout [String]) -> [String: String] {
        guard let bytes = try? Files.read(path, maxBytes: 64 << 10) else {
            if explicit || Files.exists(path) { warnings.append("cannot read \(path)") }
            return [:]
        }
        var out: [String: String] = [:]
        for (n, raw) in String(decoding: bytes, as: UTF8.self).split(separator: "\n", omittingEmptySubsequences: false).enumerated() {
            let line = raw.trimmingSpaces()
            if line.isEmpty || line.hasPrefix("#") { continue }
            guard let eq = line.firstIndex(of: "=") else { warnings.append("\(path):\(n + 1): expected key = value"); continue }
            let key = line[..<eq].trimmingSpaces(), value = line[line.index(after: eq)...].trimmingSpaces()
            guard key == "pinentry" || key == "save" else { warnings.append("\(path):\(n + 1): unknown key \(key)"); continue }
            out[key] = value
        }
        return out
    }

    static let help = """
        Usage: pinentry-coffer [--pinentry PROGRAM] [--save ask|always|never] [--socket PATH] [--config FILE] [PINENTRY-OPTIONS…]

        GnuPG's pinentry with a keychain: set `pinentry-program /usr/bin/pinentry-coffer` in gpg-agent.conf.
        A passphrase saved in Coffer (service gnupg, account = gpg-agent's cache id, e.g. n/KEYGRIP) is
        answered without asking; otherwise the wrapped pinentry asks, and the passphrase is saved
        (save = ask: after a confirmation). Other options go to the wrapped pinentry.
        """
}

extension StringProtocol {
    func trimmingSpaces() -> String {
        String(drop { $0 == " " || $0 == "\t" || $0 == "\r" }.reversed().drop { $0 == " " || $0 == "\t" || $0 == "\r" }.reversed())
    }
}

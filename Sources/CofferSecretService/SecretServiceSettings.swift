import CofferSystem
import Glibc

/// What `coffer-secret-service` is configured with: `key = value` lines (`#` comments) in
/// `$XDG_CONFIG_HOME/coffer/secret-service.conf` (else `~/.config/coffer/secret-service.conf`) when
/// that file exists, or in the file `--config` names. Keys: `plain-sessions`.
public struct SecretServiceSettings: Sendable, Equatable {
    /// Whether OpenSession serves the `plain` algorithm (config key `plain-sessions`: `allow`, or
    /// `deny`, the default). A `plain` session's secrets cross the bus as they are, readable by any
    /// unconfined client of the session bus that monitors it (`dbus-monitor`): refused unless the
    /// person says otherwise, with `org.freedesktop.DBus.Error.NotSupported` naming this setting.
    /// libsecret, python3-secretstorage and Chromium negotiate `dh-ietf1024-sha256-aes128-cbc-pkcs7`.
    public var allowsPlainSessions = false
    /// The file these came from, or would have (the default path when there is none): named in the
    /// refusal of a `plain` session.
    public var source: String

    /// The setting's key, as a refusal names it.
    public static let plainSessionsKey = "plain-sessions"

    public init(source: String) { self.source = source }

    /// A configuration file's problem: the file and line, and what is wrong (never more of the line).
    public struct Problem: Error, CustomStringConvertible, Sendable {
        public let description: String
    }

    /// The default configuration file: `$XDG_CONFIG_HOME/coffer/secret-service.conf`, else
    /// `$HOME/.config/coffer/secret-service.conf`, else the password database's home directory's.
    public static func defaultPath() -> String {
        let env = { (k: String) in getenv(k).map { String(cString: $0) }.flatMap { $0.isEmpty ? nil : $0 } }
        if let config = env("XDG_CONFIG_HOME") { return config + "/coffer/secret-service.conf" }
        let home = env("HOME") ?? getpwuid(getuid()).flatMap { $0.pointee.pw_dir.map { String(cString: $0) } } ?? ""
        return home + "/.config/coffer/secret-service.conf"
    }

    /// The settings in the file at `path`; the defaults when `path` does not exist and `required` is
    /// false (the default file is optional, a `--config` file is not).
    public static func load(path: String, required: Bool) throws(Problem) -> SecretServiceSettings {
        guard required || Files.exists(path) else { return SecretServiceSettings(source: path) }
        let bytes: [UInt8]
        do { bytes = try Files.read(path, maxBytes: 64 * 1024) } catch { throw Problem(description: "\(path): \(error)") }
        return try parse(String(decoding: bytes, as: UTF8.self), source: path)
    }

    /// The settings in `text` (a configuration file's contents; `source` names it in errors).
    public static func parse(_ text: String, source: String) throws(Problem) -> SecretServiceSettings {
        var settings = SecretServiceSettings(source: source)
        for (n, raw) in text.split(separator: "\n", omittingEmptySubsequences: false).enumerated() {
            let line = raw.split(separator: "#", maxSplits: 1, omittingEmptySubsequences: false).first.map(String.init) ?? ""
            let trimmed = line.trimmedBlanks()
            if trimmed.isEmpty { continue }
            guard let eq = trimmed.firstIndex(of: "=") else { throw Problem(description: "\(source):\(n + 1): expected key = value") }
            let key = String(trimmed[..<eq]).trimmedBlanks(), value = String(trimmed[trimmed.index(after: eq)...]).trimmedBlanks()
            switch key {
            case plainSessionsKey:
                switch value {
                case "allow": settings.allowsPlainSessions = true
                case "deny": settings.allowsPlainSessions = false
                default: throw Problem(description: "\(source):\(n + 1): '\(plainSessionsKey)' is 'allow' or 'deny'")
                }
            default:
                throw Problem(description: "\(source):\(n + 1): unknown key '\(key)'")
            }
        }
        return settings
    }
}

extension String {
    /// Without leading and trailing spaces, tabs and carriage returns.
    fileprivate func trimmedBlanks() -> String {
        var s = Substring(self)
        while let f = s.first, f == " " || f == "\t" || f == "\r" { s.removeFirst() }
        while let l = s.last, l == " " || l == "\t" || l == "\r" { s.removeLast() }
        return String(s)
    }
}

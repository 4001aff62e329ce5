import CofferSystem

/// The trust store's keys in cofferd.conf (cofferd(8)): `user-trusted-keys`, `standard-trust-dirs`,
/// `trusted-keys-dir` and `manifests-dir` (repeatable). One reader for the agent and for
/// `coffer manifest list`, so the CLI lists exactly the directories the agent reads.
package struct TrustSettings: Sendable, Equatable {
    /// Also trust signer keys in `$XDG_CONFIG_HOME/coffer/trusted-keys.d`: off by default, since any
    /// process of the user can write there.
    package var allowUserTrustedKeys = false
    /// Read `/etc/coffer/…` and `$XDG_DATA_HOME/coffer/manifests.d` (tests turn it off and list their own).
    package var standardTrustDirectories = true
    /// More directories of trusted keys.
    package var extraKeyDirectories: [String] = []
    /// More directories of manifests.
    package var extraManifestDirectories: [String] = []

    package init() {}

    /// The keys this type takes.
    package static let keys = ["user-trusted-keys", "standard-trust-dirs", "trusted-keys-dir", "manifests-dir"]

    /// Applies `key = value`; false for a key that is not one of ``keys``; a message for a bad value.
    package mutating func apply(key: String, value: String) -> Result<Bool, Invalid> {
        func yesNo() -> Bool? {
            switch value {
            case "yes", "true", "1": true
            case "no", "false", "0": false
            default: nil
            }
        }
        switch key {
        case "user-trusted-keys", "standard-trust-dirs":
            guard let v = yesNo() else { return .failure(Invalid("'\(key)' is 'yes' or 'no'")) }
            if key == "user-trusted-keys" { allowUserTrustedKeys = v } else { standardTrustDirectories = v }
        case "trusted-keys-dir", "manifests-dir":
            guard value.hasPrefix("/") else { return .failure(Invalid("'\(key)' needs an absolute path")) }
            if key == "trusted-keys-dir" { extraKeyDirectories.append(value) } else { extraManifestDirectories.append(value) }
        default:
            return .success(false)
        }
        return .success(true)
    }

    /// Why a value was refused (the caller adds the file and line).
    package struct Invalid: Error, Sendable {
        package let message: String
        init(_ m: String) { message = m }
    }

    /// The trust keys of a cofferd.conf text, every other line ignored (`#` comments, `key = value`).
    package static func read(configFile text: String) -> TrustSettings {
        var s = TrustSettings()
        for raw in text.split(separator: "\n", omittingEmptySubsequences: false) {
            let line = raw.split(separator: "#", maxSplits: 1, omittingEmptySubsequences: false).first.map(String.init) ?? ""
            guard let eq = line.firstIndex(of: "=") else { continue }
            let key = line[..<eq].trimmingSpace(), value = line[line.index(after: eq)...].trimmingSpace()
            _ = s.apply(key: key, value: value)
        }
        return s
    }

    /// Where the trust store looks under these settings.
    package var configuration: TrustConfiguration {
        if standardTrustDirectories {
            return .standard(allowUserKeys: allowUserTrustedKeys, extraKeyDirectories: extraKeyDirectories,
                             extraManifestDirectories: extraManifestDirectories)
        }
        return TrustConfiguration(keyDirectories: extraKeyDirectories.map { TrustDirectory($0) },
                                  manifestDirectories: extraManifestDirectories.map { TrustDirectory($0) })
    }
}

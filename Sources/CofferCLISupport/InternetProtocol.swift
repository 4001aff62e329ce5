/// Protocol names as people and git write them, and the `ptcl` codes the keychain keeps.
///
/// Apple's `kSecAttrProtocol…` values are four-character codes; where one differs from the URL
/// scheme (`https` is `htps`, `imaps` `imps`, `pop3s` `pops`, `ldaps` `ldps`), Coffer stores the
/// code, as macOS's git-credential-osxkeychain does. Every place a person types a protocol
/// (`--protocol`, `coffer-inet://…?protocol=`) and git-credential-coffer go through this one mapping,
/// so an item git stored is found by `--protocol https` and by `?protocol=https` alike; a code
/// (`htps`) is taken as it is. `--attr ptcl=…` sets the raw value.
package enum InternetProtocol {
    /// The `ptcl` value for a scheme name; other names are kept as they are.
    package static func keychainCode(_ name: String) -> String {
        switch name {
        case "https": "htps"
        case "imaps": "imps"
        case "pop3s": "pops"
        case "ldaps": "ldps"
        default: name
        }
    }
}

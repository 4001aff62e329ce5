import ArgumentParser
import CofferCLISupport
import CofferClient
import CofferCrypto
import CofferModel
import CofferProtocol
import CofferSSHAgentProtocol
import CofferSystem
import Glibc

/// `coffer ssh`: SSH keys kept as keychain items, which cofferd's ssh-agent socket signs with.
struct SSHCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "ssh",
        abstract: "SSH keys kept in the keychain; cofferd's ssh-agent socket signs with them.",
        discussion: """
            A key made with 'coffer ssh keygen' is generated inside the agent and never leaves it: no \
            request returns its private half, and it stays on this device (a ThisDeviceOnly class, never \
            in a backup). With --access-control, each signature asks for it (the agent's pinentry or the \
            fingerprint reader). 'coffer ssh env' prints the line that points ssh at the agent.
            """,
        subcommands: [Keygen.self, List.self, Public.self, Delete.self, Import.self, Env.self])

    /// The key types `keygen` makes.
    enum KeyType: String, ExpressibleByArgument, CaseIterable {
        case ed25519
        case ecdsaP256 = "ecdsa-p256", ecdsaP384 = "ecdsa-p384", ecdsaP521 = "ecdsa-p521"
        case rsa2048 = "rsa-2048", rsa3072 = "rsa-3072", rsa4096 = "rsa-4096"

        /// KEY_CREATE's `type` and `bsiz`.
        var attributes: Attributes {
            let (type, bits): (KeyItem.KeyType, Int64) = switch self {
            case .ed25519: (.ed25519, 256)
            case .ecdsaP256: (.ecSECPrimeRandom, 256)
            case .ecdsaP384: (.ecSECPrimeRandom, 384)
            case .ecdsaP521: (.ecSECPrimeRandom, 521)
            case .rsa2048: (.rsa, 2048)
            case .rsa3072: (.rsa, 3072)
            case .rsa4096: (.rsa, 4096)
            }
            return ["type": .integer(type.rawValue), "bsiz": .integer(bits)]
        }
    }

    struct Keygen: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Generate a key inside the agent and print its authorized_keys line.",
            discussion: "Example: coffer ssh keygen --label laptop --access-control biometry-any,or,device-passcode >> ~/.ssh/authorized_keys")
        @OptionGroup var connect: Connect
        @Option(help: "Key type: \(KeyType.allCases.map(\.rawValue).joined(separator: ", ")).")
        var type: KeyType = .ed25519
        @Option(help: "The key's label (labl), also the comment of its authorized_keys line.")
        var label: String
        @OptionGroup var options: KeyOptions

        func validate() throws {
            try SSHCommand.checkLabel(label)
        }

        func run() throws {
            var attrs = try options.attributes(type.attributes)
            attrs["labl"] = .string(label)
            try reporting { () throws(SecError) in try options.create(.generate, attributes: attrs, label: label, connect: connect) }
        }
    }

    struct List: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "List the SSH keys in the keychain this caller can see: fingerprint, type, label, group.")
        @OptionGroup var connect: Connect
        @Option(name: .customLong("access-group"), help: "Only this access group's keys.")
        var accessGroup: String?
        @Flag(help: "Print a JSON array.") var json = false

        func run() throws {
            try reporting { () throws(SecError) in
                let keys = try SSHCommand.keys(try connect.open(), group: accessGroup)
                if json {
                    Output.print("[" + keys.map { k in
                        "{\"fingerprint\":\(Output.json(k.key.fingerprint)),\"type\":\(Output.json(k.key.keyType)),"
                            + "\"label\":\(Output.json(k.label)),\"accessGroup\":\(Output.json(k.group)),"
                            + "\"accessible\":\(Output.json(k.accessible)),\"accessControl\":\(k.protected)}"
                    }.joined(separator: ",") + "]")
                } else {
                    for k in keys {
                        Output.print("\(k.key.fingerprint) \(k.key.keyType) \(Output.escapedText(k.label)) "
                                     + "(group \(Output.escapedText(k.group)), \(k.accessible)\(k.protected ? ", access control" : ""))")
                    }
                }
            }
        }
    }

    struct Public: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Print a key's authorized_keys line (KEY: its label or SHA256 fingerprint).")
        @OptionGroup var connect: Connect
        @Argument(help: "The key: its label or its fingerprint (SHA256:…).") var key: String
        @Option(name: .customLong("access-group"), help: "Look only in this access group.")
        var accessGroup: String?

        func run() throws {
            try reporting { () throws(SecError) in
                let k = try SSHCommand.find(key, in: try SSHCommand.keys(try connect.open(), group: accessGroup))
                Output.print(k.key.authorizedKeysLine(comment: k.label))
            }
        }
    }

    struct Delete: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Delete a key from the keychain (KEY: its label or SHA256 fingerprint).")
        @OptionGroup var connect: Connect
        @Argument(help: "The key: its label or its fingerprint (SHA256:…).") var key: String
        @Option(name: .customLong("access-group"), help: "Look only in this access group.")
        var accessGroup: String?
        @OptionGroup var auth: AuthenticationArguments

        func run() throws {
            try reporting { () throws(SecError) in
                let c = try connect.open()
                try auth.apply(to: c)
                let k = try SSHCommand.find(key, in: try SSHCommand.keys(c, group: accessGroup))
                var query = ItemQuery(itemClass: .key, attributes: ["klbl": .data(SHA256.hash(k.key.blob)), "agrp": .string(k.group)],
                                      limit: .all)
                query.attributes["kcls"] = .integer(KeyItem.KeyClass.private.rawValue)
                try authorizingIfNeeded(c, group: k.group) { c throws(SecError) in _ = try c.delete(query) }
                Output.printError("coffer: deleted \(k.key.fingerprint) \(Output.escapedText(k.label))")
            }
        }
    }

    struct Import: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Store an OpenSSH private key file in the keychain (asks for the file's passphrase).",
            discussion: """
                OpenSSH's own ssh-add reads the file (any format it reads, with its passphrase prompt on the \
                terminal or through SSH_ASKPASS) and hands the key to this command over a private socket; \
                the key then becomes a non-extractable key item. The file is left as it is: delete it once \
                the key is in the keychain if it should exist nowhere else.
                """)
        @OptionGroup var connect: Connect
        @Argument(help: "The private key file.") var file: String
        @Option(help: "The key's label (default: the key's comment if it is one line of printable text, else the file name).")
        var label: String?
        @OptionGroup var options: KeyOptions

        func validate() throws {
            if let label { try SSHCommand.checkLabel(label) }
        }

        func run() throws {
            var attrs = try options.attributes([:])
            let fileName = String(file.split(separator: "/").last ?? Substring(file))
            try reporting { () throws(SecError) in
                let (key, comment) = try SSHAddHandOver.key(fromFile: file)
                defer { key.wipe() }
                // The file's comment becomes the label and the authorized_keys comment only if it is one
                // line of printable text (a line break in it would start another authorized_keys line).
                let name = label ?? ((try? SSHCommand.checkLabel(comment)) != nil ? comment : fileName)
                attrs["labl"] = .string(name)
                try options.create(.importing(key), attributes: attrs, label: name, connect: connect)
            }
        }
    }

    struct Env: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Print the shell line that points SSH_AUTH_SOCK at cofferd's ssh-agent socket.",
            discussion: "Example (in ~/.profile): eval \"$(coffer ssh env)\"")
        @Option(help: "Agent socket whose directory holds ssh-agent.sock (default: as every command finds the agent).")
        var socket: String?
        @Option(name: .customLong("ssh-agent-socket"), help: "The ssh-agent socket, when cofferd was given another (ssh-agent-socket = PATH).")
        var sshAgentSocket: String?
        @Flag(help: "Print csh syntax (setenv).") var csh = false
        @Flag(help: "Print fish syntax (set -gx).") var fish = false

        func validate() throws {
            if csh && fish { throw ValidationError("--csh and --fish exclude each other") }
        }

        func run() throws {
            let path = sshAgentSocket ?? (Files.directoryName(AgentConnection.socketPath(explicit: socket)) + "/ssh-agent.sock")
            let quoted = "'" + path.split(separator: "'", omittingEmptySubsequences: false).joined(separator: "'\\''") + "'"
            if csh {
                Output.print("setenv SSH_AUTH_SOCK \(quoted);")
            } else if fish {
                Output.print("set -gx SSH_AUTH_SOCK \(quoted);")
            } else {
                Output.print("SSH_AUTH_SOCK=\(quoted); export SSH_AUTH_SOCK;")
            }
            var st = stat()
            if stat(path, &st) != 0 || (st.st_mode & S_IFMT) != S_IFSOCK {
                Output.printError("coffer: note: no socket at \(Output.escapedText(path)) yet (is cofferd running, with its ssh-agent socket on?)")
            }
        }
    }

    // MARK: Shared

    /// What `keygen` and `import` share: the key's access group, protection and reuse window, how the
    /// command authenticates, and making the key item (KEY_CREATE) and printing its authorized_keys line.
    struct KeyOptions: ParsableArguments {
        @Option(name: .customLong("access-group"), help: "Access group (agrp).")
        var accessGroup: String?
        @OptionGroup var protection: ProtectionOptions
        @OptionGroup var reuse: ReuseOption
        @OptionGroup var auth: AuthenticationArguments

        func validate() throws {
            try reuse.check(protection)
            if let a = protection.accessible, !(try parseAccessible(a)).isThisDeviceOnly {
                throw ValidationError("a key in the agent stays on this device: --accessible takes a …-this-device-only class (or akpu)")
            }
        }

        /// `attributes` plus these options' (class, access control, reuse window, access group).
        func attributes(_ attributes: Attributes) throws -> Attributes {
            var attrs = attributes
            try protection.apply(to: &attrs)
            reuse.apply(to: &attrs)
            if let accessGroup { attrs["agrp"] = .string(accessGroup) }
            return attrs
        }

        /// Sends KEY_CREATE with `attrs` (authorizing the access group if needed) and prints the new
        /// key's authorized_keys line with `label` as its comment.
        ///
        /// Without `--access-group` the key goes where ssh clients see it: `ssh` and `ssh-add` are
        /// unsigned programs, which see the `unsigned` group, so a caller that may use that group
        /// puts the key there rather than in its own default group (the signed shell helper's is
        /// `shell`, which no ssh client sees). The group is said on stderr either way.
        func create(_ creation: KeyCreation, attributes: Attributes, label: String, connect: Connect) throws(SecError) {
            let c = try connect.open()
            try auth.apply(to: c)
            var attrs = attributes
            var group = accessGroup
            if group == nil {
                let mine = try c.whoami().accessGroups
                group = mine.contains(Self.sshClientsGroup) ? Self.sshClientsGroup : mine.first
                if let group { attrs["agrp"] = .string(group) }
            }
            let made = try authorizingIfNeeded(c, group: group) { c throws(SecError) in
                try c.createKey(creation, attributes: attrs, returning: .attributes)
            }
            Output.print(try SSHCommand.key(made?.attributes ?? [:]).authorizedKeysLine(comment: label))
            let stored = if case .string(let g)? = made?.attributes?["agrp"] { g } else { group ?? "?" }
            Output.printError(stored == Self.sshClientsGroup
                ? "coffer: the key is in access group \(stored), which ssh and ssh-add see (unless the agent denies unsigned callers)"
                : "coffer: the key is in access group \(Output.escapedText(stored)), which ssh and ssh-add (unsigned programs) do not see; "
                    + "give --access-group \(Self.sshClientsGroup) to make a key they see")
        }

        /// The group unsigned programs such as `ssh` and `ssh-add` see (docs/access-groups.md).
        static let sshClientsGroup = "unsigned"
    }

    /// `--reuse-seconds`: how long one authentication serves the same program's signatures with the key.
    struct ReuseOption: ParsableArguments {
        @Option(name: .customLong("reuse-seconds"),
                help: "With --access-control: after the person authorizes a signature, the same program may sign with the key again for this many seconds (0 to 300) without asking; a lock ends it.")
        var seconds: Int64?

        func check(_ protection: ProtectionOptions) throws {
            guard let seconds else { return }
            guard protection.accessControl != nil else { throw ValidationError("--reuse-seconds needs --access-control") }
            guard (0...Int64(AuthenticationOptions.maximumReuseSeconds)).contains(seconds) else {
                throw ValidationError("--reuse-seconds takes 0 to \(AuthenticationOptions.maximumReuseSeconds)")
            }
        }

        func apply(to attrs: inout Attributes) {
            if let seconds, seconds > 0 { attrs[KeyItem.reuseAttribute] = .integer(seconds) }
        }
    }

    /// One SSH key item as listed.
    struct ListedKey {
        let key: SSHWirePublicKey
        let label: String
        let group: String
        let accessible: String
        let protected: Bool
    }

    /// A label: 1 to 256 printable characters without line breaks (it becomes an authorized_keys comment).
    static func checkLabel(_ label: String) throws {
        guard !label.isEmpty, label.utf8.count <= 256, !label.unicodeScalars.contains(where: { $0.value < 0x20 || $0.value == 0x7F }) else {
            throw ValidationError("--label takes 1 to 256 characters without control characters")
        }
    }

    /// The public key an item's attributes carry.
    static func key(_ attributes: Attributes) throws(SecError) -> SSHWirePublicKey {
        guard case .data(let blob)? = attributes[KeyItem.publicKeyAttribute],
              let key = try? SSHWirePublicKey(blob: blob) else {
            throw .decode("the agent's answer has no SSH public key")
        }
        return key
    }

    /// The SSH keys (private key items with a public half) the caller sees, oldest first.
    static func keys(_ c: AgentConnection, group: String?) throws(SecError) -> [ListedKey] {
        var query = ItemQuery(itemClass: .key, attributes: ["kcls": .integer(KeyItem.KeyClass.private.rawValue)], limit: .all,
                              returnAttributes: true)
        if let group { query.attributes["agrp"] = .string(group) }
        let found: [ItemResult]
        do {
            found = try authorizingIfNeeded(c, group: group) { c throws(SecError) in try c.copyMatching(query) }
        } catch where error.status == .itemNotFound {
            return []
        }
        return found.compactMap { r in
            guard let a = r.attributes, let key = try? Self.key(a) else { return nil }
            func string(_ name: String) -> String {
                if case .string(let s)? = a[name] { return s }
                return ""
            }
            return ListedKey(key: key, label: string("labl"), group: string("agrp"),
                             accessible: ProtectionClass(parsing: string("pdmn"))?.cliName ?? string("pdmn"),
                             protected: a[AccessControl.attributeName] != nil)
        }
    }

    /// The key `name` names: a fingerprint (SHA256:…) or a label that only one key has.
    static func find(_ name: String, in keys: [ListedKey]) throws(SecError) -> ListedKey {
        let matches = name.hasPrefix("SHA256:") ? keys.filter { $0.key.fingerprint == name } : keys.filter { $0.label == name }
        guard let first = matches.first else { throw .itemNotFound("no SSH key in the keychain has that label or fingerprint") }
        guard matches.count == 1 else {
            throw .param("\(matches.count) SSH keys have that label; name one by its fingerprint: "
                         + matches.map(\.key.fingerprint).joined(separator: ", "))
        }
        return first
    }
}

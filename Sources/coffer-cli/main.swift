// coffer-cli: the full command-line interface of the Coffer agent (swift-argument-parser). Users
// run `coffer`, which answers the plain `get` and `add` forms itself and execs this for the rest.
import ArgumentParser
import CofferCLISupport
import CofferClient
import CofferFiles
import CofferCrypto
import CofferModel
import Glibc

/// Socket selection shared by every subcommand.
struct Connect: ParsableArguments {
    @Option(help: "Agent socket (default: $COFFER_SOCKET, else $XDG_RUNTIME_DIR/coffer/agent.sock, else /run/user/UID/coffer/agent.sock).")
    var socket: String?

    func open() throws(SecError) -> AgentConnection {
        let c = CLISupport.connected(try AgentConnection(path: AgentConnection.socketPath(explicit: socket), clientName: "coffer"))
        // An item with an access control is unlocked by the person at this terminal (never stdin), or
        // through the pinentry COFFER_PINENTRY names when there is no terminal.
        c.authenticationDelegate = PinentryAuthentication.standard()
        return c
    }
}

/// How a command that may touch protected items authenticates (an `LAContext`'s options).
struct AuthenticationArguments: ParsableArguments {
    @Flag(name: .customLong("no-auth-ui"), help: "Never ask: fail with errSecInteractionNotAllowed if an item needs authentication.")
    var noAuthUI = false
    @Option(help: "Shown to the person with the agent's prompt when an item needs authentication.")
    var prompt: String?
    @Option(name: .customLong("auth-passcode-fd"), help: "Read the passcode for protected items from this descriptor instead of asking.")
    var passcodeFD: Int32?
    @Option(name: .customLong("app-password-fd"), help: "Read the item's application password from this descriptor instead of asking.")
    var appPasswordFD: Int32?

    /// Sends the options, if any were given.
    func apply(to c: AgentConnection) throws(SecError) {
        guard noAuthUI || prompt != nil || passcodeFD != nil || appPasswordFD != nil else { return }
        if let passcodeFD, passcodeFD == appPasswordFD { throw .param("the passcode and the application password need different descriptors") }
        let passcode = try passcodeFD.map { fd throws(SecError) in try SecretInput.read(fd: fd, what: "passcode") }
        let appPassword = try appPasswordFD.map { fd throws(SecError) in try SecretInput.read(fd: fd, what: "application password") }
        try c.setAuthenticationOptions(AuthenticationOptions(noUserInterface: noAuthUI, operationPrompt: prompt ?? "", passcode: passcode,
                                                             applicationPassword: appPassword))
    }

    func validate() throws {
        if let prompt, prompt.utf8.count > AuthenticationOptions.maximumPromptBytes {
            throw ValidationError("--prompt is longer than \(AuthenticationOptions.maximumPromptBytes) bytes")
        }
    }
}

/// Runs `body`, turning a SecError into `coffer: errSecName (code): message` and its exit status
/// (``CLISupport/reporting(_:)``, shared with `coffer`'s fast path).
func reporting(_ body: () throws(SecError) -> Void) throws {
    let status = CLISupport.reporting(body)
    if status != 0 { throw ExitCode(status) }
}

struct Coffer: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "coffer",
        abstract: "Store and fetch credentials through the Coffer agent.",
        discussion: """
            Secrets are read from standard input or a file descriptor, never from arguments or the \
            environment. Errors print as 'coffer: errSecItemNotFound (-25300): …' with a stable exit status \
            (see docs/cli.md).
            """,
        version: "coffer \(CofferVersion.current)",
        subcommands: [Status.self, Unlock.self, Lock.self, Passcode.self, Add.self, Get.self, Find.self, Update.self, Move.self, Delete.self, Run.self, Inject.self, WhoAmI.self,
                      LocalAuthentication.self, Biometry.self, Escrow.self, Backup.self, ManifestCommand.self, AuditCommand.self, Check.self, SSHCommand.self,
                      ImportCommand.self, DeviceKeyCommand.self, SyncCommand.self, FilesCommand.self])
}

struct Status: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Show the agent's lock state, passcode and item count.")
    @OptionGroup var connect: Connect
    @Flag(help: "Print JSON.") var json = false

    func run() throws {
        try reporting { () throws(SecError) in
            let c = try connect.open()
            let s = try c.status()
            let outOfSync = (try? c.isPasscodeOutOfSync()) ?? false
            // nil: an agent from before the protections report.
            let p = try? c.protections()
            let deviceKey = p.map { $0.deviceKeyInTPM ? "TPM 2.0" : "file" } ?? "unknown (agent too old)"
            let attempts = p.map { Self.attemptCounting($0) } ?? "unknown (agent too old)"
            // Whether only the holder of the TPM's lockout authorization can reset its count (null: the TPM does not count, or an older agent).
            let lockoutAuthorization = p.flatMap { $0.attemptsCountedByTPM ? ($0.tpmLockoutAuthorizationEmpty ? "empty" : "set") : nil }
            let rollback = p.map { $0.rollbackDetection ? "on" : "off" } ?? "unknown (agent too old)"
            // nil: an agent from before the prompter report.
            let prompter = try? c.prompter()
            let state = s.lockState.description
            // Protected directories (nil: an agent from before them), and whether the home directory's
            // filesystem could hold one (checked here, on this machine's kernel).
            let protected = try? c.files(.status(path: nil))
            let home = (getenv("HOME").map { String(cString: $0) }).flatMap { $0.hasPrefix("/") ? $0 : nil }
            let fscrypt = home.map { Filesystems.fscryptRefusal($0).map { "not available for \($0)" } ?? "available" } ?? "unknown (no HOME)"
            let directories = protected.map { d in
                "\(d.count)" + (d.isEmpty ? "" : " (\(d.filter { $0.keyState == .present }.count) unlocked; coffer files list)")
            } ?? "unknown (agent too old)"
            if json {
                Output.print("""
                    {"state":\(Output.json(state)),"passcodeSet":\(s.passcodeSet),"passcodeOutOfSync":\(outOfSync),"items":\(s.itemCount),\
                    "version":\(Output.json(s.agentVersion)),"lockedMemoryBytes":\(s.lockedMemoryBytes),\
                    "idleLockSeconds":\(s.idleLockSeconds),"deviceKey":\(Output.json(deviceKey)),"attemptCounting":\(Output.json(attempts)),\
                    "tpmLockoutAuthorization":\(lockoutAuthorization.map(Output.json) ?? "null"),"rollbackDetection":\(Output.json(rollback)),\
                    "prompter":\(prompter.map(Self.prompterJSON) ?? "null"),\
                    "protectedDirectories":\(protected.map { "\($0.count)" } ?? "null"),"fscrypt":\(Output.json(fscrypt))}
                    """)
            } else {
                Output.print("""
                    state: \(state)
                    passcode: \(s.passcodeSet ? (outOfSync ? "set, out of sync with your login password (coffer passcode sync)" : "set") : "not set")
                    items: \(s.itemCount)
                    agent: \(s.agentVersion)
                    locked memory: \(s.lockedMemoryBytes / 1024) KiB
                    idle lock: \(s.idleLockSeconds == 0 ? "off" : "\(s.idleLockSeconds) s")
                    device key: \(deviceKey)
                    attempt counting: \(attempts)
                    rollback detection: \(rollback)
                    prompter: \(prompter.map { $0.program ?? "none" } ?? "unknown (agent too old)")\(prompter.map { " (\($0.reason))" } ?? "")
                    dialogs: \(prompter.map { $0.hasDisplay ? "on \($0.display)" : "nowhere: \($0.display)" } ?? "unknown (agent too old)")
                    protected directories: \(directories)
                    fscrypt (home directory): \(fscrypt)
                    """)
            }
        }
    }
}

extension Status {
    /// The prompter as `coffer status --json` gives it.
    static func prompterJSON(_ p: PrompterReply) -> String {
        "{\"program\":\(p.program.map(Output.json) ?? "null"),\"reason\":\(Output.json(p.reason)),"
            + "\"displayKnown\":\(p.hasDisplay),\"display\":\(Output.json(p.display))}"
    }

    /// Who counts wrong passcodes, as `coffer status` says it: `file`, `TPM`, or the TPM with a warning
    /// when its lockout authorization is empty (its count then binds nobody who can reach the TPM, and
    /// the agent's `attempts` file is the bound).
    static func attemptCounting(_ p: ProtectionsReply) -> String {
        guard p.attemptsCountedByTPM else { return "file" }
        guard p.tpmLockoutAuthorizationEmpty else { return "TPM" }
        return "TPM, but its lockout authorization is empty: any local process can reset it (the bound is Coffer's attempts file)"
    }
}

struct Unlock: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Unlock the keybag with your passcode (your login password, checked by PAM).")
    @OptionGroup var connect: Connect
    @OptionGroup var passcode: PasscodeSource

    func run() throws {
        try reporting { () throws(SecError) in
            let p = try passcode.read()
            try connect.open().unlock(passcode: p)
        }
    }
}

struct Lock: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Lock the keybag now: WhenUnlocked items become unavailable.")
    @OptionGroup var connect: Connect

    func run() throws {
        try reporting { () throws(SecError) in try connect.open().lock() }
    }
}

struct Passcode: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Set or change the keybag passcode.",
                                                    subcommands: [Set.self, Change.self, PasscodeSync.self, PasscodeRemove.self])

    struct Set: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Set the first passcode (must be your login password: PAM checks it).")
        @OptionGroup var connect: Connect
        @OptionGroup var passcode: PasscodeSource

        func run() throws {
            try reporting { () throws(SecError) in
                let p = try passcode.readNew()
                try connect.open().setPasscode(current: nil, new: p)
            }
        }
    }

    struct Change: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Change the passcode: reads the current and the new one on two lines (on a terminal: asks, the new one twice).")
        @OptionGroup var connect: Connect
        @OptionGroup var passcode: PasscodeSource

        func run() throws {
            try reporting { () throws(SecError) in
                let (current, new) = try passcode.readChange()
                try connect.open().setPasscode(current: current, new: new)
            }
        }
    }
}

struct Add: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Add an item (generic password; internet password with --server).",
        discussion: "Example: printf %s \"$TOKEN\" | coffer add --service github --account me --secret-stdin")
    @OptionGroup var connect: Connect
    @OptionGroup var item: ItemOptions
    @OptionGroup var protection: ProtectionOptions
    @OptionGroup var secret: SecretSource
    @OptionGroup var auth: AuthenticationArguments
    @Flag(help: "Sync the item to your other machines (coffer sync; not with a this-device-only class or an access control).")
    var sync = false

    func validate() throws {
        guard secret.isAvailable else { throw ValidationError("give the secret with --secret-stdin or --secret-fd N (or run it on a terminal to be asked)") }
    }

    func run() throws {
        var attrs = try item.attributes()
        try protection.apply(to: &attrs)
        if sync { attrs["sync"] = .bool(true) }
        let cls = try item.resolvedClass(defaultIfNone: true)!
        try reporting { () throws(SecError) in
            let s = try secret.read(confirm: true)
            let item = NewItem(itemClass: cls, attributes: attrs, secret: s)
            let c = try connect.open()
            try auth.apply(to: c)
            _ = try authorizingIfNeeded(c, group: self.item.accessGroup) { c throws(SecError) in try c.add(item) }
        }
    }
}

/// What `coffer get` prints.
enum GetFormat: String, ExpressibleByArgument, CaseIterable {
    /// The secret byte for byte (a newline after it only on a terminal).
    case raw
    /// `{"attributes":{…},"secret":"…"}` (`"secretHex"` instead when the secret is not UTF-8).
    case json
    /// `NAME='secret'`, shell-quoted, for eval.
    case env
}

struct Get: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Print one item's secret to standard output (and nothing else).",
        discussion: """
            --format raw (the default) prints the secret exactly. --format json prints one object: \
            {"attributes":{"class":…,"acct":…,…},"secret":"…"} (the attributes as `find --json` shows them; \
            "secretHex" instead of "secret" when the secret is not UTF-8). --format env prints NAME='secret' \
            in POSIX shell quoting, NAME being --env-name or the service (or server) in capitals with every \
            other character an underscore.

            Example: export TOKEN="$(coffer get --service github --account me)"
            Example: eval "$(coffer get --service github --account me --format env --env-name GITHUB_TOKEN)"
            """)
    @OptionGroup var connect: Connect
    @OptionGroup var item: ItemOptions
    @OptionGroup var auth: AuthenticationArguments
    @Option(help: "raw, json or env (default raw).") var format: GetFormat = .raw
    @Option(name: .customLong("env-name"), help: "The variable name --format env prints.") var envName: String?

    func validate() throws {
        // Without anything naming the item, the first item of the caller's groups would be printed:
        // an arbitrary secret. The group and the class alone do not name one either.
        guard try !item.attributes().keys.allSatisfy({ ["agrp", "pdmn"].contains($0) }) else {
            throw ValidationError("get needs a query naming the item, e.g. 'coffer get --service github --account me' "
                + "(--server, --label and --attr NAME=VALUE name items too; 'coffer find' lists what there is)")
        }
        if let envName {
            guard format == .env else { throw ValidationError("--env-name goes with --format env") }
            guard SecretFormat.isVariableName(envName) else { throw ValidationError("--env-name: '\(Output.escapedText(envName))' is not a variable name") }
        }
    }

    func run() throws {
        let q = ItemQuery(itemClass: try item.resolvedClass(defaultIfNone: true), attributes: try item.attributes(),
                          limit: .one, returnData: true, returnAttributes: format != .raw)
        try reporting { () throws(SecError) in
            let c = try connect.open()
            try auth.apply(to: c)
            let found = try authorizingIfNeeded(c, group: item.accessGroup) { c throws(SecError) in try c.copyMatching(q) }
            guard let result = found.first, let data = result.data else { throw .itemNotFound() }
            defer { data.wipe() }
            switch format {
            case .raw:
                try CLISupport.printSecret(data)
            case .json:
                let attributes = Output.jsonObject(result.itemClass, result.attributes ?? [:])
                let rendered: SecureBytes
                do {
                    rendered = try SecretFormat.json(prefix: "{\"attributes\":\(attributes),\"secret\":", secret: data, suffix: "}\n")
                } catch {
                    rendered = SecretFormat.hexJSON(prefix: "{\"attributes\":\(attributes),\"secretHex\":", secret: data, suffix: "}\n")
                }
                defer { rendered.wipe() }
                guard rendered.withUnsafeBytes({ Output.write(1, $0) }) else { throw .io("cannot write to standard output") }
            case .env:
                let a = result.attributes ?? [:]
                let name: String
                if let envName { name = envName } else if case .string(let s)? = a["svce"] ?? a["srvr"], !s.isEmpty {
                    name = SecretFormat.variableName(from: s)
                } else { name = "SECRET" }
                let rendered: SecureBytes
                do { rendered = try SecretFormat.shellAssignment(name: name, secret: data) } catch {
                    throw .param("the secret contains a NUL byte, which a shell variable cannot hold")
                }
                defer { rendered.wipe() }
                guard rendered.withUnsafeBytes({ Output.write(1, $0) }) else { throw .io("cannot write to standard output") }
            }
        }
    }
}

/// Parses `--limit N|all`.
func parseLimit(_ text: String?) throws -> MatchLimit {
    guard let text else { return .all }
    if text == "all" { return .all }
    guard let n = Int(text), n >= 1 else { throw ValidationError("--limit takes a positive number or 'all'") }
    return n == 1 ? .one : .count(n)
}

struct Find: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "List matching items' attributes (never secrets).",
        discussion: """
            Text output escapes what could forge a line or drive the terminal: a backslash prints as \\\\, a \
            newline as \\n, a carriage return as \\r, a tab as \\t, any other control character as \\xHH (C0 \
            and DEL) or \\u{HHHH} (C1 controls, line and paragraph separators, bidirectional controls). JSON \
            output escapes them per JSON.
            """)
    @OptionGroup var connect: Connect
    @OptionGroup var item: ItemOptions
    @Option(help: "How many: a number or 'all' (default all).") var limit: String?
    @Flag(help: "Print a JSON array.") var json = false

    func run() throws {
        let q = ItemQuery(itemClass: try item.resolvedClass(defaultIfNone: false), attributes: try item.attributes(),
                          limit: try parseLimit(limit), returnAttributes: true)
        try reporting { () throws(SecError) in
            let items = try authorizingIfNeeded(try connect.open(), group: item.accessGroup) { c throws(SecError) in try listingPastUnreadable(c, q) }
            if json {
                Output.print("[" + items.map { Output.jsonObject($0.itemClass, $0.attributes ?? [:]) }.joined(separator: ",") + "]")
            } else {
                Output.print(items.map { Output.textBlock($0.itemClass, $0.attributes ?? [:]) }.joined(separator: "\n\n"))
            }
        }
    }
}

/// `--all`: what `update` and `delete` need to act on every item, so that a forgotten query never
/// does. An empty query without it, or a query with it, is a usage error.
struct AllItems: ParsableArguments {
    @Flag(help: "Act on every item (required when no query is given; not allowed with one).")
    var all = false

    func validate(_ item: ItemOptions, verb: String) throws {
        let empty = try item.itemClass == nil && item.attributes().isEmpty
        if empty && !all {
            throw ValidationError("refusing to \(verb) every item: give a query (an attribute or --class), or --all")
        }
        if !empty && all { throw ValidationError("--all cannot be combined with a query") }
    }
}

struct Update: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Change every matching item: its secret, label, accessibility or attributes.")
    @OptionGroup var connect: Connect
    @OptionGroup var item: ItemOptions
    @OptionGroup var everything: AllItems
    @OptionGroup var secret: SecretSource
    @Option(name: .customLong("set-label"), help: "New label.") var setLabel: String?
    @Option(help: "New accessibility (re-wraps the item under that class).", completion: ValueCompletion.accessible) var accessible: String?
    @Option(name: .customLong("set-attr"), help: "New attribute value KEY=VALUE (repeatable). General attributes (names outside Apple's catalog, or @NAME) are set as a whole: the item keeps exactly those given.") var setAttrs: [String] = []
    @Option(help: "on: sync the items to your other machines (coffer sync); off: keep them on this machine only.") var sync: String?
    @OptionGroup var auth: AuthenticationArguments

    func validate() throws {
        guard secret.isGiven || setLabel != nil || accessible != nil || !setAttrs.isEmpty || sync != nil else {
            throw ValidationError("nothing to change: give --secret-stdin/--secret-fd, --set-label, --accessible, --set-attr or --sync")
        }
        if let sync, sync != "on" && sync != "off" { throw ValidationError("--sync takes on or off") }
        try everything.validate(item, verb: "update")
    }

    func run() throws {
        let q = ItemQuery(itemClass: try item.resolvedClass(defaultIfNone: false), attributes: try item.attributes())
        var changes: Attributes = [:]
        if let setLabel { changes["labl"] = .string(setLabel) }
        if let accessible { changes["pdmn"] = .string(try parseAccessible(accessible).shortCode) }
        if let sync { changes["sync"] = .bool(sync == "on") }
        for text in setAttrs {
            let (k, v) = try parseAttribute(text)
            changes[k] = v
        }
        try reporting { () throws(SecError) in
            let s = secret.isGiven ? try secret.read() : nil
            let c = try connect.open()
            try auth.apply(to: c)
            let n = try authorizingIfNeeded(c, group: item.accessGroup) { c throws(SecError) in
                try c.update(q, ItemChanges(attributes: changes, secret: s))
            }
            Output.printError("coffer: updated \(n) item\(n == 1 ? "" : "s")")
        }
    }
}

struct Move: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Move every matching item or key to another access group, as one atomic change.",
        discussion: """
            Both groups must be ones this command may use (its own, or another app's that it is \
            authorized for with your passcode on a terminal). Keys made for ssh belong in the group \
            ssh clients see: coffer move --class keys --label laptop --group unsigned
            """)
    @OptionGroup var connect: Connect
    @OptionGroup var item: ItemOptions
    @OptionGroup var everything: AllItems
    @Option(name: .customLong("group"), help: "The access group to move the items to.") var group: String
    @OptionGroup var auth: AuthenticationArguments

    func validate() throws {
        guard !group.isEmpty else { throw ValidationError("--group needs an access group") }
        try everything.validate(item, verb: "move")
    }

    func run() throws {
        let q = ItemQuery(itemClass: try item.resolvedClass(defaultIfNone: false), attributes: try item.attributes())
        try reporting { () throws(SecError) in
            let c = try connect.open()
            try auth.apply(to: c)
            // One UPDATE of agrp: the keychain moves every match or none. Either group may need the
            // person's authorization first.
            let n = try authorizingIfNeeded(c, group: group) { c throws(SecError) in
                try authorizingIfNeeded(c, group: item.accessGroup) { c throws(SecError) in
                    try c.update(q, ItemChanges(attributes: ["agrp": .string(group)]))
                }
            }
            Output.printError("coffer: moved \(n) item\(n == 1 ? "" : "s") to access group \(Output.escapedText(group))")
        }
    }
}

struct Delete: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Delete every matching item.")
    @OptionGroup var connect: Connect
    @OptionGroup var item: ItemOptions
    @OptionGroup var everything: AllItems
    @OptionGroup var auth: AuthenticationArguments

    func validate() throws {
        try everything.validate(item, verb: "delete")
    }

    func run() throws {
        let q = ItemQuery(itemClass: try item.resolvedClass(defaultIfNone: false), attributes: try item.attributes())
        try reporting { () throws(SecError) in
            let c = try connect.open()
            try auth.apply(to: c)
            let n = try authorizingIfNeeded(c, group: item.accessGroup) { c throws(SecError) in try c.delete(q) }
            Output.printError("coffer: deleted \(n) item\(n == 1 ? "" : "s")")
        }
    }
}

CommandSuggestion.check(Array(CommandLine.arguments.dropFirst()), root: Coffer.self)
Coffer.main()

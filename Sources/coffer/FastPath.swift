import CofferCLISupport
import CofferClient
import CofferModel
import CofferSystem
import Glibc

/// The commands scripts run in loops, parsed by hand: `coffer get` and `coffer add` in their plain
/// forms. Whole-process time is what a script pays per credential, and a process that links
/// swift-argument-parser (and the Foundation it brings) spends about twice as long starting as the
/// fetch itself takes, so `coffer` links neither: anything beyond these forms — other options,
/// `--opt=value` spellings, `--help`, a malformed line, other commands — is handed to the full
/// parser in `coffer-cli`, which gives the same result and the usual messages. A test checks that
/// both paths agree.
enum FastPath {
    /// Options that take a value, and flags, for each fast command.
    static let valueOptions: [String: Set<String>] = [
        "get": ["--service", "--account", "--server", "--socket"],
        "add": ["--service", "--account", "--label", "--socket", "--secret-fd"],
    ]
    static let flags: [String: Set<String>] = ["get": [], "add": ["--secret-stdin"]]

    /// Runs the fast path if the arguments fit it; returns the exit status, or nil to hand over.
    static func run(_ args: [String]) -> Int32? {
        guard let command = args.first, let takesValue = valueOptions[command], let isFlag = flags[command] else { return nil }
        var options: [String: String] = [:]
        var i = 1
        while i < args.count {
            let key = args[i]
            guard options[key] == nil else { return nil }
            if isFlag.contains(key) {
                options[key] = ""
                i += 1
            } else if takesValue.contains(key), i + 1 < args.count, !args[i + 1].hasPrefix("-") {
                options[key] = args[i + 1]
                i += 2
            } else {
                return nil
            }
        }
        switch command {
        case "get": return get(options)
        default: return add(options)
        }
    }

    /// `get --service S --account A [--server H] [--socket P]`: prints the secret only.
    static func get(_ options: [String: String]) -> Int32? {
        var attrs: Attributes = [:]
        if let s = options["--service"] { attrs["svce"] = .string(s) }
        if let a = options["--account"] { attrs["acct"] = .string(a) }
        if let h = options["--server"] { attrs["srvr"] = .string(h) }
        guard !attrs.isEmpty else { return nil }
        let query = ItemQuery(itemClass: options["--server"] == nil ? .genericPassword : .internetPassword,
                              attributes: attrs, limit: .one, returnData: true)
        return CLISupport.reporting { () throws(SecError) in
            let c = try connect(options)
            // A protected item asks the person at this terminal (or through COFFER_PINENTRY), as coffer-cli does.
            c.authenticationDelegate = PinentryAuthentication.standard()
            guard let data = try c.copyMatching(query).first?.data else { throw .itemNotFound() }
            try CLISupport.printSecret(data)
        }
    }

    /// `add --service S --account A [--label L] (--secret-stdin | --secret-fd N) [--socket P]`:
    /// a generic password with the default accessibility, exactly as the full parser builds it.
    static func add(_ options: [String: String]) -> Int32? {
        guard let service = options["--service"], let account = options["--account"] else { return nil }
        let fd: Int32
        switch (options["--secret-stdin"], options["--secret-fd"]) {
        case (.some, nil): fd = 0
        case (nil, .some(let text)):
            guard let n = Int32(text) else { return nil }
            fd = n
        default: return nil
        }
        var attrs: Attributes = ["svce": .string(service), "acct": .string(account)]
        if let label = options["--label"] { attrs["labl"] = .string(label) }
        return CLISupport.reporting { () throws(SecError) in
            let secret = try SecretInput.read(fd: fd, what: "secret")
            _ = try connect(options).add(NewItem(itemClass: .genericPassword, attributes: attrs, secret: secret))
        }
    }

    static func connect(_ options: [String: String]) throws(SecError) -> AgentConnection {
        CLISupport.connected(try AgentConnection(path: AgentConnection.socketPath(explicit: options["--socket"]), clientName: "coffer",
                                                 pipelineHello: true))
    }
}

/// The full command-line parser, `coffer-cli`, installed beside `coffer`.
enum FullCLI {
    /// Where `coffer-cli` is: next to this executable, or in ../libexec/coffer/ (a packager's choice).
    static func path() -> String? {
        guard let exe = ThisProcess.executablePath(), let slash = exe.lastIndex(of: "/") else { return nil }
        let dir = String(exe[..<slash])
        return [dir + "/coffer-cli", dir + "/../libexec/coffer/coffer-cli"].first { access($0, X_OK) == 0 }
    }

    /// Replaces this process with `coffer-cli ARGS…` (argv[0] stays `coffer`, for its messages).
    static func exec(_ args: [String]) -> Never {
        guard let path = path() else {
            CLISupport.report(SecError(.internalComponent, "coffer-cli is not installed beside coffer"))
            exit(SecStatus.internalComponent.exitCode)
        }
        let failure = ThisProcess.exec(path, arguments: ["coffer"] + args)
        CLISupport.report(SecError(.internalComponent, "cannot run \(path): \(String(cString: strerror(failure.errno)))"))
        exit(SecStatus.internalComponent.exitCode)
    }
}

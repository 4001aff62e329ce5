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
    /// The options of a fast command line, each given at most once.
    ///
    /// Plain stored properties and a `switch` on the option's spelling, not dictionaries and sets
    /// of strings: in a static binary the first use of a generic collection type instantiates its
    /// metadata and looks up its conformances by scanning the whole binary, and for these few
    /// options that start-up work cost more than the parsing itself (measured with perf on
    /// `coffer get`, docs/PERFORMANCE.md).
    struct Options {
        var service: String?
        var account: String?
        var server: String?
        var socket: String?
        var label: String?
        var secretFD: String?
        var secretStdin = false

        /// Stores `value` for `key` of `command`; false if `key` is not one of its options or was
        /// already given. `value` nil: `key` is a flag.
        mutating func set(_ command: String, _ key: String, _ value: String?) -> Bool {
            func once(_ slot: inout String?) -> Bool {
                guard slot == nil, let value else { return false }
                slot = value
                return true
            }
            switch (command, key) {
            case (_, "--service"): return once(&service)
            case (_, "--account"): return once(&account)
            case (_, "--socket"): return once(&socket)
            case ("get", "--server"): return once(&server)
            case ("add", "--label"): return once(&label)
            case ("add", "--secret-fd"): return once(&secretFD)
            case ("add", "--secret-stdin"):
                guard value == nil, !secretStdin else { return false }
                secretStdin = true
                return true
            default: return false
            }
        }

        /// Whether `key` is a flag (an option without a value) of `command`.
        static func isFlag(_ command: String, _ key: String) -> Bool { command == "add" && key == "--secret-stdin" }
    }

    /// Runs the fast path if the arguments fit it; returns the exit status, or nil to hand over.
    static func run(_ args: [String]) -> Int32? {
        guard let command = args.first, command == "get" || command == "add" else { return nil }
        var options = Options()
        var i = 1
        while i < args.count {
            let key = args[i]
            if Options.isFlag(command, key) {
                guard options.set(command, key, nil) else { return nil }
                i += 1
            } else if i + 1 < args.count, !args[i + 1].hasPrefix("-"), options.set(command, key, args[i + 1]) {
                i += 2
            } else {
                return nil
            }
        }
        return command == "get" ? get(options) : add(options)
    }

    /// `get --service S --account A [--server H] [--socket P]`: prints the secret only.
    static func get(_ options: Options) -> Int32? {
        var attrs: Attributes = [:]
        if let s = options.service { attrs["svce"] = .string(s) }
        if let a = options.account { attrs["acct"] = .string(a) }
        if let h = options.server { attrs["srvr"] = .string(h) }
        guard !attrs.isEmpty else { return nil }
        let query = ItemQuery(itemClass: options.server == nil ? .genericPassword : .internetPassword,
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
    static func add(_ options: Options) -> Int32? {
        guard let service = options.service, let account = options.account else { return nil }
        let fd: Int32
        switch (options.secretStdin, options.secretFD) {
        case (true, nil): fd = 0
        case (false, .some(let text)):
            guard let n = Int32(text) else { return nil }
            fd = n
        default: return nil
        }
        var attrs: Attributes = ["svce": .string(service), "acct": .string(account)]
        if let label = options.label { attrs["labl"] = .string(label) }
        return CLISupport.reporting { () throws(SecError) in
            let secret = try SecretInput.read(fd: fd, what: "secret")
            _ = try connect(options).add(NewItem(itemClass: .genericPassword, attributes: attrs, secret: secret))
        }
    }

    static func connect(_ options: Options) throws(SecError) -> AgentConnection {
        CLISupport.connected(try AgentConnection(path: AgentConnection.socketPath(explicit: options.socket), clientName: "coffer",
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
